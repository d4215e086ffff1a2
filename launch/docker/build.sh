#!/usr/bin/env bash
# Builds an image from the project's Dockerfiles (`make image` runs `launch/docker/build.sh --offline`):
#
#   launch/docker/build.sh [--offline] [--engine=podman|docker] [--file=launch/docker/Dockerfile.cpu]
#                          [--tag=seed-rl-torch:cpu] [-- MORE BUILD ARGUMENTS...]
#
#   online (default)  the Dockerfile as it is: python:3.11-slim-bookworm from Docker Hub, pip from PyPI and
#                     PyTorch's CPU index (the same as `docker build -f launch/docker/Dockerfile.cpu -t ... .`)
#   --offline         no registry, no index: launch/docker/offline_base.sh makes (once, then keeps) a local Debian
#                     base (debootstrap) and a wheelhouse; the build then runs with --network=none on that base,
#                     with the wheelhouse mounted read-only at /wheels. CPU image only; podman only (docker build
#                     cannot mount a folder into RUN; load the result into docker with
#                     `podman save seed-rl-torch:cpu | docker load`)
#
# The engine is podman if installed, else docker; --engine picks one. Its own checks (seed-learner, seed-actor,
# torch and ale-py load) run as the build's last step. Prints the build time and the image size. With podman,
# CONTAINERS_CONF defaults to launch/docker/containers.conf (what machines like the project's need). The image a
# rebuild replaces is removed (its layers that the new one shares stay).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
offline=0
engine=""
file="launch/docker/Dockerfile.cpu"
tag="seed-rl-torch:cpu"
extra=()
usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "[build] error: $*" >&2; exit 1; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --offline) offline=1 ;;
    --online) offline=0 ;;
    --engine=*) engine=${1#*=} ;;
    --file=*) file=${1#*=} ;;
    --tag=*) tag=${1#*=} ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) usage ;;
    *) echo "[build] unknown argument: $1" >&2; usage ;;
  esac
  shift
done
if [[ -z $engine ]]; then
  if command -v podman >/dev/null 2>&1; then engine=podman
  elif command -v docker >/dev/null 2>&1; then engine=docker
  else die "neither podman nor docker found (Debian: launch/install_container_tools.sh installs podman)"
  fi
fi
[[ $engine == podman || $engine == docker ]] || die "--engine: got '$engine', expected podman or docker"
command -v "$engine" >/dev/null 2>&1 || die "--engine=$engine: $engine not found"
cd "$ROOT"
[[ -f $file ]] || die "--file: got '$file', expected a Dockerfile under $ROOT"

args=(build -f "$file" -t "$tag")
if [[ $engine == podman ]]; then
  export CONTAINERS_CONF="${CONTAINERS_CONF:-$ROOT/launch/docker/containers.conf}"
  # BuildKit reads <Dockerfile>.dockerignore next to the Dockerfile by itself; podman is told.
  [[ -f $file.dockerignore ]] && args+=(--ignorefile "$file.dockerignore")
fi
if [[ $offline == 1 ]]; then
  [[ $engine == podman ]] || die "--offline needs podman (docker build cannot mount the wheelhouse into RUN):" \
    "install podman (launch/install_container_tools.sh) or build online"
  [[ $(basename "$file") == Dockerfile.cpu ]] || die "--offline builds Dockerfile.cpu only (got --file=$file):" \
    "the wheelhouse holds the CPU torch"
  base="${BASE_IMAGE:-localhost/seed-base:bookworm}"
  wheelhouse="$(BASE_IMAGE="$base" "$ROOT/launch/docker/offline_base.sh" | tail -n 1)"
  args+=(--network=none --pull=never --build-arg "BASE_IMAGE=$base" -v "$wheelhouse:/wheels:ro"
         --build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS=/wheels)
fi

before="$("$engine" image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)"
started=$SECONDS
echo "[build] $engine ${args[*]} ${extra[*]} ." >&2
"$engine" "${args[@]}" "${extra[@]}" .
after="$("$engine" image inspect --format '{{.Id}}' "$tag")"
if [[ -n $before && $before != "$after" ]]; then
  "$engine" rmi "$before" >/dev/null 2>&1 || true  # still used by a container, or tagged otherwise: kept
fi
size="$("$engine" image inspect --format '{{.Size}}' "$tag" | awk '{printf "%.2f GB", $1 / 1e9}')"
echo "[build] $tag built in $((SECONDS - started)) s ($( [[ $offline == 1 ]] && echo offline || echo online)," \
  "$engine): $size" >&2
