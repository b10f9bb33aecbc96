"""Check with strace that each confirm of a replicated queue leaves after a majority fsynced it.

Starts one etcd and three broker nodes a, b, c (`interop_tests.cluster_nodes.three_nodes`, as
the replicated-queue interop tests do), declares a durable quorum queue on a (group of 3, a
leads), connects a publisher with confirms to a (or, `--publish-on b`, to b, whose stand-in
forwards to a), attaches ONE `strace -f -ttt -T -yy -xx -s 8M` to all three node processes
(one tracer, so one clock for every line), publishes N persistent messages with K confirms in
flight, detaches, and reads the trace:

* message k's body is unique (`RSTRACE-<run>-<k>-` plus padding); a node *holds* k once a
  write to a regular file under that node's data directory contains the body (the leader's
  replica log and segment file, a follower's replica log; with `--stream`, a replicated
  stream's segment file on each node, its replicated log);
* node X *fsynced* k at the end of the first fsync/fdatasync of such a file that *started
  after* the write holding k *returned*;
* the *ack* of k is the start of the socket write to this client's connection carrying the
  basic.ack that covers k (`multiple` covers every tag up to it), on the node the client is on;
* k passes when, at its ack, a majority of the group (2 of 3) had fsynced it. With three
  members that is always at least one follower. The commit rule (cluster/replication/leader.py)
  counts the leader's own fsync as one vote, not a required one, so two followers without the
  leader would also pass (and does: when the leader's fdatasync is slow); how often the
  leader's own fsync came first is reported too;
* with `--tx N` the publisher also runs in tx mode, N messages per tx.commit: each message's
  tx.commit-ok must leave after a majority fsynced it.

Prints one line per message (per node, when the first fsync covering its record ended, in ms
against its ack: negative is before the ack; "none": no such fsync in the trace) and a summary per
run; exit code 1 when a confirm left before a majority fsynced its record.

    python -m bench.strace_replicated_confirm_order -n 50 --in-flight 1 --in-flight 16
    python -m bench.strace_replicated_confirm_order --publish-on b       # through b's stand-in
    python -m bench.strace_replicated_confirm_order --tx 5               # tx.commit-ok too, 5 per commit
    python -m bench.strace_replicated_confirm_order --stream             # a replicated stream
    # the fault test's broken build (test harness only, never the product): confirms at once
    python -m bench.strace_replicated_confirm_order --module interop_tests.broken_replication_broker

Needs strace, etcd and ptrace rights over the nodes, which strace attaches to as a sibling, not
their parent: the same user and, where Yama is on, kernel.yama.ptrace_scope = 0 (or root). Results:
docs/replication.md ("The strace check through the broker").
"""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from pamqp import commands

from bench.strace_confirm_order import (
    FILE_WRITES, SOCKET_WRITES, STRING_LIMIT, SYNCS, TRACED, Call, ConfirmingPublisher, commit_ok_times, confirm_times,
    parse_trace,
)
from interop_tests.cluster_nodes import ClusterNode, three_nodes
from interop_tests.waiting import wait_until

QUORUM = {"x-queue-type": "quorum"}
STREAM = {"x-queue-type": "stream"}  # a replicated stream: its own segment files are the log
ATTACH_TIMEOUT_S = 30.0
BODY = re.compile(rb"RSTRACE-([0-9a-f]{8})-(\d{6})-")


def message_bodies(run: str, count: int, size: int) -> list[bytes]:
    return [f"RSTRACE-{run}-{k:06d}-".encode().ljust(size, b".") for k in range(1, count + 1)]


# -- the check ------------------------------------------------------------------------------------


@dataclass
class MessageCheck:
    """One confirmed message: when its ack left, and when each node had fsynced its record."""

    number: int
    acked_at: float
    fsynced_at: dict[str, float]  # node -> end of the first fsync covering a write that holds it

    def before_ack(self) -> list[str]:
        return sorted(node for node, at in self.fsynced_at.items() if at <= self.acked_at)

    def line(self, nodes: list[str], majority: int, reply: str = "ack") -> str:
        parts = []
        for node in nodes:
            at = self.fsynced_at.get(node)
            parts.append(f"{node} none" if at is None else f"{node} {(at - self.acked_at) * 1e3:+.2f} ms")
        verdict = "ok" if len(self.before_ack()) >= majority else "VIOLATION"
        return f"message {self.number:4d}: its record's fsync ended, against its {reply}: {', '.join(parts)} -> {verdict}"


