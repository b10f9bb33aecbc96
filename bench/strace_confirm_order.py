"""Check with strace that every publisher confirm leaves the broker after its record's fsync.

Runs a broker under `strace -f -tt -T -yy -xx` (or attaches to a running one with -p),
publishes N persistent messages with confirms to a fresh durable queue, and reads the trace:

* the *record write* of message k is the first write to a regular file whose bytes contain
  message k's body (each body is unique: `STRACE-<k>-` plus padding);
* the *confirm* of k is the socket write to this client holding the basic.ack
  (class 60, method 80) whose delivery tag covers k (`multiple` covers all tags up to it);
* k is durable-before-confirm when an fsync/fdatasync of the record's file *started* after
  the record write returned and *returned* before the confirm write started.

Prints one summary line per run: confirms and messages checked, violations, fsync count.
Exit code 1 when a confirm went out before its fsync.

    python -m bench.strace_confirm_order                          # this project's broker
    python -m bench.strace_confirm_order --in-flight 64 -n 5000   # many publishes in flight
    python -m bench.strace_confirm_order --queue-type stream      # a stream's records
    python -m bench.strace_confirm_order --attach-pid $(pidof beam.smp) --port 5672  # RabbitMQ

Needs strace (apt-get install strace) and ptrace rights over the broker. Results and how to
read them: docs/durability.md.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from bisect import bisect_left
from dataclasses import dataclass, field
from pathlib import Path

from pamqp import commands, frame, header
from pamqp.body import ContentBody

TRACED = "write,writev,pwrite64,pwritev,pwritev2,sendto,sendmsg,fsync,fdatasync"
FILE_WRITES = {"write", "writev", "pwrite64", "pwritev", "pwritev2"}
SOCKET_WRITES = FILE_WRITES | {"sendto", "sendmsg"}
SYNCS = {"fsync", "fdatasync"}
STRING_LIMIT = 8 * 1024 * 1024  # strace -s: every written byte must be in the trace


# -- a blocking publisher with confirms ---------------------------------------------------------


class ConfirmingPublisher:
    """Just enough AMQP 0-9-1: PLAIN login, one channel in confirm mode (or, `transactional`, in
    tx mode), publish, read acks (or commit-oks)."""

    def __init__(self, host: str, port: int, user: str, password: str, transactional: bool = False) -> None:
        self.sock = socket.create_connection((host, port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.local_port = self.sock.getsockname()[1]
        self.buffer = b""
        self.sock.sendall(b"AMQP\x00\x00\x09\x01")
        self._expect(commands.Connection.Start)
        self._send(commands.Connection.StartOk(
            client_properties={"capabilities": {"publisher_confirms": True}},
            mechanism="PLAIN", response=f"\0{user}\0{password}",
        ))
        tune = self._expect(commands.Connection.Tune)
        self._send(commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0))
        self._send(commands.Connection.Open("/"))
        self._expect(commands.Connection.OpenOk)
        self._send(commands.Channel.Open(), 1)
        self._expect(commands.Channel.OpenOk)
        if transactional:
            self._send(commands.Tx.Select(), 1)
            self._expect(commands.Tx.SelectOk)
        else:
            self._send(commands.Confirm.Select(), 1)
            self._expect(commands.Confirm.SelectOk)

    def _send(self, value, channel: int = 0) -> None:
        self.sock.sendall(frame.marshal(value, channel))

    def _read(self):
        while True:
            if len(self.buffer) >= 8:
                size = struct.unpack_from(">I", self.buffer, 3)[0]
                if len(self.buffer) >= size + 8:
                    consumed, _, value = frame.unmarshal(self.buffer)
                    self.buffer = self.buffer[consumed:]
                    return value
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("broker closed the connection")
            self.buffer += chunk

    def _expect(self, kind):
        value = self._read()
        if not isinstance(value, kind):
            raise RuntimeError(f"expected {kind.__name__}, got {value!r}")
        return value

    def rpc(self, method, reply_kind):
        self._send(method, 1)
        return self._expect(reply_kind)

    def publish_all(self, queue: str, bodies: list[bytes], in_flight: int) -> int:
        """Publish every body (persistent) keeping at most `in_flight` unconfirmed; return nacks."""
        properties = {"delivery_mode": 2}
        sent = confirmed = nacks = 0
        while confirmed < len(bodies):
            while sent < len(bodies) and sent - confirmed < in_flight:
                body = bodies[sent]
                self.sock.sendall(
                    frame.marshal(commands.Basic.Publish(routing_key=queue), 1)
                    + frame.marshal(header.ContentHeader(0, len(body), commands.Basic.Properties(**properties)), 1)
                    + frame.marshal(ContentBody(body), 1)
                )
                sent += 1
            reply = self._read()
            if isinstance(reply, (commands.Basic.Ack, commands.Basic.Nack)):
                done = reply.delivery_tag if reply.multiple else confirmed + 1
                nacks += isinstance(reply, commands.Basic.Nack) * (done - confirmed)
                confirmed = max(confirmed, done)
        return nacks

    def publish_in_transactions(self, queue: str, bodies: list[bytes], per_transaction: int) -> None:
        """Publish every body (persistent), `per_transaction` of them per tx.commit (tx mode)."""
        for first in range(0, len(bodies), per_transaction):
            self.sock.sendall(b"".join(
                frame.marshal(commands.Basic.Publish(routing_key=queue), 1)
                + frame.marshal(header.ContentHeader(0, len(body), commands.Basic.Properties(delivery_mode=2)), 1)
                + frame.marshal(ContentBody(body), 1)
                for body in bodies[first:first + per_transaction]))
            self.rpc(commands.Tx.Commit(), commands.Tx.CommitOk)

    def close(self) -> None:
        self._send(commands.Connection.Close(200, "done", 0, 0))
        try:
            self._expect(commands.Connection.CloseOk)
        finally:
            self.sock.close()


def message_bodies(count: int, size: int) -> list[bytes]:
    return [f"STRACE-{k:010d}-".encode().ljust(size, b".") for k in range(1, count + 1)]


# -- reading the trace --------------------------------------------------------------------------


@dataclass
class Call:
    name: str
    start: float
    end: float
    target: str  # what strace -yy printed for the fd: a path or TCP:[local->remote]
    data: bytes = b""
    truncated: bool = False


LINE = re.compile(r"^(\d+)\s+(?:(\d+):(\d+):)?(\d+\.\d+)\s+(.*)$")  # -tt (time of day) or -ttt (epoch)
CALL = re.compile(r"^(\w+)\((\d+)<(\w+:\[(?:[^\[\]]|\[[^\]]*\])*\]|[^>]*)>(.*)\)\s+=\s+(-?\d+)(?:\s+\w+\s+\([^)]*\))?\s+<(\d+\.\d+)>$", re.S)
STRING = re.compile(r'"((?:\\x[0-9a-f]{2})*)"(\.\.\.)?')


def parse_trace(path: Path) -> list[Call]:
    """Calls with start/end times, fd target and written bytes; joins unfinished/resumed halves."""
    calls: list[Call] = []
    pending: dict[str, tuple[float, str]] = {}
    with open(path, errors="replace") as trace:
        for line in trace:
            match = LINE.match(line.rstrip("\n"))
            if not match:
                continue
            pid, hours, minutes, seconds, rest = match.groups()
            at = (int(hours) * 3600 + int(minutes) * 60 if hours else 0) + float(seconds)
            if rest.endswith("<unfinished ...>"):
                pending[pid] = (at, rest[: -len("<unfinished ...>")].rstrip())
                continue
            resumed = re.match(r"^<\.\.\. \w+ resumed>(.*)$", rest)
            if resumed:
                if pid not in pending:
                    continue
                at, head = pending.pop(pid)
                rest = head + resumed.group(1)
            call = CALL.match(rest)
            if not call:
                continue
            name, _fd, target, arguments, result, duration = call.groups()
            if "\\x" in target:  # -xx escapes paths too
                target = bytes.fromhex(target.replace("\\x", "")).decode(errors="replace")
            if int(result) < 0:
                continue
            strings = STRING.findall(arguments)
            data = b"".join(bytes.fromhex(s.replace("\\x", "")) for s, _ in strings)
            truncated = any(dots for _, dots in strings)
            if name in SOCKET_WRITES:
                data = data[: int(result)]
            calls.append(Call(name, at, at + float(duration), target, data, truncated))
    calls.sort(key=lambda c: c.start)
    return calls


def methods_in(stream: bytes) -> list[tuple[int, int, int]]:
    """(class id, method id, stream offset) of each method frame in a stream of frames."""
    found, offset = [], 0
    while offset + 8 <= len(stream):
        kind, _channel, size = struct.unpack_from(">BHI", stream, offset)
        if kind == 1 and size >= 4:
            found.append((*struct.unpack_from(">HH", stream, offset + 7), offset))
        offset += 8 + size
    return found


def confirms_in(stream: bytes) -> list[tuple[int, bool, bool, int]]:
    """(delivery_tag, multiple, is_ack, stream offset) for each basic.ack/nack frame."""
    found = []
    for class_id, method_id, offset in methods_in(stream):
        if class_id == 60 and method_id in (80, 120):
            tag, bits = struct.unpack_from(">QB", stream, offset + 11)
            found.append((tag, bool(bits & 1), method_id == 80, offset))
    return found


class ClientStream:
    """What the broker wrote to the client on `client_port`, in order, and when each byte left
    (the start of the socket write that carried it)."""

    def __init__(self, calls: list[Call], client_port: int) -> None:
        to_client = [c for c in calls if c.name in SOCKET_WRITES and c.target.endswith(f":{client_port}]")]
        self.data = b"".join(c.data for c in to_client)
        self._offsets, self._starts, offset = [], [], 0
        for call in to_client:
            self._offsets.append(offset)
            self._starts.append(call.start)
            offset += len(call.data)

    def sent_at(self, offset: int) -> float:
        return self._starts[bisect_left(self._offsets, offset + 1) - 1]


def confirm_times(calls: list[Call], client_port: int) -> tuple[dict[int, float], int]:
    """Delivery tag -> start of the socket write to the client on `client_port` that carried the
    basic.ack or basic.nack covering it (`multiple` covers every tag up to it); and the number of
    ack/nack frames."""
    stream = ClientStream(calls, client_port)
    confirmed_at: dict[int, float] = {}
    highest = frames = 0
    for tag, multiple, _is_ack, offset in confirms_in(stream.data):
        frames += 1
        for covered in range(highest + 1 if multiple else tag, tag + 1):
            confirmed_at.setdefault(covered, stream.sent_at(offset))
        highest = max(highest, tag)
    return confirmed_at, frames


def commit_ok_times(calls: list[Call], client_port: int, per_transaction: int) -> tuple[dict[int, float], int]:
    """Message number (1, 2, ... in publish order, `per_transaction` per tx.commit) -> start of
    the socket write that carried its transaction's tx.commit-ok; and the number of commit-oks."""
    stream = ClientStream(calls, client_port)
    committed_at: dict[int, float] = {}
    commits = [offset for class_id, method_id, offset in methods_in(stream.data) if (class_id, method_id) == (90, 21)]
    for transaction, offset in enumerate(commits):
        for number in range(transaction * per_transaction + 1, (transaction + 1) * per_transaction + 1):
            committed_at[number] = stream.sent_at(offset)
    return committed_at, len(commits)


