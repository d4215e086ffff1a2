#!/usr/bin/env python3
"""Writes tests/data/file_durations.json (seconds per test file) from a pytest junit XML report, for the order
tests/conftest.py gives the files: the longest first, so the last files the xdist workers take are short ones.

    python -m pytest -n 2 --dist loadfile --junitxml=/tmp/junit.xml tests
    python launch/test_durations.py /tmp/junit.xml
"""

import collections
import json
import os
import sys
import xml.etree.ElementTree as ElementTree

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "data",
                   "file_durations.json")


def file_durations(junit_path: str) -> dict[str, float]:
    seconds: collections.Counter = collections.Counter()
    for case in ElementTree.parse(junit_path).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")  # tests.test_x (or tests.test_x.TestClass)
        path = "/".join(parts[:next(i for i, part in enumerate(parts) if part.startswith("test_")) + 1]) + ".py"
        seconds[path] += float(case.get("time", 0.0))
    return {name: round(value, 1) for name, value in seconds.most_common()}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} JUNIT_XML")
    durations = file_durations(sys.argv[1])
    with open(OUT, "w") as f:
        json.dump(durations, f, indent=1)
        f.write("\n")
    print(f"{OUT}: {len(durations)} files, {sum(durations.values()):.0f} s in all")
