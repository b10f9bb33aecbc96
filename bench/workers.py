"""Publisher and consumer processes.

Each worker connects, reports "ready", waits for the shared start time, runs,
and reports one result dict (or an error traceback) on the results queue.
Publishers stop on their own (end of the window, or after their message count);
consumers stop when the orchestrator raises the stop flag.

Counting uses one measurement window on the system-wide monotonic clock, the
same in every process: [start + warmup, start + warmup + duration). In count
mode the window is [start, forever) and rates come from first/last timestamps.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from array import array
from collections import deque
from dataclasses import dataclass
from typing import Any

from bench import frames
from bench.lean_client import LeanChannel, LeanConnection

FOREVER_NS = 2**62
_monotonic_ns = time.monotonic_ns


@dataclass(frozen=True)
class Timing:
    warmup_s: float
    duration_s: float | None  # None: count mode
    count: int | None  # messages per publisher in count mode

    @property
    def count_mode(self) -> bool:
        return self.duration_s is None

    def window_ns(self, start_s: float) -> tuple[int, int]:
        if self.count_mode:
            return int(start_s * 1e9), FOREVER_NS
        begin = int((start_s + self.warmup_s) * 1e9)
        return begin, begin + int(self.duration_s * 1e9)


@dataclass(frozen=True)
class PublisherSpec:
    url: str
    exchange: str
    routing_keys: tuple[str, ...]
    size: int
    persistent: bool = False
    confirm_window: int | None = None  # publisher confirms with at most this many unconfirmed
    rate: float | None = None  # paced publishing (msg/s); bodies carry a send timestamp
    batch: int = 64  # messages per socket write when flooding


@dataclass(frozen=True)
class ConsumerSpec:
    """One connection with one channel consuming one queue."""

    url: str
    queue: str
    no_ack: bool
    prefetch: int
    latency: bool = False  # bodies start with a send timestamp; record delivery latency
    arguments: dict | None = None  # basic.consume's arguments (a stream's x-stream-offset)
    # basic.consume at the start time rather than before reporting ready: a consumer of a
    # backlog (a stream read from `first`) then reads all of it inside the measurement.
    consume_at_start: bool = False


class Sync:
    """Shared-memory flags: start time (monotonic seconds), stop flag, per-consumer-process progress."""

    def __init__(self, ctx: Any, consumer_processes: int) -> None:
        self.start = ctx.RawValue("d", 0.0)
        self.stop = ctx.RawValue("i", 0)
        self.progress = ctx.RawArray("q", max(1, consumer_processes))


def run_in_process(role: str, index: int, main: Any, args: tuple, results: Any) -> None:
    """Process entry point: run `main(*args)` on a fresh event loop (uvloop if present), report the outcome."""
    try:
        try:
            import uvloop

            runner = uvloop.run
        except ImportError:
            runner = asyncio.run
        result = runner(main(role, index, *args, results))
        results.put((role, index, "ok", result))
    except BaseException:  # noqa: BLE001 - every failure must reach the orchestrator
        results.put((role, index, "error", traceback.format_exc()))


async def _wait_for_start(sync: Sync) -> float:
    while sync.start.value == 0.0:
        if sync.stop.value:
            raise RuntimeError("aborted before start")
        await asyncio.sleep(0.005)
    start = sync.start.value
    delay = start - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
    return start


class CpuMeter:
    """This process's CPU use (in cores) over the measurement window, so a saturated client shows up."""

    def __init__(self, window: tuple[int, int]) -> None:
        self.begin: tuple[float, float] | None = None
        self.end: tuple[float, float] | None = None
        self._task = asyncio.ensure_future(self._run(window))

    @staticmethod
    def _sample() -> tuple[float, float]:
        return time.process_time(), time.monotonic()

    async def _run(self, window: tuple[int, int]) -> None:
        await asyncio.sleep(max(0.0, window[0] / 1e9 - time.monotonic()))
        self.begin = self._sample()
        if window[1] < FOREVER_NS:
            await asyncio.sleep(max(0.0, window[1] / 1e9 - time.monotonic()))
            self.end = self._sample()

    def cores(self) -> float | None:
        self._task.cancel()
        if self.begin is None:
            return None
        end = self.end or self._sample()
        wall = end[1] - self.begin[1]
        return (end[0] - self.begin[0]) / wall if wall > 0 else None


