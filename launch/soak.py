#!/usr/bin/env python3
"""The soak test: V-trace under repeated faults, measured.

    launch/soak.py --duration_s=600 --out=docs/reliability/soak-600s.json     # processes (seed/bench/soak.py)
    launch/soak.py --duration_s=180 --out=/tmp/soak.json                      # the CI version
    launch/soak.py --hosts=netns --duration_s=1800 \\
        --out=docs/reliability/soak-netns-1800s.json                          # hosts (seed/bench/soak_netns.py)

--hosts=netns puts the learner and actor groups on hosts in network namespaces (needs root) and injects network
faults: partitions, packet loss, an actor host powered off, the learner's host killed and restarted.
"""

import sys

if __name__ == "__main__":
    hosts = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--hosts=")]
    if hosts and hosts[-1] == "netns":
        from seed.bench.soak_netns import run
    else:  # --hosts=local (or anything else, which soak_netns's flag would refuse) is the one-host soak
        if hosts and hosts[-1] != "local":
            print(f"launch/soak.py: --hosts: got {hosts[-1]!r}, expected local or netns", file=sys.stderr)
            sys.exit(2)
        sys.argv = [a for a in sys.argv if not a.startswith("--hosts=")]
        from seed.bench.soak import run
    run()
