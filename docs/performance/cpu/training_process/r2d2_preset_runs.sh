#!/usr/bin/env bash
# R2D2's Pong preset on 2 cores, training thread vs training process, back to back (4.5 minutes each).
# Usage: docs/performance/cpu/training_process/r2d2_preset_runs.sh OUT_DIR   (run from the repository root)
OUT=${1:?output directory}
for mode in thread process thread2 process2; do
  case $mode in thread*) flag=--notraining_process;; *) flag=--training_process;; esac
  rm -rf "$OUT/$mode"
  timeout -s TERM 270 launch/local.sh --preset=pong_r2d2 --seed=1 $flag --logdir="$OUT/$mode" --log_interval_s=15 \
    > "$OUT/$mode.log" 2>&1
  sleep 5
done
