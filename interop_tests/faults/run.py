"""One fault run: the cluster of `cluster.FaultCluster`, the clients of `workload.Workload` on a
quorum queue, and faults injected one after another (`FaultRun.inject`), each healed before the
next; `finish` heals everything, drains the queue and judges the history (`history.check`).

With ``queue_type="stream"`` the run drives a replicated stream of three replicas instead: the
same publishers and faults, consumers reading the stream from its first record; `finish` heals,
lets every replica reach the leader's commit index, reads the stream to its end on every node,
records a digest of each node's copy of its segment files, waits for the consumers to reach the
end, and judges the history with `history.check_stream`.

The faults (`FAULTS`), each aimed at the queue's leader unless its name says otherwise:

| kind | what |
|---|---|
| leader-from-brokers | the leader cut off from the other brokers, both ways; etcd still reachable |
| leader-from-etcd | the leader cut off from every etcd member; the brokers still reachable |
| split-with-etcd | the leader and one etcd member on one side, the two other nodes and etcd members on the other |
| one-way-from-leader | what the leader sends to the other brokers is dropped; what they send arrives |
| flapping | the leader cut off from the other brokers and healed again, every 0.3-1.5 s |
| pause-leader | SIGSTOP of the leader, then SIGCONT |
| kill-restart | kill -9 of the leader, then a restart (same data directory) |
| disk-full-leader | the leader's data directory (a tmpfs) filled to the last byte, then emptied |
| disk-full-follower | the same on a follower |
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Self

import pika

from cluster.replication.replicated_streams import stream_id
from interop_tests.faults.cluster import NODE_NAMES, FaultCluster
from interop_tests.faults.history import History, StreamVerdict, Verdict, check, check_stream, fault_table
from interop_tests.faults.workload import Workload
from interop_tests.waiting import poll, wait_until

FAULTS = ("leader-from-brokers", "leader-from-etcd", "split-with-etcd", "one-way-from-leader", "flapping",
          "pause-leader", "kill-restart", "disk-full-leader", "disk-full-follower")
QUEUE = "jepsen"
STREAM = "jepsen-stream"
QUEUE_TYPES = ("quorum", "stream")
SEGMENT_HEADER = 40  # a segment file's header (docs/stream-files.md section 2): its creation time is each copy's own


@dataclass
class Outcome:
    verdict: Verdict | StreamVerdict
    table: list[Any]
    events: list[dict[str, Any]]


class FaultRun:
    """The run's clients and faults on `cluster`. A context manager: leaving it stops the
    clients' threads, also when the run failed before `finish`."""

    def __init__(self, cluster: FaultCluster, *, seed: int, queue: str | None = None, queue_type: str = "quorum",
                 served_within: float | None = None, **workload: Any) -> None:
        """`served_within`: a stream's checker also judges each fault's unavailability by it."""
        if queue_type not in QUEUE_TYPES:
            raise ValueError(f"unknown queue type {queue_type!r} (known: {', '.join(QUEUE_TYPES)})")
        self.cluster = cluster
        self.queue_type = queue_type
        self.stream = queue_type == "stream"
        self.queue = queue or (STREAM if self.stream else QUEUE)
        self.served_within = served_within
        self.random = random.Random(seed)
        self.history = History()
        urls = {name: node.url() for name, node in cluster.nodes.items()}
        self.workload = Workload(urls, self.queue, self.history, observe=self._observe, stream=self.stream, **workload)
        self.log: list[str] = []

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.workload.stop()  # (again, after finish: a no-op)

    def say(self, text: str) -> None:
        line = f"[{self.history.now():7.1f} s] {text}"
        self.log.append(line)
        print(line, flush=True)

    # -- setting up ----------------------------------------------------------------------------

    def start(self) -> None:
        node = self.cluster.nodes[NODE_NAMES[0]]
        connection = pika.BlockingConnection(pika.URLParameters(node.url()))
        connection.channel().queue_declare(self.queue, durable=True, arguments={"x-queue-type": self.queue_type})
        connection.close()
        wait_until(lambda: self.cluster.leader(self.queue), "the queue has a leader", 30)
        for name in self.cluster.nodes:
            wait_until(lambda name=name: self.cluster.queue_view(name, self.queue), f"{name} knows the queue", 30)
        everyone = sorted(self.cluster.nodes)
        wait_until(lambda: sorted((self.cluster.queue_view(everyone[0], self.queue) or {}).get("in_sync", []))
                   == everyone, "every replica is in sync", 30)
        self.workload.start()
        wait_until(lambda: self.workload.confirms() > 0, "the first confirm", 30)

    def _observe(self) -> None:
        for name, node in self.cluster.nodes.items():
            if not node.running or node.broker.stopped:
                continue
            view = self.cluster.queue_view(name, self.queue)
            replica = (view or {}).get("replica")
            if replica:
                self.history.add("observe", observer=name, role=replica["role"], term=replica["term"],
                                 commit_index=replica["commit_index"], leader=view.get("leader"))

    # -- faults ----------------------------------------------------------------------------------

    def _leader(self) -> str:
        leader = poll(lambda: self.cluster.leader(self.queue), 15.0, every=0.2)
        return leader or NODE_NAMES[0]

    def inject(self, kind: str, hold_s: float) -> dict[str, Any]:
        """Inject fault `kind` for `hold_s` seconds and heal it; the fault's event."""
        cluster = self.cluster
        network = cluster.network
        assert network is not None
        leader = self._leader()
        others = [n for n in cluster.nodes if n != leader]
        target = leader
        start = self.history.now()
        if kind == "leader-from-brokers":
            network.partition([leader], others)
            time.sleep(hold_s)
            network.heal()
        elif kind == "leader-from-etcd":
            network.partition([leader], cluster.etcd_names())
            time.sleep(hold_s)
            network.heal()
        elif kind == "split-with-etcd":
            etcd = cluster.etcd_names()
            network.partition([leader, etcd[0]], others + etcd[1:])
            time.sleep(hold_s)
            network.heal()
        elif kind == "one-way-from-leader":
            for other in others:
                network.block(leader, other)
            time.sleep(hold_s)
            network.heal()
        elif kind == "flapping":
            until = time.monotonic() + hold_s
            cut = False
            while time.monotonic() < until:
                if cut:
                    network.heal()
                else:
                    network.partition([leader], others)
                cut = not cut
                time.sleep(self.random.uniform(0.3, 1.5))
            network.heal()
        elif kind == "pause-leader":
            cluster.pause(leader)
            time.sleep(hold_s)
            cluster.resume(leader)
        elif kind == "kill-restart":
            cluster.kill9(leader)
            time.sleep(hold_s)
            cluster.restart(leader)
        elif kind == "disk-full-leader":
            cluster.fill_disk(leader)
            time.sleep(hold_s)
            cluster.free_disk(leader)
        elif kind == "disk-full-follower":
            target = self.random.choice(others)
            cluster.fill_disk(target)
            time.sleep(hold_s)
            cluster.free_disk(target)
        else:
            raise ValueError(f"unknown fault {kind!r}")
        event = self.history.add("fault", kind=kind, target=target, start=round(start, 4),
                                 end=round(self.history.now(), 4))
        self.say(f"{kind} on {target} for {hold_s:.1f} s ({self.workload.confirms()} confirmed so far)")
        return event

    def inject_each(self, kinds: Iterable[str], hold_s: float, pause_s: float = 2.0) -> None:
        """Each fault of `kinds` in turn, for `hold_s`; after each, until confirms flow again
        (`settle`), then `pause_s` of them before the next fault."""
        for kind in kinds:
            self.inject(kind, hold_s)
            self.settle()
            time.sleep(pause_s)

    def confirming_on(self, node: str, within: float = 1.0) -> bool:
        """Did a publisher connected to `node` get a confirm in the last `within` seconds?"""
        since = self.history.now() - within
        return any(e["type"] == "ack" and e["node"] == node and e["t"] >= since
                   for e in reversed(self.history.events[-500:]))

    def settle(self, within: float = 60.0) -> float:
        """Wait until a confirm comes after now (the queue is served again); seconds it took."""
        began = self.history.now()
        wait_until(lambda: any(e["type"] == "ack" and e["t"] > began for e in reversed(self.history.events)),
                   "a confirm after the heal", within, every=0.1)
        return self.history.now() - began

    # -- the end ---------------------------------------------------------------------------------

    def finish(self, drain_within: float = 120.0) -> Outcome:
        """Heal everything, stop publishing, let the consumers drain the queue; the verdict."""
        cluster = self.cluster
        assert cluster.network is not None
        cluster.network.heal()
        for name, node in cluster.nodes.items():
            if node.broker.stopped:
                cluster.resume(name)
            if node.mount is not None:
                cluster.free_disk(name)
            if not node.running:
                cluster.restart(name)
        self.workload.stop_publishing()
        self.history.add("stop-publishing")
        time.sleep(self.workload.confirm_timeout + 0.5)  # every publish in flight is answered or timed out
        if self.stream:
            return self._finish_stream(drain_within)
        wait_until(self._drained, "the consumers drained the queue", drain_within, every=0.5)
        self.workload.stop()
        events = self.history.events
        verdict = check(events)
        self.say(verdict.summary())
        return Outcome(verdict, fault_table(events), events)

    def _finish_stream(self, drain_within: float) -> Outcome:
        wait_until(lambda: self.cluster.leader(self.queue), "the stream has a leader", 60)
        # (Not a failure here when they never agree: the replicas' digests below then differ,
        # which the checker reports, as a build that commits without a majority makes them.)
        if not poll(self.caught_up, 30, every=0.5):
            self.say("the replicas' commit indexes still differ")
        length = 0
        for name in self.cluster.nodes:
            records = self.read_stream(name)
            for offset, message_id in records:
                self.history.add("final", node=name, offset=offset, id=message_id)
            length = max(length, len(records))
        wait_until(lambda: all(offset >= length for offset in self.workload.next_offsets.values()),
                   f"the consumers read the stream to its end ({length})", drain_within, every=0.5)
        self.workload.stop()
        for name in self.cluster.nodes:
            self.history.add("replica-files", node=name, digest=self.replica_digest(name))
        events = self.history.events
        verdict = check_stream(events, served_within=self.served_within)
        self.say(verdict.summary())
        return Outcome(verdict, fault_table(events, stream=verdict), events)

    def read_stream(self, name: str, quiet: float = 2.0, within: float = 120.0) -> list[tuple[int, str]]:
        """The stream read on node `name` from its first record to its end (none for `quiet`
        seconds): (offset, message id) of each record."""
        connection = pika.BlockingConnection(pika.URLParameters(self.cluster.nodes[name].url()))
        try:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=500)
            records: list[tuple[int, str]] = []

            def on_message(channel: Any, method: Any, properties: Any, body: bytes) -> None:
                records.append((int(properties.headers["x-stream-offset"]), properties.message_id or body.decode()))
                channel.basic_ack(method.delivery_tag)

            channel.basic_consume(self.queue, on_message, arguments={"x-stream-offset": "first"})
            last = [0, time.monotonic()]

            def quiet_for_a_while() -> bool:
                if len(records) != last[0]:
                    last[0], last[1] = len(records), time.monotonic()
                return time.monotonic() - last[1] > quiet

            wait_until(quiet_for_a_while, f"the stream read to its end on {name}", within,
                       pump=connection.process_data_events)
            return records
        finally:
            connection.close()

    def replica_digest(self, name: str) -> str:
        """A digest of the records in node `name`'s copy of the stream's segment files."""
        node = self.cluster.nodes[name]
        assert node.broker.data_dir is not None
        directory = (node.broker.data_dir / "replicas" / hashlib.sha1(stream_id("/", self.queue).encode()).hexdigest()
                     / "stream")
        digest = hashlib.sha256()
        for path in sorted(directory.glob("*.seg")):
            digest.update(path.name.encode() + b"\0" + path.read_bytes()[SEGMENT_HEADER:])
        return digest.hexdigest()

    def _drained(self) -> bool:
        if time.monotonic() - self.workload.last_delivery < 3.0:
            return False
        leader = self.cluster.leader(self.queue)
        view = self.cluster.queue_view(leader, self.queue) if leader else None
        return bool(view) and view.get("messages") == 0

    def caught_up(self) -> bool:
        """Every member's replica has the leader's commit index."""
        views = [self.cluster.queue_view(name, self.queue) for name in self.cluster.nodes]
        indexes = {(v or {}).get("replica", {}).get("commit_index") for v in views}
        return len(indexes) == 1 and None not in indexes
