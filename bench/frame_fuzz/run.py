"""One fuzzing run: the connections, the well-behaved client beside them, and the report."""

from __future__ import annotations

import asyncio
import multiprocessing
import socket
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty
from typing import Any

from pamqp import commands, frame

from bench.frame_fuzz.broker_log import LogFailure, log_failures
from bench.frame_fuzz.corpus import FRAME_MAX, corpus_scripts
from bench.frame_fuzz.mutations import SESSION_BYTE_BUDGET, session_frames
from bench.procfs import rss_kib

CONCURRENCY = 24
# Socket and transport buffer of a fuzzing connection (see Fuzzer._connect).
SEND_BUFFER = 32 * 1024
# The well-behaved client.
PROBE_INTERVAL_S = 0.2
ROUND_TRIP_BOUND_S = 5.0

CLOSE_OK_FRAME = frame.marshal(commands.Connection.CloseOk(), 0)
_CONNECTION_CLOSE = b"\x00\x0a\x00\x32"


@dataclass
class FuzzReport:
    """What one run sent and saw: a record the Fuzzer running it fills in."""

    seed: int
    frames: int = 0
    bytes_sent: int = 0
    connections: int = 0
    closed_by_broker: int = 0  # connections the broker closed with connection.close (an error)
    duration_s: float = 0.0
    baseline_rss_kib: int = 0
    peak_rss_kib: int = 0
    final_rss_kib: int = 0
    rss_bound_kib: int = 0
    round_trips: int = 0
    max_round_trip_s: float = 0.0
    broker_alive: bool = True
    log_failures: list[LogFailure] = field(default_factory=list)
    probe_failures: list[str] = field(default_factory=list)
    # Local port -> connection number, so a log line naming a peer leads to its replay.
    ports: dict[int, int] = field(default_factory=dict)

    @property
    def known_findings(self) -> dict[str, int]:
        """Failures that are issue-10 findings fixed elsewhere (KNOWN_FINDINGS), with their counts."""
        found: dict[str, int] = {}
        for failure in self.log_failures:
            if failure.known is not None:
                found[failure.known] = found.get(failure.known, 0) + failure.count
        return found

    def problems(self) -> list[str]:
        """Everything the run found except the known findings: empty when the broker held up."""
        found = []
        if not self.broker_alive:
            found.append("the broker process died")
        if self.peak_rss_kib > self.rss_bound_kib:
            found.append(f"peak RSS {self.peak_rss_kib} KiB over the bound of {self.rss_bound_kib} KiB")
        for failure in self.log_failures:
            if failure.known is None:
                replays = ", ".join(str(self.ports[port]) for port in failure.ports[:5] if port in self.ports)
                found.append(f"{failure.count} x {failure.signature} (connections {replays or '?'}):\n{failure.example}")
        found += [f"well-behaved client: {text}" for text in self.probe_failures]
        return found

    def summary(self) -> str:
        known = "".join(f"\n  known finding, {count} x: {name}" for name, count in self.known_findings.items())
        return (
            f"seed {self.seed}: {self.frames} frames ({self.bytes_sent / 1e6:.1f} MB) on {self.connections} connections "
            f"({self.closed_by_broker} closed by the broker with an error) "
            f"in {self.duration_s:.1f} s; RSS {self.baseline_rss_kib // 1024} MiB at start, peak "
            f"{self.peak_rss_kib // 1024} MiB (bound {self.rss_bound_kib // 1024} MiB), "
            f"{self.final_rss_kib // 1024} MiB at the end; well-behaved client: "
            f"{self.round_trips} round trips, max {self.max_round_trip_s * 1000:.0f} ms{known}"
        )


def rss_bound_kib(baseline_kib: int, concurrency: int) -> int:
    """What the broker may hold at most: its RSS at start, plus for every fuzzing connection
    its session budget and a frame_max read buffer, twice over (the bytes read and parsed into
    frames, and the messages they become; queues share one Message), plus 64 MiB for the
    allocator's fragmentation and the garbage the collector has not reached yet. A connection's
    exclusive queues go with it; what a mangled declare leaves behind is small and unrouted."""
    per_connection = 2 * (SESSION_BYTE_BUDGET + FRAME_MAX) // 1024
    return baseline_kib + concurrency * per_connection + 64 * 1024


