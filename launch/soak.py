#!/usr/bin/env python3
"""The soak test (seed/bench/soak.py): V-trace on CartPole and fake:atari under repeated faults, measured.

    launch/soak.py --duration_s=600 --out=docs/reliability/soak-600s.json
    launch/soak.py --duration_s=180 --out=/tmp/soak.json      # the CI version
"""

from seed.bench.soak import run

if __name__ == "__main__":
    run()
