"""Persistent backlog: publish N persistent messages with confirms into one durable queue,
report broker RSS, restart-free drain rate, and (optionally) recovery time after a restart.

    python -m bench.backlog --url amqp://guest:guest@127.0.0.1:5672/ --count 1000000 --size 1024 \
        [--broker-pid PID] [--window 256] [--queues 1]

The broker's RSS is read from /proc/PID/status (VmRSS), so run the broker on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from bench.lean_client import LeanConnection


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def publish(url: str, queues: list[str], count: int, size: int, window: int) -> float:
    conn = await LeanConnection.open(url, name="backlog-publisher")
    channel = await conn.channel()
    for queue in queues:
        await channel.queue_declare(queue, durable=True)
    confirmed = 0
    room = asyncio.Event()
    room.set()

    def on_confirm(tag: int, multiple: bool, acked: bool) -> None:
        nonlocal confirmed
        confirmed = tag if multiple else max(confirmed, tag)
        room.set()

    await channel.confirm_select(on_confirm)
    body = b"x" * size
    started = time.perf_counter()
    sent = 0
    total = count * len(queues)
    while sent < total:
        while sent - confirmed >= window:
            room.clear()
            await room.wait()
        batch = min(window - (sent - confirmed), total - sent, 64)
        data = b"".join(
            channel.publish_frames("", queues[(sent + i) % len(queues)], body, persistent=True) for i in range(batch)
        )
        conn.write(data)
        sent += batch
        await conn.drain()
    while confirmed < total:
        room.clear()
        await room.wait()
    elapsed = time.perf_counter() - started
    await conn.close()
    return total / elapsed


async def drain(url: str, queues: list[str], count: int) -> float:
    conn = await LeanConnection.open(url, name="backlog-consumer")
    done = asyncio.Event()
    received = 0
    total = count * len(queues)

    def on_message(*_args) -> None:
        nonlocal received
        received += 1
        if received >= total:
            done.set()

    started = time.perf_counter()
    for queue in queues:
        channel = await conn.channel(prefetch=500)
        await channel.basic_consume(queue, on_message)
    await done.wait()
    elapsed = time.perf_counter() - started
    await conn.close()
    return total / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--count", type=int, default=100_000, help="messages per queue")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--window", type=int, default=256, help="confirms in flight")
    parser.add_argument("--queues", type=int, default=1)
    parser.add_argument("--broker-pid", type=int, default=0)
    parser.add_argument("--no-drain", action="store_true", help="leave the backlog (to measure recovery)")
    args = parser.parse_args()
    queues = [f"backlog-{i}" for i in range(args.queues)]
    rate = asyncio.run(publish(args.url, queues, args.count, args.size, args.window))
    print(f"published {args.count * args.queues} x {args.size} B persistent with confirms: {rate:,.0f} msg/s")
    if args.broker_pid:
        print(f"broker RSS with the backlog: {rss_mib(args.broker_pid):,.0f} MiB")
    if not args.no_drain:
        rate = asyncio.run(drain(args.url, queues, args.count))
        print(f"drained: {rate:,.0f} msg/s")
        if args.broker_pid:
            print(f"broker RSS after the drain: {rss_mib(args.broker_pid):,.0f} MiB")


if __name__ == "__main__":
    main()
