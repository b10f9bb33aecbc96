"""Does one client's storm of durable declarations stall everyone else?

One "storm" client pipelines COUNT durable queue declarations (all frames sent without
waiting, as a raw client or pika with many declares in flight does) and waits for every
declare-ok; then it pipelines COUNT deletions of them. Meanwhile a "probe" client on its own
connection does one round trip after another (basic.qos, answered at once by any broker)
and records how long each took. The report gives, for the idle broker and for each phase
of the storm, the probe's round trips (count, p50, p99, max) and the storm's duration.

    python -m bench.definitions_storm                      # 10,000 declares, this checkout's broker
    python -m bench.definitions_storm --count 2000 --broker-path /tmp/old-checkout
    python -m bench.definitions_storm --url amqp://guest:guest@127.0.0.1:5672/   # a running broker

Without --url the broker is started from --broker-path (default: this checkout) with
`python -m amqp_server` on a free port and a temporary data directory (fsync on, the
default), through bench/gc_timed_broker.py: the report then also gives the broker's full
garbage-collection passes during each phase, timed from inside it (wall clock, and the broker
thread's CPU time, which a loaded machine does not inflate). Storm and probe run in processes
of their own, so neither waits for the other's Python. Results in docs/benchmarks.md
("Durable definition storms").
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

from pamqp import commands, frame, header

PROBE_IDLE_S = 1.0


# -- a minimal blocking AMQP client (raw frames, pipelining allowed) ----------------------


class RawConnection:
    def __init__(self, url: str) -> None:
        parsed = urllib.parse.urlparse(url)
        self.sock = socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 5672))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""
        user, password = urllib.parse.unquote(parsed.username or "guest"), urllib.parse.unquote(parsed.password or "guest")
        vhost = urllib.parse.unquote(parsed.path[1:]) if len(parsed.path) > 1 else "/"
        self.sock.sendall(frame.marshal(header.ProtocolHeader(), 0))
        self.expect(commands.Connection.Start)
        self.send(0, commands.Connection.StartOk(client_properties={"product": "definitions-storm"},
                                                 mechanism="PLAIN", response=f"\0{user}\0{password}"))
        tune = self.expect(commands.Connection.Tune)
        self.send(0, commands.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0))
        self.send(0, commands.Connection.Open(virtual_host=vhost))
        self.expect(commands.Connection.OpenOk)
        self.send(1, commands.Channel.Open())
        self.expect(commands.Channel.OpenOk)

    def send(self, channel: int, method) -> None:
        self.sock.sendall(frame.marshal(method, channel))

    def read_method(self):
        while True:
            if len(self.buffer) >= 7:
                size = int.from_bytes(self.buffer[3:7], "big")
                if len(self.buffer) >= size + 8:
                    consumed, _channel, value = frame.unmarshal(self.buffer)
                    self.buffer = self.buffer[consumed:]
                    if isinstance(value, (commands.Connection.Close, commands.Channel.Close)):
                        raise RuntimeError(f"broker closed: {value.reply_code} {value.reply_text}")
                    return value
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise RuntimeError("broker closed the socket")
            self.buffer += chunk

    def expect(self, kind):
        value = self.read_method()
        if not isinstance(value, kind):
            raise RuntimeError(f"expected {kind.__name__}, got {value!r}")
        return value

    def pipeline(self, methods: list, reply: type) -> None:
        """Send every method without waiting (from a thread, so replies are read meanwhile)."""
        data = b"".join(frame.marshal(method, 1) for method in methods)
        sender = threading.Thread(target=self.sock.sendall, args=(data,))
        sender.start()
        for _ in methods:
            self.expect(reply)
        sender.join()


# -- the two client processes -------------------------------------------------------------


def storm(url: str, count: int, prefix: str, go: mp.Event, phases: mp.Queue) -> None:
    connection = RawConnection(url)
    names = [f"{prefix}-{i}" for i in range(count)]
    go.wait()
    for phase, methods, reply in (
        ("declare", [commands.Queue.Declare(queue=n, durable=True) for n in names], commands.Queue.DeclareOk),
        ("delete", [commands.Queue.Delete(queue=n) for n in names], commands.Queue.DeleteOk),
    ):
        started = time.monotonic()
        connection.pipeline(methods, reply)
        phases.put((phase, started, time.monotonic()))
    phases.put(("done", 0.0, 0.0))


def probe(url: str, stop: mp.Event, samples: mp.Queue) -> None:
    connection = RawConnection(url)
    taken: list[tuple[float, float]] = []
    while not stop.is_set():
        sent = time.monotonic()
        connection.send(1, commands.Basic.Qos(prefetch_count=0))
        connection.expect(commands.Basic.QosOk)
        taken.append((sent, time.monotonic() - sent))
    samples.put(taken)


# -- the broker ---------------------------------------------------------------------------


def start_broker(broker_path: Path, workdir: Path, gc_log: Path) -> tuple[subprocess.Popen, str]:
    """Start the broker of `broker_path`; it writes its garbage-collection passes to `gc_log` when it stops."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(broker_path)}
    log = open(workdir / "broker.log", "wb")
    timed_broker = Path(__file__).resolve().with_name("gc_timed_broker.py")
    process = subprocess.Popen(
        [sys.executable, str(timed_broker), str(gc_log), "--",
         "--host", "127.0.0.1", "--port", str(port),
         "--data-dir", str(workdir / "data"), "--metrics-port", "0", "--management-port", "0"],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(workdir),
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process, f"amqp://guest:guest@127.0.0.1:{port}/"
        except OSError:
            if process.poll() is not None:
                raise RuntimeError(f"broker exited: {(workdir / 'broker.log').read_text()[-2000:]}")
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("broker did not start listening")


# -- the report ---------------------------------------------------------------------------


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))] if ordered else float("nan")


