"""One fault run: the cluster of `cluster.FaultCluster`, the clients of `workload.Workload` on a
quorum queue, and faults injected one after another (`FaultRun.inject`), each healed before the
next; `finish` heals everything, drains the queue and judges the history (`history.check`).

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

import random
import time
from dataclasses import dataclass
from typing import Any, Self

import pika

from interop_tests.faults.cluster import NODE_NAMES, FaultCluster
from interop_tests.faults.history import History, Verdict, check, fault_table
from interop_tests.faults.workload import Workload
from interop_tests.waiting import poll, wait_until

FAULTS = ("leader-from-brokers", "leader-from-etcd", "split-with-etcd", "one-way-from-leader", "flapping",
          "pause-leader", "kill-restart", "disk-full-leader", "disk-full-follower")
QUEUE = "jepsen"


@dataclass
class Outcome:
    verdict: Verdict
    table: list[Any]
    events: list[dict[str, Any]]


class FaultRun:
    """The run's clients and faults on `cluster`. A context manager: leaving it stops the
    clients' threads, also when the run failed before `finish`."""

    def __init__(self, cluster: FaultCluster, *, seed: int, queue: str = QUEUE, **workload: Any) -> None:
        self.cluster = cluster
        self.queue = queue
        self.random = random.Random(seed)
        self.history = History()
        urls = {name: node.url() for name, node in cluster.nodes.items()}
        self.workload = Workload(urls, queue, self.history, observe=self._observe, **workload)
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
        connection.channel().queue_declare(self.queue, durable=True, arguments={"x-queue-type": "quorum"})
        connection.close()
        wait_until(lambda: self.cluster.leader(self.queue), "the queue has a leader", 30)
        for name in self.cluster.nodes:
            wait_until(lambda name=name: self.cluster.queue_view(name, self.queue), f"{name} knows the queue", 30)
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
        wait_until(self._drained, "the consumers drained the queue", drain_within, every=0.5)
        self.workload.stop()
        events = self.history.events
        verdict = check(events)
        self.say(verdict.summary())
        return Outcome(verdict, fault_table(events), events)

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
