#!/usr/bin/env bash
# Instructions per fake_mlp inference batch (callgrind) for each commit named, two at a time:
#   docs/performance/cpu/hot_path_ab/instructions.sh 9e0b7a4 d97b920 ...
# Each commit runs this checkout's seed/bench/batch_cost.py with its own interpreter (installed once into
# ~/.cache/seed-rl/ab/<commit>, as seed-bench --compare does) from /tmp, so that it imports that commit's seed.
set -u
repo=$(git rev-parse --show-toplevel)
out=$(cd "$(dirname "$0")" && pwd)/instructions; mkdir -p "$out"
for c in "$@"; do
  python3 -c "from seed.bench.compare import install_commit as i; i('$repo', '$(git rev-parse "$c")', '$HOME/.cache/seed-rl/ab', print)"
done
one() {
  local py; py=$HOME/.cache/seed-rl/ab/$(git -C "$repo" rev-parse "$1")/venv/bin/python
  (cd /tmp && "$py" "$repo/seed/bench/batch_cost.py" --config=fake_mlp --callgrind --batches=80 \
     --out="$out/batch_cost_$1.json" > "$out/batch_cost_$1.log" 2>&1)
  echo "$1 $(grep -o '"instructions_per_batch": [0-9.]*' "$out/batch_cost_$1.json")"
}
export -f one; export repo out
printf '%s\n' "$@" | xargs -P 2 -I{} bash -c 'one {}'