# ---- publishers ------------------------------------------------------------------


async def publisher_main(role: str, index: int, spec: PublisherSpec, timing: Timing, sync: Sync,
                         results: Any) -> dict:
    conn = await LeanConnection.open(spec.url, name=f"bench-{role}-{index}")
    chan = await conn.channel()
    body = b"x" * spec.size
    messages = [chan.publish_frames(spec.exchange, key, body, spec.persistent) for key in spec.routing_keys]
    if spec.confirm_window:
        confirms = ConfirmTracker(conn, spec.confirm_window)
        await chan.confirm_select(confirms.on_confirm)
    results.put((role, index, "ready", None))
    start = await _wait_for_start(sync)
    window = timing.window_ns(start)
    cpu = CpuMeter(window)
    if spec.rate:
        result = await _publish_paced(conn, chan.number, spec, timing, window)
    elif spec.confirm_window:
        confirms.window = window
        result = await _publish_confirmed(conn, messages, confirms, timing, window)
    else:
        result = await _publish_flood(conn, chan, messages, spec.batch, timing, window)
    result["cpu_cores"] = cpu.cores()
    await conn.close()
    return result


async def publisher_group_main(role: str, index: int, specs: list[PublisherSpec], timing: Timing, sync: Sync,
                               results: Any) -> dict:
    """Several publishers in one process, a connection each, reported as one: many connections
    without a process per connection on a small machine. Each floods, or keeps its
    `confirm_window` of unconfirmed messages in flight."""
    assert all(not spec.rate for spec in specs), "groups do not pace"
    publishers = []
    for n, spec in enumerate(specs):
        conn = await LeanConnection.open(spec.url, name=f"bench-{role}-{index}-{n}")
        chan = await conn.channel()
        body = b"x" * spec.size
        messages = [chan.publish_frames(spec.exchange, key, body, spec.persistent) for key in spec.routing_keys]
        confirms = None
        if spec.confirm_window:
            confirms = ConfirmTracker(conn, spec.confirm_window)
            await chan.confirm_select(confirms.on_confirm)
        publishers.append((conn, chan, messages, spec.batch, confirms))
    results.put((role, index, "ready", None))
    start = await _wait_for_start(sync)
    window = timing.window_ns(start)
    cpu = CpuMeter(window)

    def publish(conn: LeanConnection, chan: LeanChannel, messages: list[bytes], batch: int,
                confirms: ConfirmTracker | None) -> Any:
        if confirms is None:
            return _publish_flood(conn, chan, messages, batch, timing, window)
        confirms.window = window
        return _publish_confirmed(conn, messages, confirms, timing, window)

    outcomes = await asyncio.gather(*(publish(*publisher) for publisher in publishers))
    cpu_cores = cpu.cores()
    await asyncio.gather(*(conn.close() for conn, *_ in publishers))
    firsts = [o["first_ns"] for o in outcomes if o["first_ns"]]
    return {"sent": sum(o["sent"] for o in outcomes), "count": sum(o["count"] for o in outcomes),
            "first_ns": min(firsts, default=0), "last_ns": max(o["last_ns"] for o in outcomes),
            "nacked": sum(o.get("nacked", 0) for o in outcomes),
            "confirm_latencies": b"".join(o.get("confirm_latencies", b"") for o in outcomes),
            "cpu_cores": cpu_cores}


