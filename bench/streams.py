"""Scenario 10, `streams`: streams (`x-queue-type: stream`) as issue 23's "Speed" asks for them.

Variants, in this order, each against every target in turn:

- publish N messages (`--stream-messages`, default 1,000,000) with confirms, the first of
  `--stream-windows` in flight (default 256), to a fresh stream: confirmed msg/s. That stream
  stays, filled, for the readers below (one per target: `StreamFixtures`);
- publish with confirms for `--duration` seconds with each further window of
  `--stream-windows` in flight (default 1), to a fresh stream each;
- one consumer reading the N-message stream from `first` (prefetch `--stream-prefetch`,
  default 1000; the lean client acks with `multiple` once per socket read): deliveries/s, the
  broker's CPU, and its RSS before, at its peak during the read, and after;
- `--stream-consumers` consumers (default 10, a connection each, spread over
  `--consumer-procs` processes) reading that stream from `first` at once: aggregate
  deliveries/s, and the broker's RSS, which should not grow with consumers x messages;
- retention: a fresh stream with x-max-length-bytes 100 MB and x-stream-max-segment-size-bytes
  10 MB, 300 MB of bodies published (`--stream-retention-body` bytes each, default 1000), the
  stream's directory measured on disk while it fills (its peak) and at the end; it should stay
  within x-max-length-bytes plus one segment. Needs `--stream-dir LABEL=DIR` (ours:
  `<data_dir>/streams`; RabbitMQ: `<mnesia dir>/stream`).

The consumers call basic.consume at the shared start time, so the whole read is measured. RSS
and disk are sampled from this process every 0.1 s while the workers run (bench/procfs.py).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bench import procfs
from bench.orchestrator import Outcome, percentile, run_workers
from bench.scenarios import Options, Row, Variant, _cleanup, _consumer_groups, _cpu_rows, _row, _unique, _with_channel
from bench.targets import Target
from bench.workers import ConsumerSpec, PublisherSpec, Timing

SCENARIO = "10 streams"
STREAM = {"x-queue-type": "stream"}
SAMPLE_S = 0.1
READ_STALL_S = 15.0  # a reader with nothing for this long has stopped (a stream's first read can take a moment)
RETENTION_SETTLE_S = 2.0  # after the last confirm, before the end figure: retention may run late
MIB = 1024 * 1024


class PeakSampler:
    """Calls `read` every `interval_s` on a thread of its own while in a `with` block; keeps
    the first, the highest and the last value. A read that raises (a process gone, a file
    removed meanwhile) is skipped."""

    def __init__(self, read: Callable[[], float | None], interval_s: float = SAMPLE_S) -> None:
        self._read = read
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)
        self.first: float | None = None
        self.peak: float | None = None
        self.last: float | None = None

    def sample(self) -> None:
        try:
            value = self._read()
        except OSError:
            return
        if value is None:
            return
        if self.first is None:
            self.first = value
        self.peak = value if self.peak is None else max(self.peak, value)
        self.last = value

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.sample()

    def __enter__(self) -> PeakSampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def stream_directory(root: str | Path, vhost: str, name: str) -> Path | None:
    """The directory holding stream `name`'s files under a broker's stream root: ours is
    `<sha1(vhost)>/<sha1(name)>` (persistence/stream_segment.stream_path); RabbitMQ 3.10's is
    the one entry whose name contains the queue's (`<vhost>_<name>_<timestamp>`, `/` as `_`)."""
    from persistence.stream_segment import stream_path

    root = Path(root)
    ours = stream_path(root.parent, vhost, name)
    if ours.parent.parent == root and ours.is_dir():
        return ours
    try:
        matches = [entry for entry in root.iterdir() if entry.is_dir() and name in entry.name]
    except FileNotFoundError:
        return None
    return max(matches, key=lambda entry: entry.stat().st_mtime) if matches else None


def disk_bytes(directory: Path) -> int:
    """Bytes allocated on disk (as `du` counts them) by the files under `directory`."""
    total = 0
    for parent, _, files in os.walk(directory):
        for file in files:
            try:
                total += os.stat(os.path.join(parent, file)).st_blocks * 512
            except FileNotFoundError:  # a segment dropped meanwhile
                continue
    return total


