"""Scenario 7: the broker's resident memory before and after opening many idle connections.

RSS is read from /proc/<broker pid>/status (VmRSS), so the broker must run on
this machine and its pid must be known (--broker-pid, or found from the port).
Measure a freshly started broker: memory freed after earlier traffic stays in
RSS, and new connections would fit into it without the RSS moving.
"""

from __future__ import annotations

import asyncio
import resource
import time

from bench import procfs
from bench.lean_client import LeanConnection
from bench.targets import Target

OPEN_CONCURRENCY = 50  # handshakes in flight at once, like a fleet of services starting


def raise_fd_limit(wanted: int) -> None:
    """Raise our soft open-files limit towards `wanted` (capped at the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < wanted:
        raise RuntimeError(f"open-files limit {hard} is below the {wanted} needed; raise it with ulimit -n")


async def _open_all(url: str, n: int) -> list[LeanConnection]:
    gate = asyncio.Semaphore(OPEN_CONCURRENCY)
    conns: list[LeanConnection] = []

    async def open_one(i: int) -> None:
        async with gate:
            conn = await LeanConnection.open(url, name=f"bench-idle-{i}")
            conns.append(conn)
            await conn.channel()

    try:
        await asyncio.gather(*(open_one(i) for i in range(n)))
    except BaseException:
        await _close_all(conns)
        raise
    return conns


async def _close_all(conns: list[LeanConnection]) -> None:
    gate = asyncio.Semaphore(OPEN_CONCURRENCY * 4)

    async def close_one(conn: LeanConnection) -> None:
        async with gate:
            await conn.close()

    await asyncio.gather(*(close_one(c) for c in conns), return_exceptions=True)


def measure_idle_connections(target: Target, n: int, settle_s: float) -> list[tuple[str, str, float]]:
    """Open `n` connections with one channel each, hold them idle, close them; report (metric, unit, value)."""
    if target.pid is None:
        raise RuntimeError(f"broker pid of {target.label} unknown: pass --broker-pid {target.label}=PID")
    raise_fd_limit(n + 256)
    pid = target.pid

    async def run() -> list[tuple[str, str, float]]:
        before = procfs.rss_kib(pid)
        began = time.monotonic()
        conns = await _open_all(target.url, n)
        open_s = time.monotonic() - began
        await asyncio.sleep(settle_s)
        held = procfs.rss_kib(pid)
        await _close_all(conns)
        await asyncio.sleep(settle_s)
        after = procfs.rss_kib(pid)
        return [
            ("RSS before", "MiB", before / 1024),
            ("RSS with connections open", "MiB", held / 1024),
            ("RSS per connection", "KiB", (held - before) / n),
            ("RSS after closing them", "MiB", after / 1024),
            ("connection+channel open rate", "conn/s", n / open_s),
        ]

    return asyncio.run(run())