def _probe(host: str, port: int, stop: Any, last_answer: Any, stats: Any) -> None:
    """The well-behaved client: a confirmed publish and a basic.get, every PROBE_INTERVAL_S.

    Runs in its own process (so the fuzzer's work does not delay it): `stop` is an Event,
    `last_answer` a shared double it sets to the time of each answer, and `stats` a Queue that
    gets (round trips, slowest, error or None) at the end."""
    import pika

    round_trips = 0
    slowest = 0.0
    try:
        parameters = pika.ConnectionParameters(host=host, port=port, heartbeat=0, blocked_connection_timeout=60)
        connection = pika.BlockingConnection(parameters)
        channel = connection.channel()
        channel.confirm_delivery()
        queue = channel.queue_declare("", exclusive=True).method.queue
        while not stop.is_set():
            started = time.monotonic()
            channel.basic_publish("", queue, b"probe", mandatory=True)
            method, _properties, body = channel.basic_get(queue, auto_ack=True)
            if method is None or body != b"probe":
                raise AssertionError(f"basic.get returned {method!r} {body!r}")
            elapsed = time.monotonic() - started
            last_answer.value = time.monotonic()
            round_trips += 1
            slowest = max(slowest, elapsed)
            stop.wait(PROBE_INTERVAL_S)
        connection.close()
        stats.put((round_trips, slowest, None))
    except Exception as error:  # reported to the fuzzer, which fails the run
        stats.put((round_trips, slowest, f"{type(error).__name__}: {error}"))


