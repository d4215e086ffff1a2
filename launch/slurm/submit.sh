#!/usr/bin/env bash
# Submits a SEED RL run as one heterogeneous Slurm job (launch/slurm/seed.sbatch): the learner on one node with the
# feature `learner` (or a GPU: --learner_gres=gpu:1), the actors on --actor_nodes nodes with the feature `actor`.
#
#   launch/slurm/submit.sh --logdir=/shared/runs/pong [--actor_nodes=2] [--actors_per_node=8]
#       [--flags_dir=launch/slurm/flags] [--learner_constraint=learner] [--actor_constraint=actor]
#       [--learner_gres=gpu:1] [--partition=P] [--learner_partition=P] [--actor_partition=P]
#       [--learner_cpus=8] [--time=1-00:00:00] [--port=8686] [--python=python3] [--actors_grace_s=60]
#       [-- more sbatch options for both components, e.g. --account=A --qos=Q]
#
# --logdir must be on storage every node of the job sees (checkpoints, metrics, logs, flags, token). The flags come
# from one place, --flags_dir (env.flags for both roles, learner.flags, actor.flags): they are copied to
# LOGDIR/flags at the first submission, so a requeued or resubmitted job runs with the same ones (edit the copy to
# change a run). LOGDIR/auth_token is made once (mode 0600): the actors' token for the learner.
#
# Refused before sbatch, naming what is missing: no node with the learner's feature (or GRES), fewer nodes with the
# actors' feature than --actor_nodes (none at all: a job with no actor nodes), and a second job for a logdir that a
# pending or running job already has (its learner would be asked twice). Prints the job id.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
die() { echo "launch/slurm/submit.sh: $*" >&2; exit 2; }