def summarise(label: str, samples: list[tuple[float, float]], start: float, end: float) -> str:
    # A round trip belongs to the phase it overlaps: one sent before the phase started but
    # answered during it was stalled by it.
    rtts = [rtt * 1000 for sent, rtt in samples if sent < end and sent + rtt > start]
    return (f"{label:<22} {end - start:>9.2f} s {len(rtts):>8} {percentile(rtts, 50):>9.2f} "
            f"{percentile(rtts, 99):>9.2f} {max(rtts, default=float('nan')):>10.2f}")


def run(url: str, count: int) -> tuple[str, dict[str, tuple[float, float]]]:
    """The probe's round trips per phase (a table), and each phase's (start, end) in time.monotonic."""
    ctx = mp.get_context("spawn")
    go, stop = ctx.Event(), ctx.Event()
    phases, samples = ctx.Queue(), ctx.Queue()
    prefix = f"storm-{os.getpid()}"
    storm_process = ctx.Process(target=storm, args=(url, count, prefix, go, phases))
    probe_process = ctx.Process(target=probe, args=(url, stop, samples))
    storm_process.start()
    probe_process.start()
    time.sleep(PROBE_IDLE_S + 1.0)  # both connected; the probe measures the idle broker
    if not (storm_process.is_alive() and probe_process.is_alive()):
        storm_process.kill()
        probe_process.kill()
        raise RuntimeError("a client could not connect (see its traceback above)")
    idle_end = time.monotonic()
    go.set()
    recorded: dict[str, tuple[float, float]] = {}
    while True:
        try:
            phase, started, ended = phases.get(timeout=1.0)
        except queue.Empty:
            if not storm_process.is_alive():
                probe_process.kill()
                raise RuntimeError("the storm client died (see its traceback above)") from None
            continue
        if phase == "done":
            break
        recorded[phase] = (started, ended)
    stop.set()
    taken = samples.get()
    storm_process.join()
    probe_process.join()
    phases = {"idle": (idle_end - PROBE_IDLE_S, idle_end)}
    phases.update((f"{count} {phase}s", span) for phase, span in recorded.items())
    lines = [
        f"{count} durable queues, declared then deleted, pipelined on one connection; "
        "probe = basic.qos round trips on another connection",
        f"{'phase':<22} {'duration':>11} {'probe RTs':>8} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>10}",
    ]
    for phase, (started, ended) in phases.items():
        lines.append(summarise(phase, taken, started, ended))
    return "\n".join(lines), phases


def gc_report(gc_log: Path, phases: dict[str, tuple[float, float]]) -> str:
    """The broker's full garbage-collection passes that began during each phase."""
    passes = json.loads(gc_log.read_text())["full_passes"]
    lines = [
        "broker's full (generation 2) garbage-collection passes, timed inside the broker",
        f"{'phase':<22} {'passes':>8} {'max wall ms':>12} {'max CPU ms':>11} {'freed':>9}",
    ]
    for phase, (started, ended) in phases.items():
        during = [p for p in passes if started <= p["at"] < ended]
        lines.append(
            f"{phase:<22} {len(during):>8} {max((p['wall_ms'] for p in during), default=0.0):>12.2f} "
            f"{max((p['cpu_ms'] for p in during), default=0.0):>11.2f} {sum(p['collected'] for p in during):>9}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.definitions_storm", description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=10000, help="durable queues to declare, then delete")
    parser.add_argument("--url", help="a running broker (default: start one)")
    parser.add_argument("--broker-path", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="the checkout whose broker to start (PYTHONPATH for `python -m amqp_server`)")
    args = parser.parse_args(argv)
    print(f"load: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    if args.url:
        print(run(args.url, args.count)[0])
        return 0
    with tempfile.TemporaryDirectory(prefix="definitions-storm-") as workdir:
        gc_log = Path(workdir) / "gc.json"
        process, url = start_broker(args.broker_path, Path(workdir), gc_log)
        try:
            print(f"broker: {args.broker_path}")
            table, phases = run(url, args.count)
            print(table)
        finally:
            process.terminate()
            process.wait(30)
        print(gc_report(gc_log, phases))
    print(f"load: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
