"""Every preset resolves as it did when tests/data/preset_configs.json was written: the configuration
`seed-learner --preset=NAME --print_config` prints, for every preset of seed/presets.py.

A change to a preset, to a default or to the resolution shows here as the fields that moved. When the change is
meant, regenerate the file and read its diff:

    python3 -m tests.test_preset_configs   # rewrites tests/data/preset_configs.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from seed.config import to_json
from seed.learner.configuration import resolve_config
from seed.presets import PRESETS
from tests.conftest import REPO

GOLDEN = os.path.join(REPO, "tests", "data", "preset_configs.json")


def print_config(name: str) -> str:
    """What `seed-learner --preset=NAME --print_config` prints (seed/learner/main.py's `main`), in process."""
    config = resolve_config({"preset": name, "print_config": True})
    extra = type(config).agent_class.describe_config(config)
    return to_json(config, {"num_envs": config.num_envs, **extra})


def resolved_presets() -> dict[str, Any]:
    """Preset name -> its printed configuration (parsed), for every preset."""
    return {name: json.loads(print_config(name)) for name in sorted(PRESETS)}


def test_every_preset_resolves_as_before():
    with open(GOLDEN) as f:
        golden = json.load(f)
    resolved = resolved_presets()
    assert sorted(resolved) == sorted(golden), "presets: got a different set than tests/data/preset_configs.json"
    changed = []
    for name in sorted(golden):
        for key in sorted(set(golden[name]) | set(resolved[name])):
            was, now = golden[name].get(key, "<absent>"), resolved[name].get(key, "<absent>")
            if was != now:
                changed.append(f"{name}.{key}: got {now!r}, expected {was!r}")
    assert not changed, "presets resolve differently:\n" + "\n".join(changed)


def test_the_command_line_prints_the_same_configuration():
    """The in-process helper above is what the command prints (one preset: a process costs seconds)."""
    out = subprocess.run([sys.executable, "-m", "seed.learner.main", "--preset=cartpole_ppo", "--print_config"],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == json.loads(print_config("cartpole_ppo"))


if __name__ == "__main__":
    with open(GOLDEN, "w") as f:
        json.dump(resolved_presets(), f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {GOLDEN} ({len(PRESETS)} presets)")
