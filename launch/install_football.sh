#!/usr/bin/env bash
# Installs Google Research Football (gfootball) for `--env=football:<scenario>`; `make football` calls it.
#
# Idempotent: exits at once when `import gfootball.env` already works. Otherwise installs the build
# dependencies with apt-get (Debian/Ubuntu), the run-time Python dependencies, then builds gfootball from
# source (its C++ engine compiles in about 5 minutes on 2 cores).
#
# Environment:
#   PYTHON             interpreter to install into (default python3)
#   GFOOTBALL_VERSION  gfootball version to build (default 2.10.2)
#   SKIP_APT=1         skip the apt-get step (build dependencies already present)
set -euo pipefail

PYTHON="${PYTHON:-python3}"
GFOOTBALL_VERSION="${GFOOTBALL_VERSION:-2.10.2}"
# gfootball uses the old gym API (4-tuple step); gym 0.25.2 is the last release with it that works here.
# It installs as the `gym` module and coexists with `gymnasium`.
GYM_SPEC="gym==0.25.2"
APT_PACKAGES=(
  build-essential cmake
  libsdl2-dev libsdl2-image-dev libsdl2-ttf-dev libsdl2-gfx-dev
  # The four Boost libraries the engine's CMake asks for (thread system filesystem python) and the headers;
  # libboost-all-dev would pull every Boost library and MPI with it (minutes of apt on a fresh machine).
  libboost-dev libboost-thread-dev libboost-system-dev libboost-filesystem-dev libboost-python-dev
  libgl-dev libegl-dev  # OpenGL and EGL headers the engine's CMake requires (usually pulled in by libsdl2-dev)
)
# No window: the engine must never try to open a display.
export SDL_VIDEODRIVER=dummy

log() { echo "[install_football] $*"; }

check() { "$PYTHON" -c "import gfootball.env" >/dev/null 2>&1; }

if check; then
  log "gfootball already importable with $PYTHON ($("$PYTHON" -c 'import importlib.metadata as m; print(m.version("gfootball"))' 2>/dev/null || echo '?')); nothing to do."
  exit 0
fi

start=$(date +%s)

if [[ "${SKIP_APT:-0}" != "1" ]]; then
  if ! command -v apt-get >/dev/null 2>&1; then
    log "apt-get not found: install the equivalents of ${APT_PACKAGES[*]} yourself, then rerun with SKIP_APT=1."
    exit 1
  fi
  SUDO=""
  if [[ "$(id -u)" != "0" ]]; then
    if command -v sudo >/dev/null 2>&1; then
      SUDO="sudo"
    else
      log "not root and no sudo: cannot run apt-get. Install ${APT_PACKAGES[*]}, then rerun with SKIP_APT=1."
      exit 1
    fi
  fi
  log "apt-get update"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
  log "apt-get install -y ${APT_PACKAGES[*]}"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${APT_PACKAGES[@]}"
fi

# The engine links Boost.Python, which Debian builds for its own python3 only (bookworm: 3.11). $PYTHON must
# have the same major.minor, or CMake stops with "Boost Python not found".
PY_MM=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
boost_python_libs() { find /usr/lib /usr/lib64 /usr/local/lib -maxdepth 2 -name "libboost_python$1.so" 2>/dev/null; }
if [[ -z "$(boost_python_libs "$PY_MM")" ]]; then
  log "no Boost.Python for Python ${PY_MM:0:1}.${PY_MM:1} (libboost_python$PY_MM.so); found:" \
    "$(boost_python_libs '*' | xargs -r -n1 basename | tr '\n' ' ')"
  log "use a Python whose version matches the system's Boost.Python (PYTHON=...), or build Boost.Python for it."
  exit 1
fi

# gfootball's own run-time requirements, except that we take opencv-python-headless instead of opencv-python:
# both wheels install the same cv2 package, and the project already uses the headless one (atari extra).
# gfootball only needs cv2 for rendering, which we never do.
RUNTIME_DEPS=(psutil wheel six "$GYM_SPEC" pygame scipy absl-py opencv-python-headless)
log "$PYTHON -m pip install ${RUNTIME_DEPS[*]}"
"$PYTHON" -m pip install "${RUNTIME_DEPS[@]}"

# --no-build-isolation: the engine build runs `python3 -c 'import psutil'`, so psutil must be importable by
# the interpreter doing the build (installed just above). --no-deps: the dependencies are installed above
# (pip check will name the missing opencv-python; that is expected). pip caches the built wheel, so a
# reinstall takes seconds.
log "$PYTHON -m pip install --no-build-isolation --no-deps gfootball==$GFOOTBALL_VERSION" \
  "(builds the C++ engine: about 5 minutes on 2 cores)"
"$PYTHON" -m pip install --no-build-isolation --no-deps "gfootball==$GFOOTBALL_VERSION"

if ! check; then
  log "gfootball installed but 'import gfootball.env' still fails:"
  "$PYTHON" -c "import gfootball.env"
  exit 1
fi
log "done in $(( $(date +%s) - start )) s: gfootball $("$PYTHON" -c 'import importlib.metadata as m; print(m.version("gfootball"))')"