@dataclass
class Verdict:
    confirms: int = 0
    messages: int = 0
    violations: list[str] = field(default_factory=list)
    unmatched: int = 0
    syncs: int = 0
    record_files: set[str] = field(default_factory=set)

    def summary(self, label: str) -> str:
        per_sync = self.messages / self.syncs if self.syncs else float("nan")
        return (
            f"{label}: confirms checked {self.confirms}, messages checked {self.messages}, "
            f"violations {len(self.violations)}, records not found {self.unmatched}, "
            f"fsync/fdatasync calls on record files {self.syncs} ({per_sync:.1f} messages per sync)"
        )


def check(calls: list[Call], bodies: list[bytes], client_port: int) -> Verdict:
    """Compare, for every message, record write -> fsync -> confirm write (see module docstring)."""
    if any(c.truncated for c in calls if c.name in SOCKET_WRITES):
        raise SystemExit("strace truncated written data; raise STRING_LIMIT")
    verdict = Verdict()
    confirm_time, verdict.confirms = confirm_times(calls, client_port)
    file_writes = [c for c in calls if c.name in FILE_WRITES and c.target.startswith("/")]
    syncs_by_file: dict[str, list[Call]] = {}
    for call in calls:
        if call.name in SYNCS:
            syncs_by_file.setdefault(call.target, []).append(call)
    for k, body in enumerate(bodies, start=1):
        confirmed_at = confirm_time.get(k)
        if confirmed_at is None:
            continue
        verdict.messages += 1
        record = next((c for c in file_writes if body in c.data), None)
        if record is None:
            verdict.unmatched += 1
            continue
        verdict.record_files.add(record.target)
        durable = any(
            s.start >= record.end and s.end <= confirmed_at for s in syncs_by_file.get(record.target, [])
        )
        if not durable:
            synced_later = [s.end - confirmed_at for s in syncs_by_file.get(record.target, []) if s.start >= record.end]
            when = f"first fsync after the write ended {min(synced_later) * 1e6:.0f} us after the confirm" if synced_later else "no fsync after the write"
            verdict.violations.append(f"message {k}: confirmed {(confirmed_at - record.end) * 1e6:.0f} us after its write to {record.target}; {when}")
    verdict.syncs = sum(len(syncs_by_file.get(path, [])) for path in verdict.record_files)
    return verdict