class StreamFixtures:
    """Per target, the filled N-message stream the readers read: the publish variant leaves its
    stream here (deleting the one before), the readers fill one if none is left, and the
    retention variant deletes it before it starts."""

    def __init__(self) -> None:
        self._streams: dict[str, tuple[str, int]] = {}  # target label -> (stream, messages)

    def keep(self, target: Target, stream: str, messages: int) -> None:
        self.drop(target)
        self._streams[target.label] = (stream, messages)

    def get(self, target: Target, opts: Options) -> str:
        kept = self._streams.get(target.label)
        if kept is not None and kept[1] == opts.stream_messages:
            return kept[0]
        stream = _declare_stream(target)
        try:
            _publish(target, stream, opts.stream_messages, opts.size, opts.stream_windows[0])
        except BaseException:
            _delete(target, stream)
            raise
        self.keep(target, stream, opts.stream_messages)
        return stream

    def drop(self, target: Target) -> None:
        kept = self._streams.pop(target.label, None)
        if kept is not None:
            _delete(target, kept[0])


FIXTURES = StreamFixtures()


def _declare_stream(target: Target, arguments: dict | None = None) -> str:
    stream = _unique("stream")
    declared = {**STREAM, **(arguments or {})}
    _with_channel(target.url, lambda ch: ch.queue_declare(stream, durable=True, arguments=declared))
    return stream


def _delete(target: Target, stream: str) -> None:
    _cleanup(target.url, [stream])


def _publish(target: Target, stream: str, count: int, size: int, window: int) -> Outcome:
    spec = PublisherSpec(target.url, "", (stream,), size, persistent=True, confirm_window=window)
    return run_workers([spec], [], Timing(0.0, None, count), target.pid)


def _rss_mib(target: Target) -> Callable[[], float | None]:
    pid = target.pid
    return (lambda: None) if pid is None else (lambda: procfs.rss_kib(pid) / 1024)


def cpu_per_message_us(outcome: Outcome, messages: int) -> float | None:
    """The broker's CPU (every core, every thread) per message over a count-mode run, in µs:
    steadier than the rates on a machine whose other load takes cores away."""
    if outcome.broker_cpu_s is None or not messages:
        return None
    return outcome.broker_cpu_s / messages * 1e6


def _publish_rows(outcome: Outcome) -> list[Row]:
    latencies = outcome.confirm_latencies_ms()
    rows = (_row("confirmed", "msg/s", outcome.publish_rate)
            + _row("confirm p50", "ms", percentile(latencies, 50))
            + _row("confirm p99", "ms", percentile(latencies, 99))
            + _cpu_rows(outcome))
    if outcome.timing.count_mode:
        confirmed = sum(r["sent"] for r in outcome.publishers)
        rows += _row("broker CPU per confirmed message", "µs", cpu_per_message_us(outcome, confirmed))
    return rows


# ---- the variants ---------------------------------------------------------------------------


def publish_fill(target: Target, opts: Options) -> list[Row]:
    """N messages with the first window in flight; the stream stays for the readers."""
    stream = _declare_stream(target)
    try:
        outcome = _publish(target, stream, opts.stream_messages, opts.size, opts.stream_windows[0])
    except BaseException:
        _delete(target, stream)
        raise
    FIXTURES.keep(target, stream, opts.stream_messages)
    return _publish_rows(outcome)


def publish_timed(target: Target, opts: Options, window: int) -> list[Row]:
    stream = _declare_stream(target)
    try:
        spec = PublisherSpec(target.url, "", (stream,), opts.size, persistent=True, confirm_window=window)
        outcome = run_workers([spec], [], Timing(opts.warmup_s, opts.duration_s or 5.0, None), target.pid)
    finally:
        _delete(target, stream)
    return _publish_rows(outcome)


