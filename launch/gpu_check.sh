#!/usr/bin/env bash
# Everything the GPU path must show, in one call on a machine with one CUDA GPU; one result folder with a report:
#
#   launch/gpu_check.sh                          # the checks (about 8 minutes); results under bench_results/gpu
#   launch/gpu_check.sh --learn                  # also the 8-minute learning run (or --only=learn: it alone)
#   launch/gpu_check.sh --out_dir=/data/gpu      # elsewhere (docs/performance/gpu/<device>_<date>/ to commit)
#   launch/gpu_check.sh --dry_run --learn        # print every command only (no GPU needed; tested in make test)
#   launch/gpu_check.sh --only=search_gpu,muzero_resume   # some steps (comma-separated)
#
# Steps, one after the other; a failing step is reported and the rest still run (the exit code is 1 then):
#   cuda_tests       tests/test_cuda.py and tests/test_graph_lock.py (needs a source checkout; skipped without
#                    one), among them 200 rounds of graph captures in one thread beside replays in another
#   search_gpu       seed-bench search-gpu: MuZero's search, 256 (and 16) trees x 50 simulations x 18 actions
#   r2d2_atari_gpu   R2D2 on Pong, with the env_only ceiling of the same cores (FPS / ceiling)
#   pong_vtrace_gpu  V-trace on Pong, with its env_only ceiling
#   muzero_resume    atari100k_muzero_gpu for 90 s, stopped with SIGTERM, resumed in the same logdir for 60 s;
#                    fails on any Traceback in either run's output or on no resume
#   learn            (--learn) pong_vtrace_gpu trained for 8 minutes with its evaluation envs; its evaluation
#                    curve and final score
# then seed-report over the bench results and seed.bench.gpu_check_report: report.md and summary.json, every
# step's status, time and headline numbers beside the targets.
#
# Needs an installed package (a wheel, `pip install .` or `make install`, with the atari extra). Set SEED_BENCH,
# SEED_REPORT or PYTHON to use other commands. Extra flags after `--` go to every seed-bench run.
set -euo pipefail

OUT_DIR="bench_results/gpu"
DRY_RUN=0
LEARN=0
ONLY=""
STEPS=(cuda_tests search_gpu r2d2_atari_gpu pong_vtrace_gpu muzero_resume learn)
BENCH_SECONDS=40      # each bench run and its env_only baseline
MUZERO_FIRST_S=90
MUZERO_RESUMED_S=60
LEARN_S=480
EXTRA=()
while (($#)); do
  case "$1" in
    --out_dir=*) OUT_DIR="${1#--out_dir=}" ;;
    --dry_run) DRY_RUN=1 ;;
    --learn) LEARN=1 ;;
    --only=*) ONLY=",${1#--only=}," ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument '$1' (expected --out_dir=DIR, --dry_run, --learn, --only=STEPS or" \
            "-- FLAGS...)" >&2
       exit 2 ;;
  esac
  shift
done