class Fuzzer:
    """Runs the fuzzing connections against one broker and watches it."""

    def __init__(self, host: str, port: int, pid: int, log_path: Path, seed: int, frames: int | None,
                 duration_s: float | None, concurrency: int = CONCURRENCY, only_connection: int | None = None) -> None:
        self.host, self.port, self.pid, self.log_path = host, port, pid, log_path
        self.frame_target = frames
        self.duration_s = duration_s
        self.concurrency = 1 if only_connection is not None else concurrency
        self.only_connection = only_connection
        self.report = FuzzReport(seed=seed)
        self.scripts = corpus_scripts()
        self._next_connection = 0 if only_connection is None else only_connection
        self._deadline = 0.0
        self._stop = asyncio.Event()
        self._last_answer: Any = None  # the well-behaved client's shared clock, set by run()

    def _done(self) -> bool:
        if self._stop.is_set():
            return True
        if self.frame_target is not None and self.report.frames >= self.frame_target:
            return True
        return self.duration_s is not None and time.monotonic() >= self._deadline

    def _take_connection_number(self) -> int | None:
        if self.only_connection is not None and self._next_connection > self.only_connection:
            return None
        number = self._next_connection
        self._next_connection += 1
        return number

    async def _worker(self) -> None:
        while not self._done():
            number = self._take_connection_number()
            if number is None:
                return
            await self._run_connection(number, session_frames(self.report.seed, number, self.scripts))

    async def _run_connection(self, number: int, frames: list[bytes]) -> None:
        """Send the session in batches until it ends or the broker closes the connection."""
        try:
            reader, writer = await self._connect()
        except OSError as error:
            self.report.probe_failures.append(f"fuzz connection {number} could not connect: {error}")
            self._stop.set()
            return
        self.report.connections += 1
        self.report.ports[writer.get_extra_info("sockname")[1]] = number
        answers = asyncio.create_task(self._read_until_closed(reader, writer))
        try:
            for start in range(0, len(frames), 16):
                if answers.done() or self._done():
                    break
                batch = frames[start : start + 16]
                data = b"".join(batch)
                writer.write(data)
                await writer.drain()
                self.report.frames += len(batch)
                self.report.bytes_sent += len(data)
            # Give the broker the time to answer (and close what it must) before we hang up.
            if await asyncio.wait_for(asyncio.shield(answers), 0.2):
                self.report.closed_by_broker += 1
        except (OSError, asyncio.TimeoutError):
            pass
        finally:
            answers.cancel()
            writer.close()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection that cannot run far ahead of the broker: small socket and transport
        buffers, so frames counted as sent are frames the broker was about to read, not
        megabytes queued in the kernel that a close would throw away."""
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, (self.host, self.port))
        except OSError:
            sock.close()
            raise
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.transport.set_write_buffer_limits(high=SEND_BUFFER)
        return reader, writer

    @staticmethod
    async def _read_until_closed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Drop what the broker sends; at its connection.close answer close-ok, as a client must,
        and return True (the session stops: frames after it would only be discarded). False when
        the socket closed without one."""
        buffer = bytearray()
        while data := await reader.read(1 << 16):
            buffer += data
            offset = 0
            while len(buffer) - offset >= 8:
                kind, channel, size = struct.unpack_from(">BHI", buffer, offset)
                if len(buffer) - offset < size + 8:
                    break
                if kind == 1 and channel == 0 and buffer[offset + 7 : offset + 11] == _CONNECTION_CLOSE:
                    writer.write(CLOSE_OK_FRAME)
                    return True
                offset += size + 8
            del buffer[:offset]
        return False

    async def _watch(self) -> None:
        """Sample RSS and the well-behaved client until the run ends; stop it at the first problem."""
        while not self._done():
            try:
                self.report.peak_rss_kib = max(self.report.peak_rss_kib, rss_kib(self.pid))
            except (OSError, RuntimeError):  # the process is gone (or a zombie without VmRSS)
                self.report.broker_alive = False
                self._stop.set()
                return
            silent = time.monotonic() - self._last_answer.value
            if silent > ROUND_TRIP_BOUND_S + PROBE_INTERVAL_S:
                self.report.probe_failures.append(f"no answer for {silent:.1f} s")
                self._stop.set()
                return
            await asyncio.sleep(0.1)

    def run(self) -> FuzzReport:
        context = multiprocessing.get_context("spawn")
        stop = context.Event()
        self._last_answer = context.Value("d", time.monotonic() + 10.0)  # pika's start-up is not a stall
        stats = context.Queue()
        probe = context.Process(target=_probe, args=(self.host, self.port, stop, self._last_answer, stats), daemon=True)
        log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.report.baseline_rss_kib = self.report.peak_rss_kib = rss_kib(self.pid)
        self.report.rss_bound_kib = rss_bound_kib(self.report.baseline_rss_kib, self.concurrency)
        probe.start()
        started = time.monotonic()
        try:
            asyncio.run(self._run_all(started))
        finally:
            self.report.duration_s = time.monotonic() - started
            stop.set()
            self._collect_probe(probe, stats)
        try:  # after the connections are gone: what stays is what they leaked (or left in queues)
            self.report.final_rss_kib = rss_kib(self.pid)
        except (OSError, RuntimeError):  # gone, or a zombie without VmRSS
            self.report.broker_alive = False
        with open(self.log_path, "rb") as log:
            log.seek(log_offset)
            self.report.log_failures = log_failures(log.read().decode(errors="replace"))
        return self.report

    async def _run_all(self, started: float) -> None:
        self._deadline = started + (self.duration_s or float("inf"))
        watcher = asyncio.create_task(self._watch())
        await asyncio.gather(*(self._worker() for _ in range(self.concurrency)))
        self._stop.set()
        await watcher

    def _collect_probe(self, probe: Any, stats: Any) -> None:
        try:
            round_trips, slowest, error = stats.get(timeout=ROUND_TRIP_BOUND_S + 5)
        except Empty:
            round_trips, slowest, error = 0, 0.0, "the well-behaved client never reported (stalled)"
        probe.join(5)
        if probe.is_alive():
            probe.kill()
        self.report.round_trips = round_trips
        self.report.max_round_trip_s = slowest
        if error is not None:
            self.report.probe_failures.append(error)
        if slowest > ROUND_TRIP_BOUND_S:
            self.report.probe_failures.append(f"a round trip took {slowest:.1f} s (bound {ROUND_TRIP_BOUND_S} s)")