def read_from_first(target: Target, opts: Options, consumers: int) -> list[Row]:
    """`consumers` consumers read the whole N-message stream from `first`, all at once."""
    stream = FIXTURES.get(target, opts)
    specs = [ConsumerSpec(target.url, stream, False, opts.stream_prefetch, arguments={"x-stream-offset": "first"},
                          consume_at_start=True) for _ in range(consumers)]
    with PeakSampler(_rss_mib(target)) as rss:
        outcome = run_workers([], _consumer_groups(specs, opts.consumer_procs), Timing(0.0, None, opts.stream_messages),
                              target.pid, opts.stream_messages * consumers, stall_s=READ_STALL_S)
        time.sleep(1.0)  # the consumers' connections are closed: what the broker gives back
    rows = (_row("delivered", "msg/s", outcome.delivery_rate) + _cpu_rows(outcome)
            + _row("broker CPU per delivery", "µs",
                   cpu_per_message_us(outcome, sum(r["total"] for r in outcome.consumers))))
    rows += (_row("broker RSS before", "MiB", rss.first) + _row("broker RSS peak", "MiB", rss.peak)
             + _row("broker RSS after", "MiB", rss.last))
    if rss.first is not None and rss.peak is not None:
        rows += _row("broker RSS peak - before", "MiB", rss.peak - rss.first)
    return rows


def retention(target: Target, opts: Options) -> list[Row]:
    """Disk use of a stream with x-max-length-bytes while 3x that is published into it."""
    FIXTURES.drop(target)  # the readers are done: its files and memory go before this measures
    if target.stream_dir is None:
        raise RuntimeError(f"the stream directory of {target.label} is unknown: pass --stream-dir {target.label}=DIR")
    limit = opts.stream_retention_bytes
    segment = opts.stream_segment_bytes
    stream = _declare_stream(target, {"x-max-length-bytes": limit, "x-stream-max-segment-size-bytes": segment})
    vhost = target.address.vhost
    found: list[Path] = []

    def on_disk() -> float | None:
        if not found:
            directory = stream_directory(target.stream_dir, vhost, stream)
            if directory is None:
                return None
            found.append(directory)
        return disk_bytes(found[0]) / MIB

    try:
        count = math.ceil(opts.stream_retention_publish_bytes / opts.stream_retention_body)
        with PeakSampler(on_disk) as disk:
            outcome = _publish(target, stream, count, opts.stream_retention_body, opts.stream_windows[0])
            time.sleep(RETENTION_SETTLE_S)
    finally:
        _delete(target, stream)
    if not found:
        raise RuntimeError(f"no directory of stream {stream} under {target.stream_dir}")
    bound = (limit + segment) / MIB
    return (_row("confirmed", "msg/s", outcome.publish_rate)
            + _row("stream on disk, peak", "MiB", disk.peak)
            + _row("stream on disk, end", "MiB", disk.last)
            + _row("peak / (max-length-bytes + 1 segment)", "ratio", None if disk.peak is None else disk.peak / bound))


def variants(opts: Options) -> list[Variant]:
    n = f"{opts.stream_messages:,}"
    fill, *timed = opts.stream_windows
    found = [Variant(SCENARIO, f"publish {n} with confirms, {fill} in flight", lambda t: publish_fill(t, opts))]
    found += [Variant(SCENARIO, f"publish with confirms, {w} in flight", lambda t, w=w: publish_timed(t, opts, w))
              for w in timed]
    prefetch = f"prefetch {opts.stream_prefetch}"
    found.append(Variant(SCENARIO, f"1 consumer from first, {n} messages, {prefetch}",
                         lambda t: read_from_first(t, opts, 1)))
    c = opts.stream_consumers
    found.append(Variant(SCENARIO, f"{c} consumers from first, {n} messages each, {prefetch}",
                         lambda t: read_from_first(t, opts, c)))
    mb = 1_000_000
    found.append(Variant(
        SCENARIO, f"retention: max-length-bytes {opts.stream_retention_bytes // mb} MB, segments "
        f"{opts.stream_segment_bytes // mb} MB, {opts.stream_retention_publish_bytes // mb} MB published "
        f"({opts.stream_retention_body} B bodies)", lambda t: retention(t, opts)))
    return found
