"""Prints the requirements the CPU image installs besides torch, one a line, read from the project's own files:
setup.py's install_requires and its `atari` extra (the image runs `pip install ".[atari]"`), and pyproject.toml's
[build-system] requires (pip builds the project from the context in an isolated environment made of these).
launch/docker/offline_base.sh downloads them into the offline build's wheelhouse.

    python launch/docker/image_requirements.py [REPOSITORY_ROOT]

setup.py is read, not run (running it generates the gRPC stubs); its one computed value, the GRPC pin that the
f-strings use, is taken from its `GRPC = "..."` line. Runs on Python 3.10+ (no tomllib needed)."""

from __future__ import annotations

import ast
import os
import re
import sys

EXTRAS = ("atari",)


def _strings(node: ast.AST, names: dict[str, str]) -> list[str]:
    """The strings of a list literal whose items are literals or f-strings of module-level names."""
    out = []
    for item in node.elts:
        if isinstance(item, ast.Constant):
            out.append(item.value)
        else:
            out.append("".join(part.value if isinstance(part, ast.Constant) else names[part.value.id]
                               for part in item.values))
    return out


def requirements(root: str) -> list[str]:
    with open(os.path.join(root, "setup.py")) as f:
        tree = ast.parse(f.read())
    names = {node.targets[0].id: node.value.value for node in tree.body
             if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
             and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}
    setup = next(node.value for node in tree.body if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                 and getattr(node.value.func, "id", "") == "setup")
    keywords = {keyword.arg: keyword.value for keyword in setup.keywords}
    found = _strings(keywords["install_requires"], names)
    extras = {key.value: value for key, value in zip(keywords["extras_require"].keys,
                                                      keywords["extras_require"].values, strict=True)}
    for extra in EXTRAS:
        found += _strings(extras[extra], names)
    with open(os.path.join(root, "pyproject.toml")) as f:
        build = re.search(r"^requires\s*=\s*\[(.*?)\]", f.read(), re.M | re.S)
    found += re.findall(r'"([^"]+)"', build.group(1))
    return [requirement for requirement in dict.fromkeys(found) if not re.match(r"torch\b", requirement)]


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1] if len(sys.argv) > 1 else os.getcwd())))
