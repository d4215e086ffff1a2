"""A process that has loaded torch spends about a second of CPU tearing its interpreter down at exit, most of it
the garbage collector walking torch's objects while the modules are cleared: `python -c "import torch"` takes
3.5 s of wall time against 2.2 s when it exits at once (2-core VM, torch 2.13 CPU).

`freeze_objects_at_exit` registers `gc.freeze()` as the process's first atexit handler, so it runs last, after
every other handler (atexit runs them last-in first-out): the collections during teardown then skip every object
alive at that point. Nothing is skipped that an exit must do: atexit handlers, flushes and finalizers still run,
and memory goes back to the system with the process. Measured: 3.5 -> 2.6 s for that one-liner.
"""

from __future__ import annotations

import atexit
import gc


def freeze_objects_at_exit() -> None:
    """Call first thing in an entry point (seed-learner, seed-actor, seed-eval, seed-bench, seed-report)."""
    atexit.register(gc.freeze)
