"""A learner that comes back at another address under the same name (a container restarted on its network, a job
rescheduled onto another node): every actor streams to it again within 5 s of it listening.

The name is real: each actor host's /etc/hosts (launch/netns.sh hosts; `ip netns exec` mounts it over /etc/hosts)
names the learner, and is rewritten in place while the actors run, as a container network's DNS (aardvark-dns)
drops a stopped container's name and gives it the new container's address. Meanwhile the actors' DNS server (host
1, once its learner is gone) drops every query, as aardvark-dns drops those that arrive while it reloads.

A gRPC channel re-resolves its name at most every 30 s (and backs off after a failed lookup), so an actor that
kept its channel found the new address 21-40 s late: the actor dials on a fresh channel after each failed attempt
(seed/actor/loop.py, Actor._wait_for_learner). A lookup whose query is lost waited 11 s for c-ares' retries: it is
given up after 2 s (seed/transport/grpc/channel.py, DNS_QUERY_TIMEOUT_MS)."""

from __future__ import annotations

import time

from seed.runtime import checkpoint
from tests.conftest import assert_resumed, read_metrics, wait_for
from tests.netns import PORT, RemoteRun, hosts_fixture  # noqa: F401 - the `hosts` fixture

NAME = "seed-learner"
STEP_TIMEOUT_S = 90  # a learner's start (torch import, serving process) on a busy 2-core machine included
REJOIN_BOUND_S = 5.0  # what issue 60 asks for; measured here: 0.3-1.5 s


def _connections(hosts, actor) -> int:
    return hosts.output(actor).count("] connected to ")


def test_actors_follow_the_learner_name_to_a_new_address_within_5s(hosts, tmp_path):
    run = RemoteRun(hosts, str(tmp_path), num_actors=2)
    hosts.set_hosts(2, {NAME: hosts.addr(1)})
    # Host 2 asks host 1 for names that its /etc/hosts lacks (`ip netns exec` mounts this file too; the fixture's
    # destroy removes /etc/netns/NAME-2).
    with open(f"/etc/netns/{hosts.name}-2/resolv.conf", "w") as f:
        f.write(f"nameserver {hosts.addr(1)}\n")
    first = run.start_learner("learner1", host=1)
    # Two actors on host 2, dialling the name; the learner moves from host 1 to host 3.
    actors = [run.start_actor(host=2, index=0, server_address=f"{NAME}:{PORT}")]
    wait_for(lambda: run.train_steps() > 5, STEP_TIMEOUT_S, "training through the name", on_timeout=run.logs)
    assert f"connected to {NAME}:{PORT} over grpc" in hosts.output(actors[0])
    actors.append(run.start_actor(host=2, index=1, server_address=f"{NAME}:{PORT}"))
    wait_for(lambda: _connections(hosts, actors[1]) == 1, STEP_TIMEOUT_S, "the second actor", on_timeout=run.logs)

    run.stop_learner(first)  # SIGTERM: the final checkpoint
    saved = checkpoint.latest(run.logdir)
    assert saved is not None
    rows_before = len(read_metrics(run.logdir))
    # No one has the name while no learner runs (aardvark-dns drops a stopped container's); the actors' lookups
    # fail meanwhile. Then the name points at host 3, where the new learner starts on the same logdir.
    hosts.set_hosts(2, {})
    hosts.loss(1, 100)  # the DNS server drops every query: a lookup waits for its timeout
    for actor in actors:
        wait_for(lambda a=actor: "learner unavailable" in hosts.output(a), 30, "the actors to lose the learner",
                 on_timeout=run.logs)
    time.sleep(3)
    hosts.set_hosts(2, {NAME: hosts.addr(3)})
    second = run.start_learner("learner2", host=3)
    listening = wait_for(lambda: "listening on" in hosts.output(second) and time.monotonic(), STEP_TIMEOUT_S,
                         "the new learner to listen", interval_s=0.05, on_timeout=run.logs)
    rejoined = {}
    deadline = listening + 30
    while len(rejoined) < len(actors) and time.monotonic() < deadline:
        for index, actor in enumerate(actors):
            if index not in rejoined and _connections(hosts, actor) >= 2:
                rejoined[index] = max(0.0, time.monotonic() - listening)
        time.sleep(0.05)
    print(f"seconds from the new learner listening to each actor streaming: {rejoined}")
    assert sorted(rejoined) == [0, 1], (rejoined, run.logs())
    assert max(rejoined.values()) <= REJOIN_BOUND_S, (rejoined, run.logs())
    for actor in actors:  # the same processes, on the new address
        assert actor.poll() is None
        assert f"connected to {NAME}:{PORT} over grpc" in hosts.output(actor).rsplit("learner unavailable", 1)[1]
    wait_for(lambda: len(read_metrics(run.logdir)) > rows_before and
             run.train_steps() > saved[1]["counters"]["train_steps"] + 5, STEP_TIMEOUT_S,
             "training on the moved learner", on_timeout=run.logs)
    assert_resumed(hosts.output(second), run.logdir, saved, rows_before)
    run.stop_learner(second)
