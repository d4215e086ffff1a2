"""A TCP relay that adds a fixed one-way delay (and optionally a rate limit) to every byte it forwards.

    python -m seed.bench.tcp_relay --listen=10.213.0.3:8686 --target=10.213.0.1:8686 --delay_ms=2.5

Kernels without the netem qdisc cannot delay packets; this relay, run on a host between actors and the learner
(launch/netns.sh), delays the byte stream instead: each chunk read on one side is written to the other
`delay_ms` after it was read, so the added round trip is 2 x delay_ms. With `rate_mbit` each direction is also
paced to that rate. TLS and the token pass through untouched (the relay never looks into the bytes). One asyncio
loop, two tasks per direction (a reader that stamps chunks, a writer that releases them when due).
"""

from __future__ import annotations

import asyncio
import collections
import time

from absl import app, flags

CHUNK_BYTES = 1 << 16


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float, rate_bps: float) -> None:
    """Forwards reader -> writer, each chunk `delay_s` after it was read, paced to `rate_bps` bits/s (0 = no limit)."""
    pending: collections.deque[tuple[float, bytes]] = collections.deque()
    arrived = asyncio.Event()
    closed = False

    async def read() -> None:
        nonlocal closed
        try:
            while data := await reader.read(CHUNK_BYTES):
                pending.append((time.monotonic() + delay_s, data))
                arrived.set()
        except ConnectionError:
            pass
        closed = True
        arrived.set()

    async def write() -> None:
        free_at = time.monotonic()  # when the paced link can take the next byte
        while True:
            if not pending:
                if closed:
                    break
                arrived.clear()
                await arrived.wait()
                continue
            due, data = pending[0]
            wait = max(due, free_at) - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            pending.popleft()
            writer.write(data)
            await writer.drain()
            if rate_bps:
                free_at = max(free_at, time.monotonic()) + len(data) * 8 / rate_bps
        writer.close()

    await asyncio.gather(read(), write(), return_exceptions=True)


async def serve(listen: str, target: str, delay_ms: float, rate_mbit: float = 0.0) -> asyncio.Server:
    """Starts the relay (host:port each); returns the asyncio server (already serving)."""
    target_host, target_port = target.rsplit(":", 1)
    delay_s, rate_bps = delay_ms / 1e3, rate_mbit * 1e6

    async def on_client(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection(target_host, int(target_port))
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(_pipe(client_reader, server_writer, delay_s, rate_bps),
                             _pipe(server_reader, client_writer, delay_s, rate_bps))

    host, port = listen.rsplit(":", 1)
    return await asyncio.start_server(on_client, host, int(port))


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if FLAGS.delay_ms < 0 or FLAGS.rate_mbit < 0:
        raise app.UsageError(f"--delay_ms, --rate_mbit: got {FLAGS.delay_ms}, {FLAGS.rate_mbit}, expected >= 0")

    async def forever() -> None:
        server = await serve(FLAGS.listen, FLAGS.target, FLAGS.delay_ms, FLAGS.rate_mbit)
        print(f"[relay] {FLAGS.listen} -> {FLAGS.target}, +{FLAGS.delay_ms} ms each way"
              f"{f', {FLAGS.rate_mbit} Mbit/s' if FLAGS.rate_mbit else ''}", flush=True)
        async with server:
            await server.serve_forever()

    asyncio.run(forever())


FLAGS = flags.FLAGS

if __name__ == "__main__":
    flags.DEFINE_string("listen", "", "host:port to accept connections on.")
    flags.DEFINE_string("target", "", "host:port of the learner.")
    flags.DEFINE_float("delay_ms", 0.0, "One-way delay added to each direction, ms (the round trip grows 2x this).")
    flags.DEFINE_float("rate_mbit", 0.0, "Rate limit of each direction, Mbit/s; 0 = none.")
    app.run(main)
