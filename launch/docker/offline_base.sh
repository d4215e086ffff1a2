#!/usr/bin/env bash
# Makes what an offline image build (launch/docker/build.sh --offline) needs, without any container registry:
#
#   a base image   localhost/seed-base:bookworm: Debian bookworm (debootstrap --variant=minbase from the Debian
#                  archive) with Python 3.11 and a virtual environment at /opt/venv whose python and pip come
#                  first on PATH, as python:3.11-slim-bookworm's do (and Debian's PEP 668 rule does not apply)
#   a wheelhouse   every wheel `pip install ".[atari]"` needs for the image (the CPU torch, the project's
#                  pinned grpcio/grpcio-tools/protobuf and the rest of setup.py's requirements, the build
#                  requirements of pyproject.toml), downloaded on this host for CPython 3.11 on manylinux x86_64
#
#   launch/docker/offline_base.sh             # prints the wheelhouse folder on its last line
#
# Both are kept between runs and made again only when their inputs change: the base image carries a label with
# this script's recipe version; the wheelhouse folder is named by a hash of setup.py, pyproject.toml, the torch
# version and this script. Needs root, podman, debootstrap (launch/install_container_tools.sh) and pip reaching a
# package index.
#
# Environment:
#   SEED_IMAGE_CACHE   where the wheelhouses live (default /var/cache/seed-rl-torch)
#   BASE_IMAGE         the base image's name (default localhost/seed-base:bookworm)
#   DEBIAN_MIRROR      debootstrap's mirror (default http://deb.debian.org/debian)
#   TORCH_VERSION      default 2.13.0 (as Dockerfile.cpu); the CPU build (+cpu) is downloaded
#   TORCH_INDEX_URL    where the CPU torch comes from when this host's pip does not find it (default PyTorch's
#                      CPU wheel index)
#   PYTHON             the interpreter that runs pip download (default python3)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE="${SEED_IMAGE_CACHE:-/var/cache/seed-rl-torch}"
BASE_IMAGE="${BASE_IMAGE:-localhost/seed-base:bookworm}"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
TORCH_INDEX_URL="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
PYTHON="${PYTHON:-python3}"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$ROOT/launch/docker/containers.conf}"
# Bumped when the base's recipe below changes: an image with another label is made again.
BASE_RECIPE=1