# -- running a broker under strace --------------------------------------------------------------


def wait_for_port(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing listens on port {port}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def strace_command(trace_file: Path) -> list[str]:
    strace = shutil.which("strace")
    if strace is None:
        raise SystemExit("strace is not installed (apt-get install strace)")
    return [strace, "-f", "-tt", "-T", "-yy", "-xx", "-s", str(STRING_LIMIT), "-e", f"trace={TRACED}", "-o", str(trace_file)]


def publish(port: int, args: argparse.Namespace, bodies: list[bytes]) -> int:
    publisher = ConfirmingPublisher("127.0.0.1", port, args.user, args.password)
    queue = f"strace-confirm-order-{uuid.uuid4().hex[:8]}"
    arguments = {"x-queue-type": args.queue_type} if args.queue_type != "classic" else {}
    publisher.rpc(commands.Queue.Declare(queue=queue, durable=True, arguments=arguments), commands.Queue.DeclareOk)
    nacks = publisher.publish_all(queue, bodies, args.in_flight)
    publisher.rpc(commands.Queue.Delete(queue=queue), commands.Queue.DeleteOk)
    publisher.close()
    if nacks:
        print(f"warning: {nacks} messages were nacked", file=sys.stderr)
    return publisher.local_port


def run_own_broker(args: argparse.Namespace, workdir: Path, bodies: list[bytes]) -> tuple[Path, int]:
    trace_file, port, data_dir = workdir / "broker.strace", free_port(), workdir / "data"
    config = Path(args.config) if args.config else workdir / "broker.toml"
    if not args.config:
        config.write_text("")
    broker = [sys.executable, "-m", "amqp_server", "--host", "127.0.0.1", "--port", str(port),
              "--data-dir", str(data_dir), "--config", str(config), "--metrics-port", "0", "--management-port", "0"]
    log = open(workdir / "broker.log", "wb")
    tracer = subprocess.Popen([*strace_command(trace_file), *broker], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port)
        client_port = publish(port, args, bodies)
    finally:
        children = Path(f"/proc/{tracer.pid}/task/{tracer.pid}/children")
        for pid in children.read_text().split() if children.exists() else []:
            os.kill(int(pid), signal.SIGTERM)
        tracer.wait(timeout=60)
        log.close()
    return trace_file, client_port


def run_attached(args: argparse.Namespace, workdir: Path, bodies: list[bytes]) -> tuple[Path, int]:
    trace_file = workdir / "attached.strace"
    tracer = subprocess.Popen([*strace_command(trace_file), "-p", str(args.attach_pid)], stderr=subprocess.PIPE)
    time.sleep(2.0)  # strace prints nothing when attached; give it time to seize every thread
    try:
        client_port = publish(args.port, args, bodies)
        time.sleep(1.0)  # let late writes (close-ok, file syncs) reach the trace
    finally:
        tracer.send_signal(signal.SIGINT)  # detach; the broker keeps running
        tracer.wait(timeout=60)
    return trace_file, client_port


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--messages", type=int, default=2000)
    parser.add_argument("--in-flight", type=int, default=1, help="unconfirmed publishes allowed at once")
    parser.add_argument("--body-size", type=int, default=100)
    parser.add_argument("--queue-type", default="classic", choices=("classic", "quorum", "stream"),
                        help="x-queue-type of the queue published to")
    parser.add_argument("--config", help="config file for this project's broker (e.g. one setting an fsync mode)")
    parser.add_argument("--attach-pid", type=int, help="attach to this running broker instead (e.g. RabbitMQ's beam.smp)")
    parser.add_argument("--port", type=int, default=5672, help="AMQP port of the attached broker")
    parser.add_argument("--user", default="guest")
    parser.add_argument("--password", default="guest")
    parser.add_argument("--keep", action="store_true", help="keep the trace directory")
    args = parser.parse_args(argv)
    bodies = message_bodies(args.messages, max(args.body_size, 20))
    workdir = Path(tempfile.mkdtemp(prefix="strace-confirm-"))
    try:
        runner = run_attached if args.attach_pid else run_own_broker
        trace_file, client_port = runner(args, workdir, bodies)
        verdict = check(parse_trace(trace_file), bodies, client_port)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    label = f"pid {args.attach_pid}" if args.attach_pid else "amqp-server"
    print(verdict.summary(f"{label}, {args.queue_type}, {args.messages} x {args.body_size} B, {args.in_flight} in flight"))
    print(f"record files: {sorted(verdict.record_files)[:3]}{' ...' if len(verdict.record_files) > 3 else ''}")
    for violation in verdict.violations[:10]:
        print("  " + violation)
    if args.keep:
        print(f"trace kept in {workdir}")
    return 1 if verdict.violations or verdict.unmatched else 0


if __name__ == "__main__":
    sys.exit(main())