@dataclass
class ReplicatedVerdict:
    leader: str
    nodes: list[str]
    messages: list[MessageCheck] = field(default_factory=list)
    reply: str = "ack"  # what confirms a message: "ack" (basic.ack) or "commit-ok" (tx.commit-ok)
    confirms: int = 0  # basic.ack/nack (or tx.commit-ok) frames seen on the client's socket
    not_held: int = 0  # confirmed messages whose record no node wrote (a trace gap: counts as a failure)

    @property
    def majority(self) -> int:
        return len(self.nodes) // 2 + 1

    @property
    def violations(self) -> list[MessageCheck]:
        return [m for m in self.messages if len(m.before_ack()) < self.majority]

    def summary(self, label: str) -> str:
        before = {node: sum(node in m.before_ack() for m in self.messages) for node in self.nodes}
        per_node = ", ".join(f"{node} {count}" for node, count in before.items())
        return (f"{label}: {self.reply}s {self.confirms}, messages checked {len(self.messages)}, "
                f"a majority ({self.majority} of {len(self.nodes)}) fsynced before the {self.reply}: "
                f"{len(self.messages) - len(self.violations)}, violations {len(self.violations)}, "
                f"records not found {self.not_held}; fsynced before the {self.reply} per node: {per_node} "
                f"(leader {self.leader})")


def check_replicated(calls: list[Call], run: str, count: int, client_port: int, node_dirs: dict[str, str],
                     leader: str, per_transaction: int = 0) -> ReplicatedVerdict:
    """For every confirmed message of `run`, which nodes had fsynced its record before its ack
    (with `per_transaction`: before its transaction's tx.commit-ok)."""
    if any(c.truncated for c in calls if c.name in SOCKET_WRITES):
        raise RuntimeError("strace truncated written data; raise STRING_LIMIT")
    verdict = ReplicatedVerdict(leader, sorted(node_dirs), reply="commit-ok" if per_transaction else "ack")
    if per_transaction:
        acked, verdict.confirms = commit_ok_times(calls, client_port, per_transaction)
    else:
        acked, verdict.confirms = confirm_times(calls, client_port)  # nacks make traced_run fail first

    def node_of(path: str) -> str | None:
        return next((node for node, directory in node_dirs.items() if path.startswith(directory)), None)

    holding: dict[int, list[tuple[str, Call]]] = {}  # message -> (node, file write holding it)
    syncs: dict[str, list[Call]] = {}  # path -> fsync/fdatasync calls, by start
    for call in calls:
        if call.name in SYNCS:
            syncs.setdefault(call.target, []).append(call)
        elif call.name in FILE_WRITES and call.target.startswith("/"):
            node = node_of(call.target)
            if node is None:
                continue
            for match in BODY.finditer(call.data):
                if match.group(1).decode() == run:
                    holding.setdefault(int(match.group(2)), []).append((node, call))
    for number in range(1, count + 1):
        acked_at = acked.get(number)
        if acked_at is None:
            continue
        fsynced_at: dict[str, float] = {}
        for node, write in holding.get(number, []):
            after = [s.end for s in syncs.get(write.target, []) if s.start >= write.end]
            if after:
                fsynced_at[node] = min(fsynced_at.get(node, min(after)), min(after))
        if number not in holding:
            verdict.not_held += 1
        verdict.messages.append(MessageCheck(number, acked_at, fsynced_at))
    return verdict


# -- tracing the three nodes ----------------------------------------------------------------------


