"""Data contracts have one home: each record is defined once (seed/contracts.py, seed/contracts/training.py) and the
modules of seed/, agents/ and envs/ import each other without a cycle (deferred imports inside functions
count: they hide a cycle rather than remove it)."""

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


# Who may import whom (the layers, lowest first): the contracts and the configuration import no other part of seed;
# env families import only env code; agents import the contracts, the configuration, env specs and each other; the
# framework's role folders import all of those, never an agent's package (they reach agents through the registry).
ALLOWED_IMPORTS = {
    "seed.config": ("seed.config",),
    "seed.contracts": ("seed.contracts", "seed.envs.base"),
    "seed.envs": ("seed.envs", "seed.config", "seed._proto"),
    "seed.agents": ("seed.agents", "seed.config", "seed.contracts", "seed.envs"),
}


def _layer(module: str) -> str | None:
    return next((layer for layer in sorted(ALLOWED_IMPORTS, key=len, reverse=True)
                 if module == layer or module.startswith(layer + ".")), None)


def test_nothing_imports_upward():
    modules = _modules()
    upward = []
    for name, path in modules.items():
        layer = _layer(name)
        if layer is None:
            continue
        for imported in sorted(_imports(path, modules)):
            if not any(imported == allowed or imported.startswith(allowed + ".") for allowed in ALLOWED_IMPORTS[layer]):
                upward.append(f"{name} imports {imported}")
    assert not upward, "\n".join(upward)
    # The rule would catch an agent reaching into the framework.
    assert _layer("seed.agents.muzero.reanalysis") == "seed.agents"
    assert not any("seed.training.update".startswith(a) for a in ALLOWED_IMPORTS["seed.agents"])
