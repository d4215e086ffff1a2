#!/usr/bin/env bash
# The A/B runs of docs/performance/cpu/hot_path_ab/README.md, one after the other on quiet cores (2026-12-02).
# Run from a directory outside the checkout with the project installed editable; each commit is installed once
# into ~/.cache/seed-rl/ab/<commit>. Writes NAME.json and NAME.log here.
set -u
here=$(cd "$(dirname "$0")" && pwd)
ab() {  # NAME CONFIG A B ROUNDS SECONDS [seed-bench flags...]
  local name=$1 cfg=$2 a=$3 b=$4 rounds=$5 dur=$6; shift 6
  seed-bench --config="$cfg" --duration_s="$dur" --compare="$b" --compare_with="$a" --compare_rounds="$rounds" \
    --compare_max_other_load=0.15 --progress=false --out="$here/$name.json" "$@" > "$here/$name.log" 2>&1
}
# main against the base
ab fake_mlp-06d8e0f-vs-9e0b7a4 fake_mlp 06d8e0f 9e0b7a4 5 25 --baselines=transport
ab fake_atari-06d8e0f-vs-9e0b7a4 fake_atari 06d8e0f 9e0b7a4 5 30
ab pong_vtrace-06d8e0f-vs-9e0b7a4 pong_vtrace 06d8e0f 9e0b7a4 3 60
ab pong_vtrace-06d8e0f-vs-9e0b7a4-7rounds pong_vtrace 06d8e0f 9e0b7a4 7 60
# the old main against the base
ab fake_mlp-da2d4f7-vs-9e0b7a4 fake_mlp da2d4f7 9e0b7a4 3 25 --baselines=transport
# each change against its parent
ab fake_mlp-ee56fb7-vs-6b72c87 fake_mlp ee56fb7 6b72c87 3 25
ab fake_mlp_r2d2-3b3bf90-vs-733e342 fake_mlp_r2d2 3b3bf90 733e342 3 25 --bench_configs="$here/r2d2_configs.yaml"
ab fake_mlp-bc50fd2-vs-213888e fake_mlp bc50fd2 213888e 3 25
ab fake_mlp-06d8e0f-vs-42cd7a0 fake_mlp 06d8e0f 42cd7a0 3 25
ab fake_atari-06d8e0f-vs-42cd7a0 fake_atari 06d8e0f 42cd7a0 3 30
ab fake_mlp-82ec2eb-vs-06d8e0f fake_mlp 82ec2eb 06d8e0f 3 25
ab fake_mlp-82ec2eb-vs-9e0b7a4 fake_mlp 82ec2eb 9e0b7a4 3 25 --baselines=transport
# the batched search, both commits at once on their own cores (mctx in a venv that sees the project's packages)
#   /work/venv-mctx/bin/python -m seed.bench.search_speed --cpu=0 --batch=64 --simulations=50 --actions=18 \
#     --repeats=20 --out=search_06d8e0f.json
#   PYTHONPATH=<mctx venv site-packages> ~/.cache/seed-rl/ab/<9e0b7a4>/venv/bin/python -m seed.bench.search_speed \
#     --cpu=1 ... --out=search_9e0b7a4.json
# the profiles: seed-bench --config=fake_mlp --duration_s=30 --profile=server,actor0 (after/; before/ with server)
# the whole change of this stop against its base (c64a556: the time-major unrolls and the batched replay insert
# already in it)
ab fake_mlp-7fd9168-vs-c64a556 fake_mlp 7fd9168 c64a556 3 25 --baselines=transport
ab fake_atari-7fd9168-vs-c64a556 fake_atari 7fd9168 c64a556 3 30
