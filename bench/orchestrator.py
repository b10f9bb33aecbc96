"""Run one measurement: start consumer and publisher processes, release them together, collect results.

Publishers each get their own process; consumer connections are spread over a
few consumer processes. That keeps the client off the broker's critical path on
a small machine: no process does both publishing and consuming.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import queue
import time
from array import array
from dataclasses import dataclass

from bench import procfs
from bench.workers import (
    ConsumerSpec, PublisherSpec, Sync, Timing, consumer_main, publisher_group_main, publisher_main, run_in_process,
)

READY_TIMEOUT_S = 60.0
COUNT_MODE_STALL_S = 1.0  # count mode: consumers are done when nothing arrived for this long
START_DELAY_S = 0.3


class WorkerError(RuntimeError):
    """A worker failed (its traceback is the message) or did not report in time."""


@dataclass
class Outcome:
    timing: Timing
    publishers: list[dict]
    consumers: list[dict]
    broker_cpu_cores: float | None
    broker_cpu_s: float | None = None  # the broker's CPU seconds over the whole run (count mode: start to end)

    def _rate(self, results: list[dict]) -> float:
        count = sum(r["count"] for r in results)
        if not self.timing.count_mode:
            return count / self.timing.duration_s
        firsts = [r["first_ns"] for r in results if r["first_ns"]]
        lasts = [r["last_ns"] for r in results if r["last_ns"]]
        if not firsts or not lasts or max(lasts) <= min(firsts):
            return 0.0
        return count / ((max(lasts) - min(firsts)) / 1e9)

    @property
    def publish_rate(self) -> float:
        """Messages published (or, with confirms, confirmed) per second."""
        return self._rate(self.publishers)

    @property
    def delivery_rate(self) -> float:
        """Deliveries per second, summed over all consumers."""
        return self._rate(self.consumers)

    def client_cpu_cores(self, role: str) -> float | None:
        """CPU used by the busiest publisher or consumer process during the window (1.0 = one full core)."""
        values = [r["cpu_cores"] for r in (self.publishers if role == "publisher" else self.consumers)
                  if r.get("cpu_cores") is not None]
        return max(values) if values else None

    def confirm_latencies_ms(self) -> list[float]:
        return _merge_ns(r.get("confirm_latencies", b"") for r in self.publishers)

    def delivery_latencies_ms(self) -> list[float]:
        return _merge_ns(r.get("latencies", b"") for r in self.consumers)


def _merge_ns(chunks) -> list[float]:
    merged = array("q")
    for chunk in chunks:
        merged.frombytes(chunk)
    return sorted(v / 1e6 for v in merged)


def percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile of already sorted values (NaN when empty)."""
    if not sorted_values:
        return float("nan")
    rank = max(0, min(len(sorted_values) - 1, math.ceil(pct / 100 * len(sorted_values)) - 1))
    return sorted_values[rank]


class _Mailbox:
    """Messages from workers, sorted by (role, index, kind); a worker error aborts the run."""

    def __init__(self, results: mp.Queue, procs: list) -> None:
        self.results = results
        self.procs = procs
        self.seen: dict[tuple[str, str], dict[int, object]] = {}

    def poll(self, timeout: float) -> None:
        try:
            role, index, kind, payload = self.results.get(timeout=timeout)
        except queue.Empty:
            crashed = [p for p in self.procs if p.exitcode not in (None, 0)]
            if crashed:  # died before it could report (a clean exit always reports first)
                raise WorkerError(f"worker process {crashed[0].name} exited with code {crashed[0].exitcode}")
            return
        if kind == "error":
            raise WorkerError(f"{role} {index} failed:\n{payload}")
        self.seen.setdefault((role, kind), {})[index] = payload

    def wait_for(self, role: str, kind: str, n: int, timeout: float) -> list:
        deadline = time.monotonic() + timeout
        while len(self.seen.get((role, kind), {})) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerError(f"timed out waiting for {n} {role} {kind!r} reports")
            self.poll(min(left, 0.1))
        got = self.seen.get((role, kind), {})
        return [got[i] for i in sorted(got)]

    def sleep_until(self, when: float) -> None:
        while (left := when - time.monotonic()) > 0:
            self.poll(min(left, 0.05))