logdir="" actor_nodes=2 actors_per_node=8 flags_dir="$HERE/flags" learner_constraint=learner
actor_constraint=actor learner_gres="" partition="" learner_partition="" actor_partition="" learner_cpus=""
time_limit="" port=8686 python=${SEED_PYTHON:-python3} grace_s=60
extra=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --logdir=*) logdir=${1#*=} ;;
    --actor_nodes=*) actor_nodes=${1#*=} ;;
    --actors_per_node=*) actors_per_node=${1#*=} ;;
    --flags_dir=*) flags_dir=${1#*=} ;;
    --learner_constraint=*) learner_constraint=${1#*=} ;;
    --actor_constraint=*) actor_constraint=${1#*=} ;;
    --learner_gres=*) learner_gres=${1#*=} ;;
    --partition=*) partition=${1#*=} ;;
    --learner_partition=*) learner_partition=${1#*=} ;;
    --actor_partition=*) actor_partition=${1#*=} ;;
    --learner_cpus=*) learner_cpus=${1#*=} ;;
    --time=*) time_limit=${1#*=} ;;
    --port=*) port=${1#*=} ;;
    --python=*) python=${1#*=} ;;
    --actors_grace_s=*) grace_s=${1#*=} ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown option '$1' (see the top of $0)" ;;
  esac
  shift
done

[[ -n $logdir ]] || die "--logdir: got none, expected the run's logdir on storage every node of the job sees"
[[ $actor_nodes =~ ^[0-9]+$ ]] || die "--actor_nodes: got '$actor_nodes', expected a number of nodes"
[[ $actors_per_node =~ ^[1-9][0-9]*$ ]] || die "--actors_per_node: got '$actors_per_node', expected >= 1"
[[ $actor_nodes -ge 1 ]] || die "--actor_nodes: got $actor_nodes, expected >= 1: a job with no actor nodes trains nothing"
for f in env.flags learner.flags actor.flags; do
  [[ -f $logdir/flags/$f || -f $flags_dir/$f ]] || die "--flags_dir: $flags_dir/$f: got no such file, expected env.flags, learner.flags and actor.flags there"
done
learner_partition=${learner_partition:-$partition}
actor_partition=${actor_partition:-$partition}

# The nodes Slurm knows, one line per node and partition: name|features|gres|partition.
nodes=$(sinfo -h -N -o '%N|%f|%G|%R') || die "sinfo failed: is this a Slurm cluster (SLURM_CONF=${SLURM_CONF:-default})?"
in_partition() { awk -F'|' -v p="$1" 'p == "" || $4 == p'; }
has_feature() { awk -F'|' -v c="$1" '{ n = split($2, f, ","); for (i = 1; i <= n; i++) if (f[i] == c) { print; next } }'; }
count_nodes() { cut -d'|' -f1 | sort -u | grep -c . || true; }
where="${learner_partition:+ in partition $learner_partition}"
learner_nodes=$(in_partition "$learner_partition" <<<"$nodes" | has_feature "$learner_constraint")
[[ -n $learner_nodes ]] || die "no learner node: no node${where} has the feature '$learner_constraint' (Features=$learner_constraint in slurm.conf; nodes: $(cut -d'|' -f1,2 <<<"$nodes" | tr '\n' ' '))"
if [[ -n $learner_gres ]]; then
  gres_name=${learner_gres%%:*}
  grep -q "|[^|]*$gres_name[^|]*|" <<<"$learner_nodes" \
    || die "--learner_gres=$learner_gres: no node with the feature '$learner_constraint'$where has a '$gres_name' GRES (nodes: $(cut -d'|' -f1,3 <<<"$learner_nodes" | tr '\n' ' '))"
fi
where="${actor_partition:+ in partition $actor_partition}"
have=$(in_partition "$actor_partition" <<<"$nodes" | has_feature "$actor_constraint" | count_nodes)
[[ $have -ge 1 ]] || die "no actor nodes: no node${where} has the feature '$actor_constraint' (Features=$actor_constraint in slurm.conf)"
[[ $have -ge $actor_nodes ]] || die "--actor_nodes=$actor_nodes: got $have node(s)${where} with the feature '$actor_constraint', expected at least $actor_nodes"

logdir=$(realpath -m "$logdir")
comment="seed-logdir=$logdir"
# One line per het job component (JOB+0, JOB+1); the first names the job.
taken=$(squeue -h -t PENDING,RUNNING,CONFIGURING,REQUEUED,SUSPENDED -o '%i|%k' \
  | awk -F'|' -v c="$comment" '$2 == c && $1 !~ /\+[1-9]/ { sub(/\+0$/, "", $1); print $1 }' | sort -u | tr '\n' ' ')
[[ -z $taken ]] || die "--logdir=$logdir: job(s) ${taken}already run it: its learner would be asked twice for one logdir (scancel that job, or use another --logdir)"

mkdir -p "$logdir/flags"
for f in env.flags learner.flags actor.flags; do
  [[ -f $logdir/flags/$f ]] || cp "$flags_dir/$f" "$logdir/flags/$f"
done
if [[ ! -f $logdir/auth_token ]]; then
  (umask 077 && "$python" -c 'import secrets; print(secrets.token_hex(32))' >"$logdir/auth_token")
fi

learner=(--nodes=1 --ntasks=1 --constraint="$learner_constraint")
[[ -z $learner_gres ]] || learner+=(--gres="$learner_gres")
[[ -z $learner_cpus ]] || learner+=(--cpus-per-task="$learner_cpus")
[[ -z $learner_partition ]] || learner+=(--partition="$learner_partition")
actors=(--nodes="$actor_nodes" --ntasks-per-node="$actors_per_node" --constraint="$actor_constraint")
[[ -z $actor_partition ]] || actors+=(--partition="$actor_partition")
job=(--job-name="seed-$(basename "$logdir")" --comment="$comment" --requeue --open-mode=append
     --output="$logdir/slurm-%j.out"
     --export="ALL,SEED_LOGDIR=$logdir,SEED_PORT=$port,SEED_PYTHON=$python,SEED_ACTORS_GRACE_S=$grace_s")
[[ -z $time_limit ]] || job+=(--time="$time_limit")
sbatch --parsable "${job[@]}" "${learner[@]}" "${extra[@]}" : "${actors[@]}" "${extra[@]}" "$HERE/seed.sbatch"
