#!/usr/bin/env bash
# Usage: run.sh NAME SECONDS FLAGS... : one learner + actors for SECONDS, then the medians of the metrics rows after the first 2
set -u
name=$1; seconds=$2; shift 2
dir=/tmp/sinkm/$name
rm -rf "$dir"
cd /work/main
timeout -s TERM "$seconds" launch/local.sh --logdir="$dir" --log_interval_s=10 "$@" > /tmp/sinkm/$name.log 2>&1
python3 - "$dir" "$name" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
rows = [r for r in rows if (r.get("train_steps_per_sec") or 0) > 0][1:]
keys = ["inference/policy_ms", "inference/sink_ms", "experience/sink_ms", "experience/priorities_ms",
        "experience/insert_ms", "experience/ratio_wait_ms", "env_frames_per_sec", "train_steps_per_sec"]
out = {"name": sys.argv[2], "rows": len(rows)}
for k in keys:
    v = [r[k] for r in rows if isinstance(r.get(k), (int, float))]
    out[k] = round(statistics.median(v), 2) if v else None
print(json.dumps(out))
PY