def run_workers(publishers: list[PublisherSpec | list[PublisherSpec]], consumer_groups: list[list[ConsumerSpec]],
                timing: Timing, broker_pid: int | None, expected_deliveries: int | None = None,
                stall_s: float = COUNT_MODE_STALL_S) -> Outcome:
    """Run publishers and consumers against one broker and return what they counted. Each
    publisher entry is a process: one PublisherSpec, or a list of flooding ones (a connection each).

    In count mode the run ends when publishers are done and consumers have received
    `expected_deliveries`, or when nothing arrived for `stall_s` seconds.
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    sync = Sync(ctx, len(consumer_groups))
    procs: list = []
    mailbox = _Mailbox(results, procs)

    def spawn(role: str, index: int, main, arg) -> None:
        proc = ctx.Process(target=run_in_process, args=(role, index, main, (arg, timing, sync), results),
                           name=f"bench-{role}-{index}", daemon=True)
        proc.start()
        procs.append(proc)

    try:
        for i, group in enumerate(consumer_groups):
            spawn("consumer", i, consumer_main, group)
        mailbox.wait_for("consumer", "ready", len(consumer_groups), READY_TIMEOUT_S)
        for i, spec in enumerate(publishers):
            spawn("publisher", i, publisher_main if isinstance(spec, PublisherSpec) else publisher_group_main, spec)
        mailbox.wait_for("publisher", "ready", len(publishers), READY_TIMEOUT_S)

        start = time.monotonic() + START_DELAY_S
        sync.start.value = start
        if timing.count_mode:
            cpu_begin = _cpu(broker_pid)
            wall_begin = time.monotonic()
            pub_results = mailbox.wait_for("publisher", "ok", len(publishers), 3600)
            _wait_for_deliveries(mailbox, sync, len(consumer_groups), expected_deliveries, stall_s)
            cpu_end = _cpu(broker_pid)
            window_s = time.monotonic() - wall_begin
        else:
            mailbox.sleep_until(start + timing.warmup_s)
            cpu_begin = _cpu(broker_pid)
            mailbox.sleep_until(start + timing.warmup_s + timing.duration_s)
            cpu_end = _cpu(broker_pid)
            window_s = timing.duration_s
            pub_results = mailbox.wait_for("publisher", "ok", len(publishers), 60)
        sync.stop.value = 1
        con_results = mailbox.wait_for("consumer", "ok", len(consumer_groups), 60)
    finally:
        sync.stop.value = 1
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
    if expected_deliveries is not None and timing.count_mode:
        received = sum(r["total"] for r in con_results)
        if received < expected_deliveries:
            raise WorkerError(f"consumers received {received} of {expected_deliveries} expected deliveries")
    cores = None
    if cpu_begin is not None and cpu_end is not None and window_s > 0:
        cores = (cpu_end - cpu_begin) / window_s
    cpu_s = cpu_end - cpu_begin if cpu_begin is not None and cpu_end is not None else None
    return Outcome(timing, pub_results, con_results, cores, cpu_s)


def _wait_for_deliveries(mailbox: _Mailbox, sync: Sync, groups: int, expected: int | None,
                         stall_s: float = COUNT_MODE_STALL_S) -> None:
    if groups == 0:
        return
    last_total, last_change = -1, time.monotonic()
    while True:
        total = sum(sync.progress[i] for i in range(groups))
        if expected is not None and total >= expected:
            return
        now = time.monotonic()
        if total != last_total:
            last_total, last_change = total, now
        elif now - last_change > stall_s:
            return
        mailbox.poll(0.02)


def _cpu(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        return procfs.cpu_seconds(pid)
    except OSError:
        return None
