"""A shovel's transfer rate, side by side (issue 25, "Speed"): this broker's shovel from this broker
to this broker, and RabbitMQ's shovel from RabbitMQ to RabbitMQ, both with ack-mode on-confirm.

For each side: two broker processes on free ports (ours: `python -m amqp_server`; RabbitMQ:
Debian's rabbitmq-server 3.10 with the shovel plugins, started as interop_tests/rabbitmq_nodes.py
starts it), N persistent messages of S bytes published with confirms into a durable queue of the
first, then a dynamic shovel defined on the second (src-uri: the first broker, dest-uri:
"amqp://", the second itself, as a migration runs it; src-prefetch-count P). The clock runs from
the PUT of the shovel until the destination queue holds all N (read on one AMQP connection every
10 ms). Sides take turns, round after round; each figure is messages per second, and the line
ends with ours / RabbitMQ's.

    python -m bench.shovel_transfer                       # 100,000 messages of 100 bytes, 3 rounds
    python -m bench.shovel_transfer --messages 20000 --rounds 1 --only ours

Take figures on a quiet machine (docs/benchmarks.md says how); it prints the load average
before and after. Needs Debian's rabbitmq-server for the RabbitMQ side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
import urllib.error
import urllib.request
from base64 import b64encode
from collections.abc import Callable
from pathlib import Path

from bench.lean_client import LeanConnection

QUEUE = "shovel-bench"


def _load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


async def _preload(url: str, count: int, size: int, window: int = 512) -> None:
    connection = await LeanConnection.open(url, name="shovel-bench-publisher")
    channel = await connection.channel()
    await channel.queue_delete(QUEUE)
    await channel.queue_declare(QUEUE, durable=True)
    confirmed = 0
    room = asyncio.Event()

    def on_confirm(tag: int, multiple: bool, acked: bool) -> None:
        nonlocal confirmed
        confirmed = tag if multiple else max(confirmed, tag)
        room.set()

    await channel.confirm_select(on_confirm)
    body = b"x" * size
    sent = 0
    while sent < count:
        while sent - confirmed >= window:
            room.clear()
            await room.wait()
        batch = min(window - (sent - confirmed), count - sent, 64)
        connection.write(b"".join(channel.publish_frames("", QUEUE, body, persistent=True) for _ in range(batch)))
        sent += batch
        await connection.drain()
    while confirmed < count:
        room.clear()
        await room.wait()
    await connection.close()


async def _empty_destination(url: str) -> None:
    connection = await LeanConnection.open(url, name="shovel-bench-setup")
    channel = await connection.channel()
    await channel.queue_delete(QUEUE)
    await connection.close()


async def _wait_for(url: str, count: int, timeout: float) -> float:
    """Seconds until the queue at `url` holds `count` messages (passive declares every 10 ms)."""
    connection = await LeanConnection.open(url, name="shovel-bench-probe")
    channel = await connection.channel()
    # Declared here as the shovel declares it (durable, no arguments), so the probe finds it.
    await channel.queue_declare(QUEUE, durable=True)
    started = time.perf_counter()
    try:
        while True:
            depth = await channel.queue_depth(QUEUE)
            if depth >= count:
                return time.perf_counter() - started
            if time.perf_counter() - started > timeout:
                raise TimeoutError(f"{depth} of {count} messages after {timeout:.0f} s")
            await asyncio.sleep(0.01)
    finally:
        await connection.close()


def _api(management: str, method: str, path: str, body: object = None) -> int:
    request = urllib.request.Request(management + path, data=json.dumps(body).encode() if body is not None else None,
                                     method=method)
    request.add_header("Authorization", "Basic " + b64encode(b"guest:guest").decode())
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


class Side:
    """Two brokers of one kind, and how to shovel between them."""

    def __init__(self, label: str, source_url: str, destination_url: str, management: str,
                 stop: Callable[[], None]) -> None:
        self.label = label
        self.source_url = source_url
        self.destination_url = destination_url
        self.management = management
        self.stop = stop

    def transfer(self, count: int, size: int, prefetch: int, timeout: float) -> float:
        """Messages per second of one transfer."""
        asyncio.run(_preload(self.source_url, count, size))
        asyncio.run(_empty_destination(self.destination_url))
        name = f"bench-{time.monotonic_ns()}"
        value = {"src-uri": self.source_url, "src-queue": QUEUE, "dest-uri": "amqp://", "dest-queue": QUEUE,
                 "ack-mode": "on-confirm", "src-prefetch-count": prefetch}
        status = _api(self.management, "PUT", f"/api/parameters/shovel/%2F/{name}", {"value": value})
        if status not in (201, 204):
            raise RuntimeError(f"{self.label}: the shovel was refused ({status})")
        try:
            elapsed = asyncio.run(_wait_for(self.destination_url, count, timeout))
        finally:
            _api(self.management, "DELETE", f"/api/parameters/shovel/%2F/{name}")
        return count / elapsed


def _ours(directory: Path) -> Side:
    from interop_tests.broker_process import free_port, launch

    source = launch(directory / "ours-source", extra_args=("--log-level", "warning"))
    port = free_port()
    destination = launch(directory / "ours-destination",
                         extra_args=("--management-port", str(port), "--log-level", "warning"))

    def stop() -> None:
        destination.stop()
        source.stop()

    return Side("ours", source.url(), destination.url(), f"http://127.0.0.1:{port}", stop)


def _rabbitmq() -> Side:
    from interop_tests.rabbitmq_nodes import SHOVEL, start_rabbitmq

    source = start_rabbitmq()
    destination = start_rabbitmq(SHOVEL)

    def stop() -> None:
        destination.stop()
        source.stop()

    return Side("rabbitmq", source.amqp_url(), destination.amqp_url(), f"http://127.0.0.1:{destination.management_port}",
                stop)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.shovel_transfer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=100, help="body bytes (default 100)")
    parser.add_argument("--prefetch", type=int, default=1000, help="src-prefetch-count (default 1000, RabbitMQ's)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=("ours", "rabbitmq"))
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one transfer may take")
    args = parser.parse_args(argv)
    print(f"shovel transfer, on-confirm: {args.messages} messages of {args.size} bytes, prefetch {args.prefetch}; "
          f"load {_load()}")
    sides: list[Side] = []
    with tempfile.TemporaryDirectory(prefix="shovel-bench-") as scratch:
        try:
            if args.only in (None, "ours"):
                sides.append(_ours(Path(scratch)))
            if args.only in (None, "rabbitmq"):
                sides.append(_rabbitmq())
            figures: dict[str, list[float]] = {side.label: [] for side in sides}
            for round_number in range(1, args.rounds + 1):
                for side in sides:
                    rate = side.transfer(args.messages, args.size, args.prefetch, args.timeout)
                    figures[side.label].append(rate)
                    print(f"round {round_number}: {side.label:9s} {rate:10,.0f} msg/s  (load {_load()})")
        finally:
            for side in sides:
                side.stop()
    medians = {label: statistics.median(rates) for label, rates in figures.items()}
    line = "  ".join(f"{label} {rate:,.0f} msg/s" for label, rate in medians.items())
    if len(medians) == 2:
        line += f"  ours / RabbitMQ: {medians['ours'] / medians['rabbitmq']:.2f}x"
    print(f"median of {args.rounds}: {line}; load {_load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
