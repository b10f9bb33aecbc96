"""Deliveries per second from a replicated (quorum) queue on three local broker nodes (one etcd),
publisher and consumer on the leader a, 100-byte persistent messages:

- backlog: N messages published with confirms first, then one consumer (prefetch P, acks
  batched per socket read) drains them; deliveries/s over the drain;
- live: one publisher (confirm window 256) and one consumer (prefetch P) together for D s;
  confirmed/s and delivered/s.

Run with PYTHONPATH pointing at the build to measure (the nodes inherit it):
`PYTHONPATH=$PWD python -m interop_tests.replicated_delivery_rate [N [PREFETCH [SECONDS]]]`.
A measurement, not a test (timing targets live in benchmarks); docs/replication.md has figures.
"""

import asyncio
import sys
import tempfile
import time
from pathlib import Path

from bench.lean_client import LeanConnection
from interop_tests.cluster_nodes import three_nodes

N = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
PREFETCH = int(sys.argv[2]) if len(sys.argv) > 2 else 100
DURATION = float(sys.argv[3]) if len(sys.argv) > 3 else 5.0
BODY = b"x" * 100


async def publish(url: str, queue: str, count: int | None, until: float | None, window: int = 256) -> int:
    conn = await LeanConnection.open(url)
    ch = await conn.channel()
    confirmed = 0
    free = asyncio.Semaphore(window)

    def on_confirm(tag: int, multiple: bool, ack: bool) -> None:
        nonlocal confirmed
        released = tag - confirmed if multiple else 1
        confirmed = tag if multiple else confirmed + 1
        for _ in range(released):
            free.release()

    await ch.confirm_select(on_confirm)
    sent = 0
    while (count is None or sent < count) and (until is None or time.monotonic() < until):
        await free.acquire()
        conn.write(ch.publish_frames("", queue, BODY, persistent=True))
        sent += 1
    while confirmed < sent:
        await asyncio.sleep(0.001)
    await conn.close()
    return confirmed


async def consume(url: str, queue: str, count: int | None, until: float | None) -> tuple[int, float]:
    conn = await LeanConnection.open(url)
    ch = await conn.channel(PREFETCH)
    got = 0
    done = asyncio.Event()
    first = [0.0]

    def on_message(tag: int, body: bytes) -> None:
        nonlocal got
        if not got:
            first[0] = time.monotonic()
        got += 1
        if count is not None and got >= count:
            done.set()

    started = time.monotonic()
    await ch.basic_consume(queue, on_message)
    if count is not None:
        await done.wait()
    else:
        await asyncio.sleep(until - time.monotonic())
    elapsed = time.monotonic() - started
    await conn.close()
    return got, elapsed


async def main(url: str) -> None:
    conn = await LeanConnection.open(url)
    ch = await conn.channel()
    await ch.queue_declare("bq", durable=True, arguments={"x-queue-type": "quorum"})
    await ch.queue_declare("lq", durable=True, arguments={"x-queue-type": "quorum"})
    await conn.close()
    await asyncio.sleep(2)  # every member follows the new groups (their in-sync set fills)
    await publish(url, "bq", N, None)
    got, elapsed = await consume(url, "bq", N, None)
    print(f"backlog: {got} delivered in {elapsed:.2f} s: {got / elapsed:,.0f} deliveries/s (prefetch {PREFETCH})")
    until = time.monotonic() + DURATION
    consumer = asyncio.create_task(consume(url, "lq", None, until))
    confirmed = await publish(url, "lq", None, until)
    got, elapsed = await consumer
    print(f"live: {confirmed / DURATION:,.0f} confirmed/s, {got / elapsed:,.0f} delivered/s (prefetch {PREFETCH})")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as directory:
        with three_nodes(Path(directory)) as nodes:
            asyncio.run(main(f"amqp://guest:guest@127.0.0.1:{nodes['a'].port}/"))