for name in ${ONLY//,/ }; do
  if [[ " ${STEPS[*]} " != *" $name "* ]]; then
    echo "gpu_check.sh: --only: got '$name', expected some of ${STEPS[*]}" >&2
    exit 2
  fi
done

read -r -a BENCH <<<"${SEED_BENCH:-seed-bench}"
read -r -a REPORT <<<"${SEED_REPORT:-seed-report}"
PYTHON="${PYTHON:-python3}"
case "$OUT_DIR" in /*) ;; *) OUT_DIR="$PWD/$OUT_DIR" ;; esac  # absolute, as every path handed to the tools
RUNS_DIR="$OUT_DIR/runs"
CHECKOUT="$(cd "$(dirname "$0")/.." && pwd)"
STATUS="$OUT_DIR/steps.tsv"

if ((DRY_RUN == 0)); then
  if ! command -v "${BENCH[0]}" >/dev/null || ! command -v "${REPORT[0]}" >/dev/null; then
    echo "gpu_check.sh: '${BENCH[0]}' or '${REPORT[0]}' not found; install the package first" \
         "(pip install '.[atari]' or make install)" >&2
    exit 1
  fi
  if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check.sh: no NVIDIA GPU visible (nvidia-smi -L failed); this script checks the GPU path" >&2
    exit 1
  fi
  mkdir -p "$OUT_DIR" "$RUNS_DIR"
  nvidia-smi -L | tee "$OUT_DIR/device.txt" >&2
  : >"$STATUS"
fi

run() {  # prints the command; runs it unless --dry_run
  echo "+ $*" >&2
  if ((DRY_RUN == 0)); then "$@"; fi
}

selected() {  # selected STEP: --only names it, or (no --only) every step but learn, and learn with --learn
  if [[ -n "$ONLY" ]]; then [[ "$ONLY" == *",$1,"* ]]; return; fi
  [[ "$1" != learn ]] || ((LEARN))
}

step() {  # step NAME FUNCTION: runs it if selected, records its exit status and seconds in steps.tsv
  local name="$1" started rc=0
  selected "$name" || return 0
  echo "gpu_check.sh: step $name" >&2
  started=$(date +%s)
  "$2" || rc=$?
  if ((DRY_RUN == 0)); then printf '%s\t%s\t%s\n' "$name" "$rc" "$(($(date +%s) - started))" >>"$STATUS"; fi
  if ((rc != 0)); then echo "gpu_check.sh: step $name failed (exit $rc)" >&2; fi
}

logged() {  # logged FILE COMMAND...: the command's output into FILE (and the terminal), its exit status kept
  local file="$1"
  shift
  echo "+ $* > $file" >&2
  if ((DRY_RUN)); then return 0; fi
  set +e
  "$@" 2>&1 | tee "$file"
  local rc=${PIPESTATUS[0]}
  set -e
  return "$rc"
}

cuda_tests() {
  if [[ ! -f "$CHECKOUT/tests/test_cuda.py" ]]; then
    echo "gpu_check.sh: cuda_tests skipped: no source checkout beside this script (tests/ not found)" >&2
    return 0
  fi
  (cd "$CHECKOUT" && logged "$OUT_DIR/cuda_tests.log" timeout 240 "$PYTHON" -m pytest -q -ra \
     tests/test_cuda.py tests/test_graph_lock.py)
}

search_gpu() {
  run timeout 150 "${BENCH[@]}" search-gpu --batch=16,256 --simulations=50 --actions=18 --repeats=5 \
    --out="$OUT_DIR/search_gpu.json"
}

bench() {  # bench NAME: the configuration of that name with its env_only ceiling
  run "${BENCH[@]}" --config="$1" --name="$1" --out="$OUT_DIR/$1.json" --runs_dir="$RUNS_DIR" --noprogress \
    --duration_s="$BENCH_SECONDS" --baselines=env_only ${EXTRA[@]+"${EXTRA[@]}"}
}
r2d2_atari_gpu() { bench r2d2_atari_gpu; }
pong_vtrace_gpu() { bench pong_vtrace_gpu; }

local_run() {  # local_run SECONDS LOG FLAGS...: the launcher (learner + actors) stopped with SIGTERM after SECONDS
  local seconds="$1" log="$2"
  shift 2
  local rc=0
  logged "$log" timeout -s TERM -k 60 "$seconds" "$PYTHON" -m seed.local_launcher "$@" || rc=$?
  ((rc == 0 || rc == 124)) || return "$rc"  # 124: stopped by the timeout, as intended
}

muzero_resume() {
  local logdir="$RUNS_DIR/muzero_resume" rc=0
  if ((DRY_RUN == 0)); then rm -rf "$logdir"; fi
  local_run "$MUZERO_FIRST_S" "$OUT_DIR/muzero_first.log" --preset=atari100k_muzero_gpu --logdir="$logdir" || rc=$?
  local_run "$MUZERO_RESUMED_S" "$OUT_DIR/muzero_resumed.log" --preset=atari100k_muzero_gpu --logdir="$logdir" \
    || rc=$?
  run cp "$logdir/metrics.jsonl" "$OUT_DIR/muzero_metrics.jsonl" || rc=$?
  if ((DRY_RUN)); then return 0; fi
  if grep -l "Traceback" "$OUT_DIR/muzero_first.log" "$OUT_DIR/muzero_resumed.log" >&2; then
    echo "gpu_check.sh: muzero_resume: a Traceback in the runs' output (above)" >&2
    rc=1
  fi
  if ! grep -q "resum" "$OUT_DIR/muzero_resumed.log"; then
    echo "gpu_check.sh: muzero_resume: the second run did not resume from the first's checkpoint" >&2
    rc=1
  fi
  return "$rc"
}

learn() {
  local logdir="$RUNS_DIR/learn_pong_vtrace_gpu" rc=0
  if ((DRY_RUN == 0)); then rm -rf "$logdir"; fi
  local_run "$LEARN_S" "$OUT_DIR/learn.log" --preset=pong_vtrace_gpu --logdir="$logdir" --log_interval_s=10 || rc=$?
  run cp "$logdir/metrics.jsonl" "$OUT_DIR/learn_metrics.jsonl" || rc=$?
  run "${REPORT[@]}" --curves "$logdir" --out="$OUT_DIR/learn_curve" || rc=$?
  return "$rc"
}

step cuda_tests cuda_tests
step search_gpu search_gpu
step r2d2_atari_gpu r2d2_atari_gpu
step pong_vtrace_gpu pong_vtrace_gpu
step muzero_resume muzero_resume
step learn learn

RESULTS=()
for name in r2d2_atari_gpu pong_vtrace_gpu; do
  if ((DRY_RUN)) || [[ -f "$OUT_DIR/$name.json" ]]; then RESULTS+=("$OUT_DIR/$name.json"); fi
done
if ((${#RESULTS[@]})); then
  run "${REPORT[@]}" "${RESULTS[@]}" --pricing=current --compare_pricing=paper --out="$OUT_DIR/bench_report" || true
fi
run "$PYTHON" -m seed.bench.gpu_check_report "$OUT_DIR"
if ((DRY_RUN)); then
  echo "gpu_check.sh: dry run, nothing was run" >&2
  exit 0
fi
echo "gpu_check.sh: results in $OUT_DIR (report.md, summary.json, the steps' logs and result files)" >&2
if awk -F'\t' '$2 != 0 {bad = 1} END {exit !bad}' "$STATUS"; then
  echo "gpu_check.sh: failed steps: $(awk -F'\t' '$2 != 0 {print $1}' "$STATUS" | xargs)" >&2
  exit 1
fi