class AttachedTracer:
    """One strace attached (-f: every thread, and threads started later) to several processes."""

    def __init__(self, pids: list[int], trace_file: Path) -> None:
        strace = shutil.which("strace")
        if strace is None:
            raise RuntimeError("strace is not installed (scripts/install-test-system-packages installs it)")
        self.trace_file = trace_file
        self.errors: list[str] = []  # what else strace said (why an attach failed)
        self.attached: set[int] = set()  # strace says "Process P attached [with N threads]" per process
        self._changed = threading.Condition()
        self.process = subprocess.Popen(
            [strace, "-f", "-ttt", "-T", "-yy", "-xx", "-s", str(STRING_LIMIT), "-e", f"trace={TRACED}",
             "-o", str(trace_file), *[arg for pid in pids for arg in ("-p", str(pid))]],
            stderr=subprocess.PIPE, text=True)
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + ATTACH_TIMEOUT_S
        with self._changed:
            while not self.attached >= set(pids):
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.process.kill()
                    raise RuntimeError(
                        f"strace did not attach to {sorted(set(pids) - self.attached)}: {' '.join(self.errors)!r} "
                        "(attaching needs ptrace rights over the nodes: root, CAP_SYS_PTRACE, or "
                        "kernel.yama.ptrace_scope = 0)")
                self._changed.wait(0.1)

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            match = re.search(r"Process (\d+) attached", line)
            with self._changed:
                if match:
                    self.attached.add(int(match.group(1)))
                else:
                    self.errors.append(line.strip())
                self._changed.notify_all()

    def detach(self) -> None:
        """Detach (SIGINT): the nodes keep running; the trace file is complete when this returns."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._reader.join(timeout=5)


# -- a run ----------------------------------------------------------------------------------------


def declare_replicated_queue(nodes: dict[str, ClusterNode], on: str, queue: str,
                             arguments: dict[str, str] = QUORUM) -> None:
    """A durable quorum queue (`arguments`: STREAM, a stream) declared on node `on` (it leads),
    once every member is in sync."""
    publisher = ConfirmingPublisher("127.0.0.1", nodes[on].port, "guest", "guest")
    publisher.rpc(commands.Queue.Declare(queue=queue, durable=True, arguments=dict(arguments)),
                  commands.Queue.DeclareOk)
    publisher.close()
    wait_until(lambda: sorted(nodes[on].api(f"queues/%2F/{queue}").json().get("in_sync", [])) == sorted(nodes),
               f"every member of {queue}'s group is in sync")
    leader = nodes[on].api(f"queues/%2F/{queue}").json()["leader"]
    if leader != on:
        raise RuntimeError(f"{queue} is led by {leader}, not by {on}")


def traced_run(nodes: dict[str, ClusterNode], queue: str, leader: str, publish_on: str, count: int,
               in_flight: int, body_size: int, workdir: Path, per_transaction: int = 0) -> ReplicatedVerdict:
    """Publish `count` messages to `queue` through `publish_on` under strace, with `in_flight`
    confirms outstanding (or, `per_transaction` > 0, in tx mode, that many per tx.commit); check
    the trace."""
    run = uuid.uuid4().hex[:8]
    bodies = message_bodies(run, count, max(body_size, 24))
    publisher = ConfirmingPublisher("127.0.0.1", nodes[publish_on].port, "guest", "guest",
                                    transactional=per_transaction > 0)
    tracer = AttachedTracer([node.broker.process.pid for node in nodes.values()], workdir / f"{run}.strace")
    nacks = 0
    try:
        if per_transaction:
            publisher.publish_in_transactions(queue, bodies, per_transaction)
        else:
            nacks = publisher.publish_all(queue, bodies, in_flight)
        # One round trip more: the node wrote its reply after the last basic.ack, in the same
        # thread, so once the reply is here strace has recorded the ack's write (a detach right
        # after the last ack could lose the line of that write).
        publisher.rpc(commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk)
    finally:
        tracer.detach()
    publisher.close()
    if nacks:
        raise RuntimeError(f"{nacks} of {count} messages were nacked")
    node_dirs = {name: str(node.broker.data_dir) + "/" for name, node in nodes.items()}
    return check_replicated(parse_trace(tracer.trace_file), run, count, publisher.local_port, node_dirs, leader,
                            per_transaction)


def report(verdict: ReplicatedVerdict, label: str, every_message: bool = True) -> str:
    """A line per message (or only the first 10 violations), then the summary."""
    shown = verdict.messages if every_message else verdict.violations[:10]
    return "\n".join([m.line(verdict.nodes, verdict.majority, verdict.reply) for m in shown] + [verdict.summary(label)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--messages", type=int, default=50)
    parser.add_argument("--in-flight", type=int, action="append", help="unconfirmed publishes at once (repeatable; "
                        "default 1 and 16)")
    parser.add_argument("--tx", type=int, action="append", default=[], metavar="N",
                        help="also a run in tx mode, N messages per tx.commit (repeatable): each tx.commit-ok "
                        "must leave after a majority fsynced every message of its transaction")
    parser.add_argument("--publish-on", default="a", choices=["a", "b", "c"],
                        help="the node the publisher connects to (the queue's leader is a)")
    parser.add_argument("--body-size", type=int, default=100)
    parser.add_argument("--stream", action="store_true", help="a replicated stream (x-queue-type stream) in place "
                        "of the quorum queue: its records are in the stream's segment files on every node")
    parser.add_argument("--module", default="amqp_server", help="what each node runs with python -m "
                        "(a test harness's broken build)")
    parser.add_argument("--summary-only", action="store_true", help="no line per message (violations still shown)")
    parser.add_argument("--keep", action="store_true", help="keep the directory with the traces and node logs")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="strace-replicated-"))
    failed = False
    try:
        with three_nodes(workdir, module=args.module) as nodes:
            queue = f"strace-replicated-{uuid.uuid4().hex[:6]}"
            declare_replicated_queue(nodes, "a", queue, STREAM if args.stream else QUORUM)
            runs = [(k, 0) for k in args.in_flight or [1, 16]] + [(0, n) for n in args.tx]
            for in_flight, per_transaction in runs:
                verdict = traced_run(nodes, queue, "a", args.publish_on, args.messages, in_flight, args.body_size,
                                     workdir, per_transaction)
                how = f"{per_transaction} per tx.commit" if per_transaction else f"{in_flight} in flight"
                kind = "replicated stream" if args.stream else "replicated queue"
                label = (f"{args.module}, {kind} led by a, publisher on {args.publish_on}, "
                         f"{args.messages} x {args.body_size} B, {how}")
                print(report(verdict, label, not args.summary_only), flush=True)
                failed |= bool(verdict.violations or verdict.not_held or len(verdict.messages) < args.messages)
    finally:
        if args.keep:
            print(f"traces and node logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