def _batches(messages: list[bytes], batch: int) -> list[tuple[bytes, int]]:
    """Pre-joined writes of `batch` messages, cycling through every routing key."""
    per_cycle = max(len(messages), batch)
    per_cycle = -(-per_cycle // batch) * batch
    ordered = [messages[i % len(messages)] for i in range(per_cycle)]
    return [(b"".join(ordered[i : i + batch]), batch) for i in range(0, per_cycle, batch)]


async def _publish_flood(conn: LeanConnection, chan: LeanChannel, messages: list[bytes], batch: int,
                         timing: Timing, window: tuple[int, int]) -> dict:
    batches = _batches(messages, batch)
    win_begin, win_end = window
    limit = timing.count if timing.count_mode else None
    sent = counted = first = last = 0
    i = 0
    while True:
        now = _monotonic_ns()
        if now >= win_end or (limit is not None and sent >= limit):
            break
        data, k = batches[i]
        i = (i + 1) % len(batches)
        if limit is not None and sent + k > limit:
            k = limit - sent
            data = b"".join(messages[(sent + j) % len(messages)] for j in range(k))
        conn.write(data)
        sent += k
        if now >= win_begin:
            counted += k
            first = first or now
            last = now
        if conn.is_paused:
            await conn.drain()
        else:
            await asyncio.sleep(0)
    if limit is not None:
        # Count mode: socket buffers swallow megabytes, so the run ends when the broker answers an RPC
        # sent after the last publish: it has then read every publish before it.
        await chan.round_trip()
        last = _monotonic_ns()
    return {"sent": sent, "count": counted, "first_ns": first, "last_ns": last}


class ConfirmTracker:
    """Tracks unconfirmed publishes (sequence numbers in order) and the latency of each confirm."""

    def __init__(self, conn: LeanConnection, capacity: int) -> None:
        self.conn = conn
        self.capacity = capacity
        self.window = (FOREVER_NS, FOREVER_NS)
        self.outstanding: deque[tuple[int, int]] = deque()  # (sequence number, sent at ns)
        self.early: dict[int, int] = {}  # confirmed out of order: seq -> confirmed at ns
        self.space = asyncio.Event()
        self.space.set()
        self.confirmed = self.counted = self.nacked = 0
        self.last_ns = 0
        self.latencies = array("q")

    def on_confirm(self, tag: int, multiple: bool, acked: bool) -> None:
        now = self.conn.read_ns
        outstanding = self.outstanding
        if not acked:
            self.nacked += 1
        if multiple:
            while outstanding and outstanding[0][0] <= tag:
                self._record(outstanding.popleft()[1], now)
        elif outstanding and outstanding[0][0] == tag:
            self._record(outstanding.popleft()[1], now)
        else:
            self.early[tag] = now
        while outstanding and outstanding[0][0] in self.early:
            seq, sent_ns = outstanding.popleft()
            self._record(sent_ns, self.early.pop(seq))
        if len(outstanding) < self.capacity:
            self.space.set()

    def _record(self, sent_ns: int, confirmed_ns: int) -> None:
        self.confirmed += 1
        self.last_ns = confirmed_ns
        if self.window[0] <= confirmed_ns < self.window[1]:
            self.counted += 1
            self.latencies.append(confirmed_ns - sent_ns)


async def _publish_confirmed(conn: LeanConnection, messages: list[bytes], confirms: ConfirmTracker,
                             timing: Timing, window: tuple[int, int]) -> dict:
    limit = timing.count if timing.count_mode else None
    seq = 0
    first = 0
    outstanding = confirms.outstanding
    while True:
        free = confirms.capacity - len(outstanding)
        if limit is not None:
            free = min(free, limit - seq)
            if free <= 0 and seq >= limit:
                break
        if free <= 0:
            confirms.space.clear()
            await asyncio.wait_for(confirms.space.wait(), 60)
            continue
        now = _monotonic_ns()
        if now >= window[1]:
            break
        first = first or now
        conn.write(b"".join(messages[(seq + j) % len(messages)] for j in range(free)))
        for _ in range(free):
            seq += 1
            outstanding.append((seq, now))
        if conn.is_paused:
            await conn.drain()
    if limit is not None:
        while outstanding:
            confirms.space.clear()
            await asyncio.wait_for(confirms.space.wait(), 60)
    return {"sent": seq, "count": confirms.counted, "first_ns": first, "last_ns": confirms.last_ns,
            "nacked": confirms.nacked, "confirm_latencies": confirms.latencies.tobytes()}


async def _publish_paced(conn: LeanConnection, channel: int, spec: PublisherSpec, timing: Timing,
                         window: tuple[int, int]) -> dict:
    """Publish at a fixed rate; each body starts with the monotonic send time in ns (8 bytes, big-endian)."""
    size = max(spec.size, 8)
    key = spec.routing_keys[0]
    prefix = frames.publish_method(channel, spec.exchange, key) + frames.content_header(channel, size,
                                                                                         spec.persistent)
    body_head = frames.FRAME_HEADER_STRUCT.pack(frames.FRAME_BODY, channel, size)
    tail = b"x" * (size - 8) + b"\xce"
    limit = timing.count if timing.count_mode else None
    begin = _monotonic_ns()
    sent = counted = 0
    while True:
        now = _monotonic_ns()
        if now >= window[1] or (limit is not None and sent >= limit):
            break
        due = int((now - begin) * spec.rate / 1e9) - sent
        if limit is not None:
            due = min(due, limit - sent)
        if due > 0:
            one = prefix + body_head + frames.U64.pack(now) + tail
            conn.write(one * due)
            sent += due
            if now >= window[0]:
                counted += due
        await asyncio.sleep(0.001)  # libuv timers have 1 ms resolution; shorter sleeps would spin
    return {"sent": sent, "count": counted, "first_ns": begin, "last_ns": _monotonic_ns()}


# ---- consumers -------------------------------------------------------------------


class DeliveryCounter:
    """Counts one consumer's deliveries inside the window; optionally records latency from the body's timestamp."""

    __slots__ = ("conn", "begin", "end", "total", "count", "first", "last", "latencies")

    def __init__(self, conn: LeanConnection, latency: bool) -> None:
        self.conn = conn
        self.begin = self.end = FOREVER_NS
        self.total = self.count = self.first = self.last = 0
        self.latencies = array("q") if latency else None

    def on_message(self, delivery_tag: int, body: bytes) -> None:
        self.total += 1
        now = self.conn.read_ns
        if self.begin <= now < self.end:
            self.count += 1
            if not self.first:
                self.first = now
            self.last = now
            if self.latencies is not None:
                self.latencies.append(now - int.from_bytes(body[:8], "big"))


async def consumer_main(role: str, index: int, specs: list[ConsumerSpec], timing: Timing, sync: Sync,
                        results: Any) -> dict:
    counters: list[DeliveryCounter] = []
    conns: list[LeanConnection] = []
    late: list[tuple[LeanChannel, ConsumerSpec, DeliveryCounter]] = []
    for n, spec in enumerate(specs):
        conn = await LeanConnection.open(spec.url, name=f"bench-{role}-{index}-{n}")
        conns.append(conn)
        chan = await conn.channel(prefetch=None if spec.no_ack else spec.prefetch)
        counter = DeliveryCounter(conn, spec.latency)
        counters.append(counter)
        if spec.consume_at_start:
            late.append((chan, spec, counter))
        else:
            await chan.basic_consume(spec.queue, counter.on_message, no_ack=spec.no_ack, arguments=spec.arguments)
    results.put((role, index, "ready", None))
    start = await _wait_for_start(sync)
    begin, end = timing.window_ns(start)
    for counter in counters:
        counter.begin, counter.end = begin, end
    await asyncio.gather(*(chan.basic_consume(spec.queue, counter.on_message, no_ack=spec.no_ack,
                                              arguments=spec.arguments) for chan, spec, counter in late))
    cpu = CpuMeter((begin, end))
    while not sync.stop.value:
        sync.progress[index] = sum(c.total for c in counters)
        for conn in conns:
            if conn.error:
                raise conn.error
        await asyncio.sleep(0.02)
    cpu_cores = cpu.cores()
    await asyncio.gather(*(conn.close() for conn in conns))
    latencies = array("q")
    for counter in counters:
        if counter.latencies is not None:
            latencies.extend(counter.latencies)
    active = [c for c in counters if c.first]
    return {
        "total": sum(c.total for c in counters),
        "count": sum(c.count for c in counters),
        "first_ns": min((c.first for c in active), default=0),
        "last_ns": max((c.last for c in active), default=0),
        "latencies": latencies.tobytes(),
        "cpu_cores": cpu_cores,
    }
