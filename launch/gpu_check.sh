#!/usr/bin/env bash
# The GPU rows of the performance tables in one command, on a machine with one CUDA GPU:
#
#   launch/gpu_check.sh                      # results and report under bench_results/gpu
#   launch/gpu_check.sh --out_dir=/data/gpu  # elsewhere
#   launch/gpu_check.sh --dry_run            # print the commands only (no GPU needed)
#   launch/gpu_check.sh --only=cartpole      # run only these (comma-separated); the report covers every result
#                                            # file of the four already in the output directory
#
# Runs, one after the other (about 12 minutes with the configurations' default durations):
#   r2d2_atari_gpu      R2D2 on Pong, paper Table 8 shapes, inference and training on cuda:0
#   pong_vtrace_gpu     V-trace on Pong on cuda:0, with the actor-side inference baseline
#   fake_atari_gpu      Atari-sized fake env on cuda:0, with the transport-ceiling baseline
#   cartpole            round-trip latency on CartPole (CPU: the latency of the framework itself)
# then seed-report over the four result files (current prices, plus a column at the paper's 2019 prices).
#
# Needs only an installed package (a wheel, `pip install .` or `make install`; with the atari extra for Pong):
# it calls the seed-bench and seed-report commands, never files of a source checkout, so it runs from any
# directory. Set SEED_BENCH / SEED_REPORT to use other commands, e.g. "python -m seed.bench".
# Extra flags after `--` go to every seed-bench run, e.g. `launch/gpu_check.sh -- --duration_s=60`.
set -euo pipefail

OUT_DIR="bench_results/gpu"
DRY_RUN=0
ONLY=""
NAMES=(r2d2_atari_gpu pong_vtrace_gpu fake_atari_gpu cartpole)
EXTRA=()
while (($#)); do
  case "$1" in
    --out_dir=*) OUT_DIR="${1#--out_dir=}" ;;
    --dry_run) DRY_RUN=1 ;;
    --only=*) ONLY=",${1#--only=}," ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument '$1' (expected --out_dir=DIR, --dry_run, --only=NAMES or -- FLAGS...)" >&2
       exit 2 ;;
  esac
  shift
done

read -r -a BENCH <<<"${SEED_BENCH:-seed-bench}"
read -r -a REPORT <<<"${SEED_REPORT:-seed-report}"
case "$OUT_DIR" in /*) ;; *) OUT_DIR="$PWD/$OUT_DIR" ;; esac  # absolute, as every path handed to the tools
RUNS_DIR="$OUT_DIR/runs"

run() {
  echo "+ $*" >&2
  if ((DRY_RUN == 0)); then "$@"; fi
}

if ((DRY_RUN == 0)); then
  if ! command -v "${BENCH[0]}" >/dev/null || ! command -v "${REPORT[0]}" >/dev/null; then
    echo "gpu_check.sh: '${BENCH[0]}' or '${REPORT[0]}' not found; install the package first" \
         "(pip install '.[atari]' or make install)" >&2
    exit 1
  fi
  if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check.sh: no NVIDIA GPU visible (nvidia-smi -L failed); this script measures the GPU rows" >&2
    exit 1
  fi
  nvidia-smi -L >&2
fi

for name in ${ONLY//,/ }; do
  if [[ " ${NAMES[*]} " != *" $name "* ]]; then
    echo "gpu_check.sh: --only: got '$name', expected some of ${NAMES[*]}" >&2
    exit 2
  fi
done

bench() {  # bench NAME CONFIG FLAGS...
  local name="$1" config="$2"
  shift 2
  if [[ -n "$ONLY" && "$ONLY" != *",$name,"* ]]; then return 0; fi
  run "${BENCH[@]}" --config="$config" --name="$name" --out="$OUT_DIR/$name.json" --runs_dir="$RUNS_DIR" \
    --noprogress "$@" ${EXTRA[@]+"${EXTRA[@]}"}
}

bench r2d2_atari_gpu r2d2_atari_gpu
bench pong_vtrace_gpu pong_vtrace_gpu --baselines=actor_side
bench fake_atari_gpu fake_atari_gpu --baselines=transport
bench cartpole cartpole

RESULTS=()
for name in "${NAMES[@]}"; do
  if ((DRY_RUN)) || [[ -f "$OUT_DIR/$name.json" ]]; then RESULTS+=("$OUT_DIR/$name.json"); fi
done
if ((${#RESULTS[@]} == 0)); then
  echo "gpu_check.sh: no result files in $OUT_DIR to report on" >&2
  exit 1
fi
# Rows in the order above; FPS ratios against the first row.
run "${REPORT[@]}" "${RESULTS[@]}" --pricing=current --compare_pricing=paper --out="$OUT_DIR/report"
if ((DRY_RUN)); then
  echo "gpu_check.sh: dry run, nothing was run" >&2
else
  echo "gpu_check.sh: results in $OUT_DIR (*.json, report.md, report.png)" >&2
fi
