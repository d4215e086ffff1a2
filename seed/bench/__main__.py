"""`python -m seed.bench` is `seed-bench`."""

from seed.bench.cli import run

run()
