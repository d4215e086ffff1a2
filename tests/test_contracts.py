"""Data contracts have one home: each record is defined once (seed/contracts.py, seed/contracts/training.py); the
modules of seed/, agents/ and envs/ import each other without a cycle, and no import runs up or sideways between
the rooms of LAYERS (deferred imports inside functions count: they hide a dependency rather than remove it)."""

from __future__ import annotations

import ast
import os

from tests.conftest import REPO

# Installed package name -> source directory (setup.py's package_dir).
ROOTS = {"seed.agents": "agents", "seed.envs": "envs", "seed": "seed"}
CONTRACTS = {"State": "seed.contracts.inference", "InferenceBatch": "seed.contracts.inference",
             "ActOutput": "seed.contracts.inference", "FinishedEpisodes": "seed.contracts.inference",
             "Agent": "seed.contracts.agent", "UpdateStep": "seed.contracts.agent",
             "UpdateOutput": "seed.contracts.agent", "Unroll": "seed.contracts.training",
             "TrainingBatch": "seed.contracts.training", "LossOutput": "seed.contracts.training"}


def _modules() -> dict[str, str]:
    """Module name -> source path, for every module of the runtime (the generated stubs aside)."""
    modules = {}
    for package, directory in ROOTS.items():
        for root, dirs, files in os.walk(os.path.join(REPO, directory)):
            dirs[:] = [d for d in dirs if d not in ("__pycache__", "_proto")]
            for name in files:
                if not name.endswith(".py"):
                    continue
                parts = os.path.relpath(os.path.join(root, name), os.path.join(REPO, directory))[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                modules[".".join([package, *parts])] = os.path.join(root, name)
    return modules


def _imports(path: str, modules: dict[str, str]) -> set[str]:
    """The runtime modules `path` imports, at any depth (TYPE_CHECKING blocks aside)."""
    tree = ast.parse(open(path).read())
    type_checking = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
                     and ast.unparse(block.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
                     for node in ast.walk(block)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in type_checking:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(name for name in names if name in modules)
    return found


def test_runtime_modules_import_each_other_without_a_cycle():
    modules = _modules()
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
    # A package imports its parents' __init__ implicitly; that is no cycle of ours.
    for name in graph:
        graph[name] = {m for m in graph[name] if not name.startswith(m + ".")}
    state, stack, cycles = {}, [], []

    def visit(name: str) -> None:
        state[name] = "open"
        stack.append(name)
        for other in sorted(graph[name]):
            if state.get(other) == "open":
                cycles.append(" -> ".join(stack[stack.index(other):] + [other]))
            elif other not in state:
                visit(other)
        stack.pop()
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name)
    assert not cycles, f"import cycles: got {cycles}, expected none"


def test_every_contract_is_defined_once_where_it_belongs():
    definitions: dict[str, list[str]] = {name: [] for name in CONTRACTS}
    for module, path in _modules().items():
        for node in ast.parse(open(path).read()).body:
            if isinstance(node, ast.ClassDef):
                names = [node.name]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
            else:
                continue
            for name in names:
                if name in definitions:
                    definitions[name].append(module)
    wrong = {name: where for name, where in definitions.items() if where != [CONTRACTS[name]]}
    assert not wrong, f"contracts defined in: got {wrong}, expected {CONTRACTS}"


# The layers, lowest first: a module imports its own room, and rooms of a lower layer only. Rooms that share a layer
# do not import each other (the learner wires inference to experience; nothing wires the learner to an actor).
LAYERS: list[tuple[str, ...]] = [
    ("seed.runtime", "seed.envs"),  # plumbing (threads, host memory, checkpoint files, graph lock); env families
    ("seed.config",),  # the flags: the framework's, composed with each env family's own (the generated stubs beside)
    ("seed.contracts",),  # the records and the Agent contract (EnvSpec for their type hints)
    ("seed.agents", "seed.presets"),  # plug-ins; named flag values
    ("seed.transport",),
    ("seed.serving",),
    ("seed.inference", "seed.experience"),  # the unroll store lives with its writer, central inference
    ("seed.metrics", "seed.training"),
    ("seed.learner", "seed.actor"),  # seed/learner/configuration.py resolves the flags; main.py only runs them
    ("seed.evaluate", "seed.local_launcher"),  # entry points beside the two roles
    ("seed.bench",),  # seed-bench and seed-report: nothing imports them
]
# Narrower than its layer: the contracts import nothing of seed but the env spec, so every room can import them.
ONLY = {"seed.contracts": ("seed.envs.base",)}
# Imports a room may make against the layers, each with its reason (deferred imports inside functions count: they
# hide a dependency rather than remove it). Keep this empty unless a reason holds.
EXCEPTIONS: dict[tuple[str, str], str] = {}


def _room(module: str) -> tuple[str, int] | None:
    """(room, layer index) of `module`: the longest room name that is `module` or a package above it."""
    rooms = [(room, index) for index, layer in enumerate(LAYERS) for room in layer
             if module == room or module.startswith(room + ".")]
    return max(rooms, key=lambda r: len(r[0]), default=None)


def _upward(modules: dict[str, str]) -> list[str]:
    """Every import of one room into a room that is not below it, as 'module (room, layer) imports module
    (room, layer)'."""
    found = []
    for name, path in sorted(modules.items()):
        own = _room(name)
        if own is None:
            continue
        for imported in sorted(_imports(path, modules)):
            other = _room(imported)
            if other is None or other[0] == own[0] or (name, imported) in EXCEPTIONS:
                continue
            narrowed = ONLY.get(own[0])
            allowed = (other[1] < own[1] and (narrowed is None or any(
                imported == m or imported.startswith(m + ".") for m in narrowed)))
            if not allowed:
                found.append(f"{name} ({own[0]}, layer {own[1]}) imports {imported} ({other[0]}, layer {other[1]})")
    return found


def test_every_module_of_seed_has_a_layer():
    # The package roots themselves (seed, seed.agents, seed.envs) hold no code of a room.
    homeless = sorted(name for name in _modules() if _room(name) is None and name != "seed")
    assert not homeless, f"modules in no layer: got {homeless}, expected each under a room of LAYERS"


def test_nothing_imports_upward():
    upward = _upward(_modules())
    assert not upward, "imports that run upward or sideways (see LAYERS):\n" + "\n".join(upward)


def test_the_rule_catches_an_upward_and_a_sideways_import(tmp_path):
    """A deliberate mistake of each kind, in modules written for the purpose, is reported with both rooms."""
    modules = {}
    for name, source in [("seed.runtime.bad", "from seed.learner import builder\n"),
                         ("seed.experience.bad", "def f():\n    import seed.inference.central\n"),
                         ("seed.contracts.bad", "from seed.config import LearnerConfig\n"),
                         ("seed.learner.good", "from seed.runtime import checkpoint\n"),
                         ("seed.learner.builder", ""), ("seed.inference.central", ""), ("seed.config", ""),
                         ("seed.runtime.checkpoint", "")]:
        modules[name] = str(tmp_path / f"{name}.py")
        with open(modules[name], "w") as f:
            f.write(source)
    assert _upward(modules) == [
        "seed.contracts.bad (seed.contracts, layer 2) imports seed.config (seed.config, layer 1)",
        "seed.experience.bad (seed.experience, layer 6) imports seed.inference.central (seed.inference, layer 6)",
        "seed.runtime.bad (seed.runtime, layer 0) imports seed.learner.builder (seed.learner, layer 8)",
    ]
    assert _room("seed.agents.muzero.reanalysis") == ("seed.agents", 3)
    assert _room("seed.configuration_x") is None  # a name that only starts like a room is in none


def test_only_the_entry_point_runs_the_learner_script():
    """seed/learner/main.py is `seed-learner`; what other modules need of it lives in seed/learner/configuration.py."""
    modules = _modules()
    importers = sorted(name for name, path in modules.items() if "seed.learner.main" in _imports(path, modules))
    assert importers == [], f"modules importing seed.learner.main: got {importers}, expected none"
