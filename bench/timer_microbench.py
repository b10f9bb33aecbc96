"""The one timer mechanism at scale: memory of a million waiting messages, and how late timers fire.

Run: python bench/timer_microbench.py                 (from the repo root; a few minutes)
     python bench/timer_microbench.py --only memory --count 1000000
     python bench/timer_microbench.py --only lateness --lateness-count 100000

Memory: each scenario runs in a fresh child process, which reports the RSS it added.
  retry-transient  N transient messages (32-byte bodies) of a queue with x-delayed-retry,
                   each delivered once and rejected: all N wait for their retry in memory.
  retry-durable    the same with persistent messages of a durable queue (a real journal in a
                   temporary directory): waiting messages are paged out, only their number,
                   delivery count and due time stay in memory (plus the journal's index).
  delayed-transient / delayed-durable
                   N messages held by an x-delayed-message exchange (random delays up to a
                   year), in memory / journaled.
  "ready" is the same queue with the N messages ready instead, for comparison.

Lateness: one process, the broker's own drive_timers task on the event loop the server uses
(uvloop when installed). Messages with random delays (1-4 s) wait in a delayed exchange and
in retry queues (7 delays, so 7 lanes) while 1 million more wait far in the future; each
release records how long after its due time it happened. Run once with an idle loop and once
with the loop busy (a task that burns 2 ms of CPU every 4 ms, as heavy traffic would).
Garbage-collector pauses during the run are reported too: they delay timers like any other
work on the loop.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pamqp import commands  # noqa: E402

from queues.delays.delayed_exchange import DelayedMessages, store_name  # noqa: E402
from queues.delays.delayed_retry import FAILED  # noqa: E402
from queues.journal import QueueJournal  # noqa: E402
from queues.message import Message, content_header  # noqa: E402
from queues.queue import Queue  # noqa: E402
from queues.delays.retry_lanes import RetryLanes  # noqa: E402
from queues.timers import Timers  # noqa: E402

BODY = b"x" * 32
TRANSIENT_HEADER = content_header(len(BODY), commands.Basic.Properties().marshal())
PERSISTENT_HEADER = content_header(len(BODY), commands.Basic.Properties(delivery_mode=2).marshal())
HOUR_MS = 3_600_000


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def settled_rss() -> int:
    gc.collect()
    return rss_bytes()


# -- memory scenarios (each in its own process) ---------------------------------------------


def _retry_queue(durable: bool, directory: Path | None) -> Queue:
    arguments = {"x-delayed-retry-type": "failed", "x-delayed-retry-min": HOUR_MS}
    journal = None
    if durable:
        from persistence.queue_store import QueueStore

        journal = QueueJournal(QueueStore.for_queue(directory, "/", "bench"), None)
    queue = Queue("bench", "/", durable=durable, arguments=arguments, timers=Timers(), journal=journal)
    queue.recover()
    return queue


def memory_retry(count: int, durable: bool, directory: Path | None) -> dict:
    header = PERSISTENT_HEADER if durable else TRANSIENT_HEADER
    before = settled_rss()
    queue = _retry_queue(durable, directory)
    for _ in range(count):
        queue.publish(Message("", "bench", header, BODY))
    ready = settled_rss()
    started = time.perf_counter()
    for _ in range(count):
        entry = queue.get(no_ack=False)
        queue.after_get(entry)
        queue.requeue([(entry, None)], FAILED)
        del entry
    elapsed = time.perf_counter() - started
    waiting = settled_rss()
    assert queue.waiting_count == count and queue.message_count == 0
    if queue.journal is not None:
        queue.journal.close()
    return {
        "ready_bytes_per_message": (ready - before) / count,
        "waiting_bytes_per_message": (waiting - before) / count,
        "waiting_total_mib": (waiting - before) / 2**20,
        "reject_to_waiting_per_s": count / elapsed,
    }


def memory_delayed(count: int, durable: bool, directory: Path | None) -> dict:
    journal = None
    before = settled_rss()
    if durable:
        from persistence.queue_store import QueueStore

        journal = QueueJournal(QueueStore.for_queue(directory, "/", store_name("bench")), None)
    pending = DelayedMessages("bench", Timers(), lambda message: True, journal)
    pending.recover()
    rng = random.Random(1)
    started = time.perf_counter()
    for _ in range(count):
        raw = commands.Basic.Properties(
            headers={"x-delay": rng.randrange(1, 365 * 24 * HOUR_MS)}, delivery_mode=2 if durable else 1
        ).marshal()
        pending.publish(Message("bench", "k", content_header(len(BODY), raw), BODY))
    elapsed = time.perf_counter() - started
    held = settled_rss()
    if journal is not None:
        journal.close()
    return {
        "pending_bytes_per_message": (held - before) / count,
        "pending_total_mib": (held - before) / 2**20,
        "publish_per_s": count / elapsed,
    }


def run_memory_child(scenario: str, count: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="timer-bench-") as tmp:
        directory = Path(tmp)
        if scenario.startswith("retry"):
            return memory_retry(count, scenario.endswith("durable"), directory)
        return memory_delayed(count, scenario.endswith("durable"), directory)


# -- lateness --------------------------------------------------------------------------------


async def lateness(count: int, background: int, busy: bool) -> dict:
    from amqp_server.runtime.server import drive_timers

    timers = Timers()
    late_ms: list[float] = []

    # Retry lanes: record (release time - due time) of every message they hand back.
    original_take_due = RetryLanes.take_due

    def take_due(self, now_ms, limit=None):
        taken = original_take_due(self, now_ms, limit)
        now = time.time() * 1000
        late_ms.extend(now - item.due_ms for item in taken)
        return taken

    RetryLanes.take_due = take_due  # type: ignore[method-assign]

    published: dict[bytes, float] = {}  # body -> publish time (a released copy's is reset)

    def released(message: Message) -> bool:
        delay_s = -message.headers["x-delay"] / 1000
        late_ms.append((time.time() - (published[message.body] + delay_s)) * 1000)
        return True

    driver = asyncio.create_task(drive_timers(timers))
    exchange = DelayedMessages("bench", timers, released)
    # Far-future waiting messages: the structures are big, the heap stays small.
    far = Queue("far", "/", arguments={"x-delayed-retry-type": "failed", "x-delayed-retry-min": HOUR_MS}, timers=timers)
    for _ in range(background):
        far.publish(Message("", "far", TRANSIENT_HEADER, BODY))
        entry = far.get(no_ack=False)
        far.after_get(entry)
        far.requeue([(entry, None)], FAILED)
    rng = random.Random(2)
    queues = [
        Queue(f"q{n}", "/", arguments={"x-delayed-retry-type": "failed", "x-delayed-retry-min": 1000 + 500 * n}, timers=timers)
        for n in range(7)
    ]
    burner = asyncio.create_task(_burn()) if busy else None
    pauses = _GcPauses()
    start = time.time()
    half = count // 2
    for n in range(half):
        body = b"%d" % n
        # Due 1-4 s from now: scheduling (which yields often) is over before the first is due.
        raw = commands.Basic.Properties(headers={"x-delay": rng.randrange(1000, 4000)}).marshal()
        message = Message("bench", "k", content_header(len(body), raw), body)
        published[body] = message.published_at
        exchange.publish(message)
        if n % 1000 == 0:
            await asyncio.sleep(0)
    for n in range(count - half):
        queue = queues[n % len(queues)]
        queue.publish(Message("", queue.name, TRANSIENT_HEADER, BODY))
        entry = queue.get(no_ack=False)
        queue.after_get(entry)
        queue.requeue([(entry, None)], FAILED)
        if n % 1000 == 0:
            await asyncio.sleep(0)
    scheduled_in = time.time() - start
    while len(late_ms) < count:
        await asyncio.sleep(0.05)
        if time.time() - start > 60:
            break
    pauses.stop()
    driver.cancel()
    if burner is not None:
        burner.cancel()
    RetryLanes.take_due = original_take_due  # type: ignore[method-assign]
    late_ms.sort()
    return {
        "fired": len(late_ms),
        "scheduling_s": round(scheduled_in, 2),
        "p50_ms": round(late_ms[len(late_ms) // 2], 2),
        "p99_ms": round(late_ms[int(len(late_ms) * 0.99)], 2),
        "max_ms": round(late_ms[-1], 2),
        "early": sum(1 for value in late_ms if value < -1.0),
        "gc_full_collections": pauses.full,
        "gc_longest_pause_ms": round(pauses.longest * 1000, 1),
    }


class _GcPauses:
    """Garbage-collector pauses meanwhile: with a million live objects a full collection
    takes a while, and every timer due during it fires that much later."""

    def __init__(self) -> None:
        self.full = 0
        self.longest = 0.0
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        self.longest = max(self.longest, time.perf_counter() - self._started)
        if info.get("generation") == 2:
            self.full += 1

    def stop(self) -> None:
        gc.callbacks.remove(self._callback)


async def _burn() -> None:
    while True:
        end = time.perf_counter() + 0.002
        while time.perf_counter() < end:
            pass
        await asyncio.sleep(0.002)


def run_lateness(count: int, background: int, busy: bool) -> dict:
    try:
        import uvloop

        return uvloop.run(lateness(count, background, busy))
    except ImportError:
        return asyncio.run(lateness(count, background, busy))


# -- driver ----------------------------------------------------------------------------------

MEMORY_SCENARIOS = ("retry-transient", "retry-durable", "delayed-transient", "delayed-durable")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("memory", "lateness"))
    parser.add_argument("--count", type=int, default=1_000_000, help="messages per memory scenario")
    parser.add_argument("--lateness-count", type=int, default=100_000)
    parser.add_argument("--background", type=int, default=1_000_000, help="far-future waiting messages meanwhile")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_memory_child(args.child, args.count)))
        return 0
    if args.only in (None, "memory"):
        for scenario in MEMORY_SCENARIOS:
            out = subprocess.run(
                [sys.executable, __file__, "--child", scenario, "--count", str(args.count)],
                capture_output=True, text=True, check=True,
            ).stdout
            result = json.loads(out)
            print(f"memory {scenario:18} {args.count:>9,} messages: " + ", ".join(
                f"{key} {value:,.1f}" for key, value in result.items()
            ))
    if args.only in (None, "lateness"):
        for busy in (False, True):
            result = run_lateness(args.lateness_count, args.background, busy)
            loop = "busy loop" if busy else "idle loop"
            print(f"lateness {loop}: {args.lateness_count:,} timers (+{args.background:,} waiting far ahead): "
                  + ", ".join(f"{key} {value}" for key, value in result.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
