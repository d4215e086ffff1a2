"""A scheduler lab on three network-namespace hosts, for the Slurm and Ray tests: made, started, and removed
after, also on failure (the lab's daemons, the hosts, the temp directory), checking that no host of it is left."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from seed.bench.netns_hosts import NetnsHosts, why_no_namespaces


def lab_on_namespace_hosts(why_not: Callable[[], str | None], name: str, make_lab: Callable[[NetnsHosts, str], Any],
                           **mkdtemp: str) -> Iterator[Any]:
    """Yields `make_lab(hosts, directory)` started (its `start()`, then `stop()` after), on 3 hosts named
    `<name><pid>-1..3`; skips with the reason when namespaces or `why_not()` say the lab cannot run here."""
    reason = why_no_namespaces() or why_not()
    if reason:
        pytest.skip(reason)
    directory = tempfile.mkdtemp(**mkdtemp)
    hosts = NetnsHosts(f"{name}{os.getpid() % 100000}", 3, directory)
    try:
        try:
            hosts.create()
        except RuntimeError as error:
            pytest.skip(f"cannot make network namespaces: {error}")
        made = make_lab(hosts, directory)
        try:
            made.start()
            yield made
        finally:
            made.stop()
    finally:
        hosts.destroy()
        shutil.rmtree(directory, ignore_errors=True)
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert not [line for line in left.splitlines() if line.startswith(f"{hosts.name}-")], left