log() { echo "[offline_base] $*" >&2; }
die() { echo "[offline_base] error: $*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "needs root (debootstrap and podman import); running as uid $(id -u)"
for tool in podman debootstrap; do
  command -v "$tool" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin" command -v "$tool" >/dev/null 2>&1 \
    || die "$tool not found: run launch/install_container_tools.sh"
done
export PATH="$PATH:/usr/sbin:/sbin"

# --- the base image -----------------------------------------------------------------------------------------
make_base() {
  local root
  root="$(mktemp -d /var/tmp/seed-base.XXXXXX)"
  # shellcheck disable=SC2064
  trap "rm -rf '$root'" RETURN
  log "debootstrap --variant=minbase bookworm from $DEBIAN_MIRROR (about 1.5 minutes)"
  # passwd: the Dockerfiles' useradd. python3-venv: the venv (its pip comes from Debian's bundled wheel).
  debootstrap --variant=minbase --include=python3,python3-venv,passwd bookworm "$root" "$DEBIAN_MIRROR" \
    >"$root.log" 2>&1 || { tail -n 20 "$root.log" >&2; rm -f "$root.log"; die "debootstrap failed"; }
  rm -f "$root.log"
  chroot "$root" /usr/bin/python3 -m venv /opt/venv
  chroot "$root" apt-get clean
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/usr/share/doc/* "$root"/usr/share/man/*
  log "podman import as $BASE_IMAGE"
  tar --numeric-owner -C "$root" -c . | podman import \
    --change "ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --change "ENV LANG=C.UTF-8" \
    --change "LABEL seed.base.recipe=$BASE_RECIPE" \
    --change 'CMD ["python"]' \
    --message "debootstrap --variant=minbase bookworm + /opt/venv (launch/docker/offline_base.sh)" \
    - "$BASE_IMAGE" >/dev/null
  podman run --rm --network=none "$BASE_IMAGE" python -c 'import sys, venv; assert sys.prefix == "/opt/venv"' \
    || die "the imported base does not run python from /opt/venv"
}

if [[ "$(podman image inspect --format '{{index .Labels "seed.base.recipe"}}' "$BASE_IMAGE" 2>/dev/null)" \
      == "$BASE_RECIPE" ]]; then
  log "$BASE_IMAGE present (recipe $BASE_RECIPE); kept"
else
  started=$SECONDS
  make_base
  log "$BASE_IMAGE made in $((SECONDS - started)) s ($(podman image inspect --format '{{.Size}}' "$BASE_IMAGE" \
    | awk '{printf "%.0f MB", $1 / 1e6}'))"
fi

# --- the wheelhouse -----------------------------------------------------------------------------------------
key="$(cat "$ROOT/setup.py" "$ROOT/pyproject.toml" "${BASH_SOURCE[0]}" "$ROOT/launch/docker/image_requirements.py" \
  <(echo "$TORCH_VERSION") | sha256sum | cut -c1-16)"
wheelhouse="$CACHE/wheelhouse-$key"
if [[ -f "$wheelhouse/.complete" ]]; then
  log "wheelhouse $wheelhouse present ($(find "$wheelhouse" -name '*.whl' | wc -l) wheels); kept"
else
  started=$SECONDS
  mkdir -p "$CACHE"
  rm -rf "$wheelhouse" "$wheelhouse.partial"
  # Wheels only, for the image's interpreter (CPython 3.11, glibc 2.36), whatever Python this host has. The
  # project itself is not downloaded: the build installs it from the context, with its build requirements from
  # here. torch is the +cpu build: a plain torch==X from PyPI would pull the CUDA build and its nvidia wheels.
  mapfile -t requirements < <("$PYTHON" "$ROOT/launch/docker/image_requirements.py" "$ROOT")
  [[ ${#requirements[@]} -gt 0 ]] || die "launch/docker/image_requirements.py listed no requirements"
  # Every manylinux tag bookworm's glibc 2.36 runs, named one by one (older pips do not expand a newer tag to the
  # older ones, and a wheel may carry any of them).
  platforms=()
  for minor in $(seq 36 -1 5); do platforms+=(--platform "manylinux_2_${minor}_$(uname -m)"); done
  for legacy in manylinux2014 manylinux2010 manylinux1; do platforms+=(--platform "${legacy}_$(uname -m)"); done
  download() {
    "$PYTHON" -m pip download --quiet --dest "$wheelhouse.partial" --find-links "$wheelhouse.partial" \
      --only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 "${platforms[@]}" "$@"
  }
  # The CPU torch from wherever this host's pip finds it (its index, find-links), else from PyTorch's CPU index.
  if ! download --no-deps "torch==${TORCH_VERSION}+cpu" 2>/dev/null; then
    log "torch==${TORCH_VERSION}+cpu is not on this host's pip indexes: from $TORCH_INDEX_URL"
    download --no-deps "torch==${TORCH_VERSION}+cpu" --extra-index-url "$TORCH_INDEX_URL"
  fi
  log "pip download: torch==${TORCH_VERSION}+cpu and ${#requirements[@]} requirements (launch/docker/image_requirements.py)"
  download "torch==${TORCH_VERSION}+cpu" "${requirements[@]}"
  touch "$wheelhouse.partial/.complete"
  mv "$wheelhouse.partial" "$wheelhouse"
  log "wheelhouse $wheelhouse made in $((SECONDS - started)) s ($(find "$wheelhouse" -name '*.whl' | wc -l)" \
    "wheels, $(du -sm "$wheelhouse" | cut -f1) MB)"
  # Older wheelhouses (other requirements) go: only the current one is used.
  find "$CACHE" -maxdepth 1 -name 'wheelhouse-*' ! -name "wheelhouse-$key" -exec rm -rf {} +
fi
echo "$wheelhouse"
