"""The Kubernetes manifests in launch/k8s: every overlay renders with kustomize, passes strict offline schema
validation, and is wired consistently (addresses, actor indices, probes, resources, volumes, and flags that
seed-learner / seed-actor really define)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from typing import Any

import pytest
import yaml

from seed.config import actor_config_class, env_options_class
from seed.learner.configuration import learner_fields
from tests.conftest import REPO

K8S_DIR = os.path.join(REPO, "launch", "k8s")
# Overlay -> GPUs the learner pod gets, and the (inference, training) devices its flags must name.
OVERLAYS = {
    "cpu": (0, ("cpu", "cpu")),
    "gpu": (1, ("cuda:0", "cuda:0")),
    "split-gpu": (2, ("cuda:0", "cuda:1")),
    "multi-gpu": (3, ("cuda:0", "cuda:1,cuda:2")),  # --training_devices: data-parallel training on two GPUs
}
# The oldest Kubernetes the manifests target (native gRPC probes are GA since 1.27); the newest schema that
# kubernetes-validate bundles is checked too.
MIN_K8S_VERSION = "1.27.0"
LEARNER, ACTOR, TENSORBOARD = "seed-learner", "seed-actor", "seed-tensorboard"
LEARNER_FIELDS = set(learner_fields())  # the framework's flags and every agent's
ACTOR_FIELDS = {f.name for f in dataclasses.fields(actor_config_class())}
ENV_FIELDS = {f.name for f in dataclasses.fields(env_options_class())}  # with every env family's
FLAG = re.compile(r"(?<![\w-])--([A-Za-z_]\w*)(?:=(\S*))?")


# ----------------------------------------------------------------------------------------------- rendering


def _kustomize_command() -> tuple[list[str] | None, str]:
    """(command that renders a kustomization directory, description) or (None, why there is none)."""
    kubectl = shutil.which("kubectl")
    if kubectl:
        result = subprocess.run([kubectl, "version", "--client", "-o", "json"], capture_output=True, text=True,
                                timeout=60)
        try:
            info = json.loads(result.stdout)
            minor = int(re.match(r"\d+", info["clientVersion"]["minor"]).group())
        except (ValueError, KeyError, AttributeError):
            minor, info = 0, {}
        version = info.get("clientVersion", {}).get("gitVersion", "unknown version")
        if minor >= 21:  # kubectl 1.21+ bundles kustomize v4+; 1.20 has v2.0.3, which predates this layout
            return [kubectl, "kustomize"], f"kubectl {version}, kustomize {info.get('kustomizeVersion', 'v4+')}"
        too_old = f"kubectl {version} bundles kustomize v2, too old for launch/k8s (needs kubectl >= 1.21)"
    else:
        too_old = "kubectl not found"
    kustomize = shutil.which("kustomize")
    if kustomize:
        result = subprocess.run([kustomize, "version"], capture_output=True, text=True, timeout=60)
        match = re.search(r"v(\d+)\.", result.stdout)
        if match and int(match.group(1)) >= 4:
            return [kustomize, "build"], f"kustomize {result.stdout.strip()}"
    return None, f"{too_old}; run launch/install_k8s_tools.sh or install kubectl >= 1.21"


_rendered: dict[str, list[dict[str, Any]]] = {}


def render(overlay: str) -> list[dict[str, Any]]:
    if overlay not in _rendered:
        command, description = _kustomize_command()
        if command is None:
            pytest.skip(description)
        result = subprocess.run([*command, os.path.join(K8S_DIR, "overlays", overlay)], capture_output=True,
                                text=True, timeout=120)
        assert result.returncode == 0, f"{description}: launch/k8s/overlays/{overlay} failed:\n{result.stderr}"
        _rendered[overlay] = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    return _rendered[overlay]


def find(docs: list[dict], kind: str, name: str) -> dict:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def pod_spec(docs: list[dict], workload: str) -> dict:
    return find(docs, "StatefulSet", workload)["spec"]["template"]["spec"]


def container(docs: list[dict], workload: str, name: str) -> dict:
    matches = [c for c in pod_spec(docs, workload)["containers"] if c["name"] == name]
    assert len(matches) == 1, f"{workload}: expected one container {name!r}"
    return matches[0]


# ------------------------------------------------------------------------------------------------- flags


def parse_flag_lines(text: str) -> list[tuple[str, str | None]]:
    """absl flagfile syntax: one --name[=value] per line; '#' and '//' start comment lines."""
    flags = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", "//")):
            continue
        assert line.startswith("--"), f"flagfile line {raw!r} is not a --flag"
        name, sep, value = line[2:].partition("=")
        flags.append((name, value if sep else None))
    return flags


def mounted_file(docs: list[dict], workload: str, container_spec: dict, path: str) -> tuple[str, str, str]:
    """(ConfigMap name, key, contents) of a file a container reads from a mounted ConfigMap."""
    volumes = {v["name"]: v for v in pod_spec(docs, workload).get("volumes", [])}
    for mount in container_spec.get("volumeMounts", []):
        prefix = mount["mountPath"].rstrip("/") + "/"
        if path.startswith(prefix) and "configMap" in volumes.get(mount["name"], {}):
            config_map = find(docs, "ConfigMap", volumes[mount["name"]]["configMap"]["name"])
            key = path[len(prefix):]
            name = config_map["metadata"]["name"]
            assert key in config_map.get("data", {}), f"{path}: no key {key!r} in ConfigMap {name}"
            return name, key, config_map["data"][key]
    raise AssertionError(f"{workload}/{container_spec['name']}: {path} is not in a mounted ConfigMap")


def container_flags(docs: list[dict], workload: str, container_spec: dict) -> list[tuple[str, str, str | None]]:
    """Every flag the container passes, in order, with flagfiles expanded: (source, name, value)."""
    text = " ".join(container_spec.get("command", [])[1:] + container_spec.get("args", []))
    flags = []

    def expand(source: str, items: list[tuple[str, str | None]]) -> None:
        for name, value in items:
            flags.append((source, name, value))
            if name == "flagfile":
                _, key, contents = mounted_file(docs, workload, container_spec, value or "")
                expand(key, parse_flag_lines(contents))

    expand("command line", [(m.group(1), m.group(2)) for m in FLAG.finditer(text)])
    return flags


def effective(flags: list[tuple[str, str | None, str | None]]) -> dict[str, str | None]:
    """What absl ends up with: the last occurrence of a flag wins."""
    return {name: value for _, name, value in flags if name != "flagfile"}


def unknown_flags(flags: list[tuple[str, str, str | None]], fields: set[str]) -> list[str]:
    known = fields | {"flagfile"}
    return [f"--{name} ({source})" for source, name, _ in flags
            if name not in known and not (name.startswith("no") and name[2:] in known)]


def seed_flags(docs: list[dict]) -> tuple[list, list]:
    return (container_flags(docs, LEARNER, container(docs, LEARNER, "learner")),
            container_flags(docs, ACTOR, container(docs, ACTOR, "actor")))


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


# ------------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_renders_and_validates_strictly(overlay):
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="pip install kubernetes-validate (launch/install_k8s_tools.sh does)")
    docs = render(overlay)
    kinds = sorted((d["kind"], d["metadata"]["name"].rsplit("-", 1)[0] if d["kind"] == "ConfigMap"
                    else d["metadata"]["name"]) for d in docs)
    assert kinds == [("ConfigMap", "seed-flags"), ("Service", ACTOR), ("Service", LEARNER),
                     ("Service", TENSORBOARD), ("StatefulSet", ACTOR), ("StatefulSet", LEARNER)]
    for version in (MIN_K8S_VERSION, kubernetes_validate.latest_version()):
        for doc in docs:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                path = ".".join(str(p) for p in error.path)
                pytest.fail(f"{overlay}: {doc['kind']}/{doc['metadata']['name']} invalid for Kubernetes {version} "
                            f"at {path}: {error.message}")


def test_strict_validation_rejects_unknown_fields():
    """Guards the test above: strict mode must reject a misspelt field, not silently accept it."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")
    learner = json.loads(json.dumps(find(render("cpu"), "StatefulSet", LEARNER)))
    learner["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"grpc": {"port": 8686}}
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(learner, MIN_K8S_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_actor_index_is_the_pod_ordinal(overlay, tmp_path):
    docs = render(overlay)
    actors = find(docs, "StatefulSet", ACTOR)
    assert actors["spec"].get("podManagementPolicy") == "Parallel"
    actor = container(docs, ACTOR, "actor")
    assert actor["command"][:2] == ["/bin/sh", "-c"] and len(actor["args"]) == 1, actor["command"]
    script = actor["args"][0]
    assert "--actor_index=" in script and "##*-}" in script
    # The pod name (seed-actor-<ordinal>) reaches the script through the downward API.
    env = {e["name"]: e for e in actor.get("env", [])}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    # Run the entrypoint (with /bin/sh, as the image does) against a stand-in seed-actor that prints its arguments.
    stub = tmp_path / "seed-actor"
    stub.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    stub.chmod(0o755)
    flagfiles = [f"--flagfile={value}" for name, value in FLAG.findall(script) if name == "flagfile"]
    assert flagfiles

    def run(**variables: str) -> subprocess.CompletedProcess:
        return subprocess.run(["/bin/sh", "-c", script], env={"PATH": f"{tmp_path}:/usr/bin:/bin", **variables},
                              capture_output=True, text=True, timeout=10)

    cases = [({"POD_NAME": f"{ACTOR}-0"}, "0"), ({"POD_NAME": f"{ACTOR}-12", "HOSTNAME": "other-3"}, "12"),
             ({"HOSTNAME": f"{ACTOR}-7"}, "7"), ({"POD_NAME": f"{ACTOR}-5", "ACTOR_INDEX": "9"}, "9")]
    for variables, index in cases:
        result = run(**variables)
        assert result.returncode == 0, result.stderr
        args = result.stdout.split()
        assert args[0] == f"--actor_index={index}", (variables, args)
        assert [a for a in args if a.startswith("--flagfile=")] == flagfiles
    for variables in ({"POD_NAME": "no-ordinal"}, {}):
        result = run(**variables)
        assert result.returncode == 2 and "ACTOR_INDEX" in result.stderr, (variables, result)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_actors_dial_the_learner_service(overlay):
    docs = render(overlay)
    learner_flags, actor_flags = (effective(f) for f in seed_flags(docs))
    service = find(docs, "Service", LEARNER)
    [service_port] = service["spec"]["ports"]
    listen = learner_flags["server_address"]
    assert "," not in listen and not listen.startswith("unix:"), f"learner should listen on one TCP address: {listen}"
    assert service_port["port"] == port_of(listen)
    learner_pod = find(docs, "StatefulSet", LEARNER)["spec"]["template"]
    assert service["spec"]["selector"].items() <= learner_pod["metadata"]["labels"].items()
    [grpc_port] = [p for p in container(docs, LEARNER, "learner")["ports"] if p["name"] == service_port["targetPort"]
                   or p["containerPort"] == service_port["targetPort"]]
    assert grpc_port["containerPort"] == port_of(listen)
    assert actor_flags["server_address"] == f"{service['metadata']['name']}:{service_port['port']}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_resources(overlay):
    docs = render(overlay)
    gpus, _ = OVERLAYS[overlay]
    for workload in (LEARNER, ACTOR):
        for c in pod_spec(docs, workload)["containers"]:
            resources = c.get("resources", {})
            assert resources.get("requests", {}).get("cpu"), f"{workload}/{c['name']}: no CPU request"
            assert resources.get("limits", {}).get("memory"), f"{workload}/{c['name']}: no memory limit"
            if (workload, c["name"]) != (LEARNER, "learner"):
                assert "nvidia.com/gpu" not in resources.get("limits", {}), f"{workload}/{c['name']} takes a GPU"
    learner = container(docs, LEARNER, "learner")
    spec = pod_spec(docs, LEARNER)
    if gpus:
        assert int(learner["resources"]["limits"]["nvidia.com/gpu"]) == gpus
        assert learner["image"].endswith(":cuda")
        assert spec.get("nodeSelector") and any(t.get("key") == "nvidia.com/gpu" for t in spec.get("tolerations", []))
    else:
        assert "nvidia.com/gpu" not in learner["resources"].get("limits", {})
        assert learner["image"].endswith(":cpu")
    assert container(docs, ACTOR, "actor")["image"].endswith(":cpu"), "actors need no CUDA image"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_learner_probes_and_shutdown(overlay):
    docs = render(overlay)
    learner_set = find(docs, "StatefulSet", LEARNER)
    assert learner_set["spec"]["replicas"] == 1
    port = port_of(effective(seed_flags(docs)[0])["server_address"])
    learner = container(docs, LEARNER, "learner")
    readiness, liveness = learner.get("readinessProbe", {}), learner.get("livenessProbe", {})
    assert readiness.get("grpc") == {"port": port, "service": "seed.Learner"}, readiness
    assert liveness.get("grpc", {}).get("port") == port, liveness
    assert liveness["grpc"].get("service", "") in ("", "seed.Learner")
    startup = learner.get("startupProbe")
    if startup:
        assert startup["grpc"]["port"] == port
    assert learner_set["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 30


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_logdir_is_on_a_persistent_volume_that_tensorboard_reads(overlay):
    docs = render(overlay)
    learner_set = find(docs, "StatefulSet", LEARNER)
    claims = {t["metadata"]["name"] for t in learner_set["spec"].get("volumeClaimTemplates", [])}
    claims |= {v["name"] for v in pod_spec(docs, LEARNER).get("volumes", []) if "persistentVolumeClaim" in v}
    logdir = effective(seed_flags(docs)[0])["logdir"]

    def volume_for(c: dict, path: str) -> str:
        for mount in c.get("volumeMounts", []):
            if path == mount["mountPath"] or path.startswith(mount["mountPath"].rstrip("/") + "/"):
                return mount["name"]
        raise AssertionError(f"{c['name']}: {path} is not on a mounted volume")

    learner_volume = volume_for(container(docs, LEARNER, "learner"), logdir)
    assert learner_volume in claims, f"--logdir={logdir} is on volume {learner_volume}, not a PersistentVolumeClaim"
    tensorboard = container(docs, LEARNER, "tensorboard")
    tb_logdir = dict(FLAG.findall(" ".join(tensorboard["command"] + tensorboard.get("args", []))))["logdir"]
    assert volume_for(tensorboard, tb_logdir) == learner_volume and logdir.startswith(tb_logdir)
    service = find(docs, "Service", TENSORBOARD)
    [port] = service["spec"]["ports"]
    assert port["port"] == 6006
    assert any(p["name"] == port["targetPort"] and p["containerPort"] == 6006 for p in tensorboard["ports"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_flag_is_a_real_flag(overlay):
    docs = render(overlay)
    learner_flags, actor_flags = seed_flags(docs)
    assert not unknown_flags(learner_flags, LEARNER_FIELDS), "not seed-learner flags"
    assert not unknown_flags(actor_flags, ACTOR_FIELDS), "not seed-actor flags"
    # Both roles read env.flags, so it must hold only env options (which both define identically).
    env_files = {source for source, *_ in learner_flags} & {source for source, *_ in actor_flags} - {"command line"}
    assert env_files, "learner and actors share no flagfile for the env flags"
    shared = [(source, name) for source, name, _ in learner_flags + actor_flags if source in env_files]
    assert all(name in ENV_FIELDS for _, name in shared), f"non-env flags in a shared flagfile: {shared}"
    # Each ConfigMap key is read by someone (no forgotten, stale file).
    [config_map] = [d for d in docs if d["kind"] == "ConfigMap"]
    read = {source for source, *_ in learner_flags + actor_flags}
    assert set(config_map["data"]) <= read, f"unread flagfiles: {set(config_map['data']) - read}"
    # Overlay-specific values.
    learner = effective(learner_flags)
    gpus, devices = OVERLAYS[overlay]
    training = learner.get("training_devices") or learner["training_device"]
    assert (learner["inference_device"], training) == devices
    needed = max([int(d.split(":")[1]) + 1 for d in ",".join(devices).split(",") if d.startswith("cuda")], default=0)
    assert needed <= gpus
    replicas = find(docs, "StatefulSet", ACTOR)["spec"]["replicas"]
    assert int(learner["num_actors"]) >= replicas, "the learner would reject actors beyond --num_actors"


def test_stale_flags_are_detected():
    """The checker used above names a flag that no longer exists (a defect the original SEED manifests had)."""
    flags = [("learner.flags", "num_actors", "4"), ("learner.flags", "nouse_lstm", None),
             ("learner.flags", "inference_batch", "8"), ("command line", "flagfile", "/x")]
    assert unknown_flags(flags, LEARNER_FIELDS) == ["--inference_batch (learner.flags)"]


_PARSE_ACTOR = """
import dataclasses, json, sys
from absl import flags
from seed.config import actor_config_class, build_config, define_flags, explicit_flags
config_class = actor_config_class()
define_flags(config_class)
flags.FLAGS(sys.argv)
print(json.dumps(dataclasses.asdict(build_config(config_class, explicit_flags(config_class, flags.FLAGS)))))
"""


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_flags_parse_with_absl(overlay, tmp_path):
    """Feeds the rendered flagfiles to the real flag parsers: `seed-learner --print_config` and the actor's."""
    docs = render(overlay)

    def command_line(workload: str, name: str) -> list[str]:
        c = container(docs, workload, name)
        args = []
        for flag_name, value in FLAG.findall(" ".join(c.get("command", [])[1:] + c.get("args", []))):
            if flag_name == "flagfile":
                _, key, contents = mounted_file(docs, workload, c, value)
                (tmp_path / key).write_text(contents)
                value = str(tmp_path / key)
            elif flag_name == "actor_index":
                value = "3"
            args.append(f"--{flag_name}={value}")
        return args

    learner_command = [sys.executable, "-m", "seed.learner.main", *command_line(LEARNER, "learner"), "--print_config"]
    learner_run = subprocess.run(learner_command, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert learner_run.returncode == 0, learner_run.stderr[-3000:]
    learner = json.loads(learner_run.stdout)
    actor_run = subprocess.run([sys.executable, "-c", _PARSE_ACTOR, *command_line(ACTOR, "actor")],
                               capture_output=True, text=True, cwd=REPO, timeout=60)
    assert actor_run.returncode == 0, actor_run.stderr[-3000:]
    actor = json.loads(actor_run.stdout)
    assert actor["actor_index"] == 3
    mismatched = {name: (learner[name], actor[name]) for name in ENV_FIELDS if learner[name] != actor[name]}
    assert not mismatched, f"learner and actors would build different envs: {mismatched}"
    assert learner["num_actors"] >= find(docs, "StatefulSet", ACTOR)["spec"]["replicas"]
    assert learner["logdir"].startswith("/logdir/")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_learner_listens_on_every_interface_only_with_the_token_from_a_secret(overlay):
    """The learner binds 0.0.0.0 explicitly (it refuses a non-loopback address without credentials); learner and
    actors read the same token file from the same Secret, never a token on the command line or in a ConfigMap."""
    docs = render(overlay)
    learner_flags, actor_flags = (effective(f) for f in seed_flags(docs))
    assert learner_flags["server_address"].startswith("0.0.0.0:")
    assert "allow_insecure_remote" not in learner_flags
    secrets = set()
    for workload, name, flags in ((LEARNER, "learner", learner_flags), (ACTOR, "actor", actor_flags)):
        assert "auth_token" not in flags, f"{workload}: the token itself must not be a flag"
        path = flags["auth_token_file"]
        volumes = {v["name"]: v for v in pod_spec(docs, workload)["volumes"]}
        [mount] = [m for m in container(docs, workload, name)["volumeMounts"]
                   if path.startswith(m["mountPath"].rstrip("/") + "/")]
        secret = volumes[mount["name"]]["secret"]
        assert mount.get("readOnly") and path[len(mount["mountPath"].rstrip("/")) + 1:] == "token"
        assert secret["defaultMode"] & 0o007 == 0, "the token must not be world-readable"
        assert pod_spec(docs, workload)["securityContext"].get("fsGroup"), f"{workload}: no fsGroup to read it"
        secrets.add(secret["secretName"])
    assert secrets == {"seed-auth"}
