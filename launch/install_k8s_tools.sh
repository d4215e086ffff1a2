#!/usr/bin/env bash
# Makes the tools tests/test_k8s_manifests.py uses available, and says what it did:
#   kubectl >= 1.21      `kubectl kustomize` renders launch/k8s/overlays/* (1.21+ bundles kustomize v4+;
#                        a standalone `kustomize` v4+ on PATH works as well)
#   kubernetes-validate  validates the rendered manifests offline against bundled Kubernetes JSON schemas
#
# Idempotent: whatever already works is left alone. kubectl comes from, in order: PATH, then Debian's
# kubernetes-client package (apt-get) if the candidate version is new enough. There is no PyPI route for kubectl
# (no PyPI distribution ships the kubectl binary). Without a usable kubectl this script only warns (exit 0) and
# the manifest tests skip, saying why; kubernetes-validate is pip-installed (a failure there is an error).
#
# Environment:
#   PYTHON                       interpreter the tests run with (default python3)
#   KUBERNETES_VALIDATE_VERSION  version to pip-install when none is importable (default 1.37.0)
#   SKIP_APT=1                   never run apt-get
set -euo pipefail

PYTHON="${PYTHON:-python3}"
KUBERNETES_VALIDATE_VERSION="${KUBERNETES_VALIDATE_VERSION:-1.37.0}"
MIN_KUBECTL_MINOR=21
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

log() { echo "[install_k8s_tools] $*"; }

# Minor version of the kubectl on PATH (0 if none or unparsable). "32+" (vendor builds) counts as 32.
kubectl_minor() {
  command -v kubectl >/dev/null 2>&1 || { echo 0; return; }
  kubectl version --client -o json 2>/dev/null | "$PYTHON" -c '
import json, re, sys
try:
    print(int(re.match(r"\d+", json.load(sys.stdin)["clientVersion"]["minor"]).group()))
except Exception:
    print(0)' 2>/dev/null || echo 0
}

kubectl_describe() {
  kubectl version --client 2>/dev/null | tr '\n' ' ' | sed 's/ *$//'
}

standalone_kustomize_ok() {
  command -v kustomize >/dev/null 2>&1 && kustomize version 2>/dev/null | grep -Eq 'v([4-9]|[1-9][0-9])\.'
}

sudo_prefix() {
  if [[ "$(id -u)" == "0" ]]; then
    echo ""
  elif command -v sudo >/dev/null 2>&1; then
    echo "sudo"
  else
    echo "none"
  fi
}

# --- kubectl ----------------------------------------------------------------------------------------------
kubectl_ok=0
minor="$(kubectl_minor)"
if [[ "$minor" -ge "$MIN_KUBECTL_MINOR" ]]; then
  log "kubectl already available: $(command -v kubectl) ($(kubectl_describe)); nothing to do."
  kubectl_ok=1
elif standalone_kustomize_ok; then
  log "standalone kustomize available: $(command -v kustomize) ($(kustomize version 2>/dev/null | head -1)); the tests use it."
  kubectl_ok=1
else
  if command -v kubectl >/dev/null 2>&1; then
    log "kubectl at $(command -v kubectl) is too old ($(kubectl_describe)): its kustomize cannot render launch/k8s."
  else
    log "kubectl not found on PATH."
  fi
  if [[ "${SKIP_APT:-0}" == "1" ]]; then
    log "SKIP_APT=1: not trying apt-get."
  elif ! command -v apt-get >/dev/null 2>&1; then
    log "apt-get not found: cannot install Debian's kubernetes-client."
  elif [[ "$(sudo_prefix)" == "none" ]]; then
    log "not root and no sudo: cannot run apt-get install kubernetes-client."
  else
    SUDO="$(sudo_prefix)"
    candidate="$(apt-cache policy kubernetes-client 2>/dev/null | awk '/Candidate:/ {print $2}')"
    if [[ -z "$candidate" || "$candidate" == "(none)" ]]; then
      log "apt-get update (looking for kubernetes-client)"
      $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
      candidate="$(apt-cache policy kubernetes-client 2>/dev/null | awk '/Candidate:/ {print $2}')"
    fi
    # Debian versions look like 1.20.5+really1.20.2-1.1+deb12u1: the minor is the second number.
    candidate_minor="$(echo "$candidate" | sed -nE 's/^([0-9]+:)?1\.([0-9]+)\..*/\2/p')"
    if [[ -z "$candidate" || "$candidate" == "(none)" ]]; then
      log "no kubernetes-client package in the configured apt sources."
    elif [[ -z "$candidate_minor" || "$candidate_minor" -lt "$MIN_KUBECTL_MINOR" ]]; then
      log "Debian's kubernetes-client candidate is $candidate (kubectl 1.${candidate_minor:-?}, kustomize v2):" \
        "too old for launch/k8s, not installing it."
    else
      log "apt-get install -y kubernetes-client ($candidate)"
      $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends kubernetes-client
      hash -r
      if [[ "$(kubectl_minor)" -ge "$MIN_KUBECTL_MINOR" ]]; then
        log "installed kubectl: $(command -v kubectl) ($(kubectl_describe))"
        kubectl_ok=1
      fi
    fi
  fi
  if [[ "$kubectl_ok" != "1" ]]; then
    log "WARNING: no kubectl >= 1.$MIN_KUBECTL_MINOR (there is no PyPI package for it either). Install one from" \
      "https://kubernetes.io/docs/tasks/tools/ (or a standalone kustomize v4+); until then" \
      "tests/test_k8s_manifests.py skips its checks."
  fi
fi

# --- kubernetes-validate ----------------------------------------------------------------------------------
if "$PYTHON" -c "import kubernetes_validate" >/dev/null 2>&1; then
  log "kubernetes-validate already installed for $PYTHON ($("$PYTHON" -m kubernetes_validate --version)); nothing to do."
else
  log "$PYTHON -m pip install kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
  "$PYTHON" -m pip install --quiet "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
fi
schemas="$("$PYTHON" -c 'import kubernetes_validate.utils as u; v = sorted(set(u.all_versions()), key=lambda s: tuple(map(int, s.split(".")))); print(v[0], "to", v[-1])')"
log "kubernetes-validate bundles Kubernetes schemas $schemas (validation is offline)."

# --- check: render and validate the cpu overlay -----------------------------------------------------------
if [[ "$kubectl_ok" == "1" ]]; then
  rendered="$(mktemp --suffix=.yaml)"
  trap 'rm -f "$rendered"' EXIT
  if [[ "$(kubectl_minor)" -ge "$MIN_KUBECTL_MINOR" ]]; then
    kubectl kustomize "$ROOT/launch/k8s/overlays/cpu" >"$rendered"
  else
    kustomize build "$ROOT/launch/k8s/overlays/cpu" >"$rendered"
  fi
  "$PYTHON" -m kubernetes_validate --strict --quiet "$rendered"
  log "check: launch/k8s/overlays/cpu renders and validates (strict, Kubernetes" \
    "$("$PYTHON" -c 'import kubernetes_validate as k; print(k.latest_version())'))."
fi
