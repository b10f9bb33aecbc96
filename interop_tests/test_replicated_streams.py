"""Replicated streams on three broker nodes and a coordination service, all started by the
tests, with pika (issue 23 point 6; docs/streams.md "On a cluster").

- A stream declared on a is replicated on a, b and c (`/api/queues` shows its leader, members
  and online members on every node); publishes through b are confirmed; `kill -9` of its leader
  moves it to a survivor, where every confirmed record is at the offset it had, once; a consumer
  on b (through its stand-in) goes on across the failover at its offset, untold, with nothing
  skipped and nothing twice; a client of the killed node consumes again elsewhere from the
  offset after the last it saw; the killed node comes back with the same records, byte for byte.
- Server-side offset tracking survives the failover: a consumer that names itself resumes on the
  new leader after the last message it acknowledged.
- A confirm waits for a majority of the stream's replicas, and so does reading the record.
- Retention drops the same segments on every replica, and a replica that was away while
  segments were dropped gets every record kept (its log is reset) and the same segments.
- The fault test: publishers with confirms run while the test kills the leader with `kill -9`
  and restarts it, again and again, and a follower after every second leader kill
  (REPLICATED_STREAM_LEADER_KILLS, default 3;
  REPLICATED_STREAM_SEED repeats a run), and a consumer follows the stream across it. Every
  confirmed message must be in the stream, once, and every offset the consumer saw must name
  the same message at the end. Against the harness's broken build
  (interop_tests/broken_replication_broker.py: confirms on the leader's append, replicates in
  50 ms batches) it must report lost messages.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import os
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pika
import pytest
from pika.exceptions import AMQPError as PikaError

from amqp_server.ctl.main import main as ctl_main
from cluster.replication.replicated_streams import stream_id
from interop_tests.cluster_nodes import SESSION_TTL, ClusterNode, pika_parameters, queue_known_everywhere, three_nodes
from interop_tests.pika_helpers import publish_across_failovers
from interop_tests.waiting import poll, wait_until

STREAM = {"x-queue-type": "stream"}
SEGMENT_HEADER = 40  # a segment file's header (docs/stream-files.md section 2): its creation time is each copy's own


def _parameters(node: ClusterNode) -> pika.ConnectionParameters:
    parameters = pika_parameters(node)
    parameters.socket_timeout = 5
    return parameters


def _declare(nodes: dict[str, ClusterNode], node: ClusterNode, name: str, members: list[str] | None = None,
             **arguments) -> None:
    """Declare a stream on `node`; return once every node knows it and its group (`members`,
    default every node) is in sync."""
    connection = pika.BlockingConnection(_parameters(node))
    connection.channel().queue_declare(name, durable=True, arguments={**STREAM, **arguments})
    connection.close()
    queue_known_everywhere(nodes, name)
    group = sorted(members if members is not None else nodes)
    wait_until(lambda: sorted(node.api(f"queues/%2F/{name}").json().get("in_sync", [])) == group,
               "every replica of the stream is in sync")


def _leader(node: ClusterNode, name: str) -> str | None:
    """The node that holds the stream now, as `node` sees it (None while none does)."""
    info = node.api(f"queues/%2F/{name}").json()
    return None if info.get("state") == "down" else info.get("node")


def _publish(node: ClusterNode, name: str, texts: list[str]) -> None:
    """Publish with confirms (each one confirmed on return)."""
    connection = pika.BlockingConnection(_parameters(node))
    channel = connection.channel()
    channel.confirm_delivery()
    for text in texts:
        channel.basic_publish("", name, text.encode())
    connection.close()


class _Reader:
    """A stream consumer (pika, prefetch 10 by default, acking each delivery) whose deliveries the test
    pumps; notes (offset, body) of each, and basic.cancel."""

    def __init__(self, node: ClusterNode, name: str, offset: object = "first", tag: str = "",
                 tracking: bool = False, ack: bool = True, prefetch: int = 10) -> None:
        self.connection = pika.BlockingConnection(_parameters(node))
        self.channel = self.connection.channel()
        self.channel.basic_qos(prefetch_count=prefetch)
        self.got: list[tuple[int, bytes]] = []
        self.tags: list[int] = []
        self.cancelled = False
        self._ack = ack
        self.channel.add_on_cancel_callback(lambda _frame: setattr(self, "cancelled", True))
        arguments: dict[str, object] = {"x-stream-offset": offset}
        if tracking:
            arguments["x-stream-automatic-offset-tracking"] = True
        self.channel.basic_consume(name, self._on_message, consumer_tag=tag or None, arguments=arguments)

    def _on_message(self, channel, method, properties, body: bytes) -> None:
        self.got.append((properties.headers["x-stream-offset"], body))
        self.tags.append(method.delivery_tag)
        if self._ack:
            channel.basic_ack(method.delivery_tag)

    def read_until(self, count: int, within: float = 30.0) -> list[tuple[int, bytes]]:
        wait_until(lambda: len(self.got) >= count, f"{count} deliveries (got {len(self.got)})", within,
                   pump=self.connection.process_data_events)
        return self.got

    def close(self) -> None:
        try:
            self.connection.close()
        except (PikaError, OSError):
            pass


def _read_all(node: ClusterNode, name: str, count: int, offset: object = "first") -> list[tuple[int, bytes]]:
    reader = _Reader(node, name, offset)
    try:
        got = reader.read_until(count)
        reader.connection.process_data_events(0.5)  # and nothing more comes
        return got
    finally:
        reader.close()


def _segments(node: ClusterNode, name: str) -> dict[str, bytes]:
    """The stream's segment files on `node` (name -> records, after the header)."""
    directory = (node.broker.data_dir / "replicas" / hashlib.sha1(stream_id("/", name).encode()).hexdigest()
                 / "stream")
    return {path.name: path.read_bytes()[SEGMENT_HEADER:] for path in sorted(directory.glob("*.seg"))}


def _numbered(texts: range, prefix: str = "m") -> list[tuple[int, bytes]]:
    return [(n, f"{prefix}{n}".encode()) for n in texts]


@pytest.mark.parametrize("backend", ["etcd", "zookeeper"])
def test_every_confirmed_record_is_at_its_offset_on_the_new_leader_and_consumers_go_on(tmp_path, backend):
    with three_nodes(tmp_path, backend) as nodes:
        a, b, c = nodes["a"], nodes["b"], nodes["c"]
        _declare(nodes, a, "ledger", **{"x-initial-cluster-size": 3})
        for node in nodes.values():
            shown = node.api("queues/%2F/ledger").json()
            assert (shown["type"], shown["node"], shown["leader"]) == ("stream", "a", "a"), shown
            assert sorted(shown["members"]) == sorted(shown["online"]) == ["a", "b", "c"]
        _publish(b, "ledger", [f"m{n}" for n in range(100)])

        through_b = _Reader(b, "ledger")  # a consumer on b, through b's stand-in of a's stream
        assert through_b.read_until(40)[:40] == _numbered(range(40))
        on_a = _Reader(a, "ledger")  # a client of the node that is killed
        assert on_a.read_until(30)[:30] == _numbered(range(30))
        last_on_a = on_a.got[-1][0]

        killed_at = time.monotonic()
        a.broker.kill()  # kill -9
        wait_until(lambda: _leader(b, "ledger") in ("b", "c") and _leader(c, "ledger") in ("b", "c"),
                   "a survivor leads the stream", within=SESSION_TTL + 15)
        print(f"the stream moved to {_leader(b, 'ledger')} {time.monotonic() - killed_at:.1f} s after kill -9 "
              f"(session TTL {SESSION_TTL} s)")
        on_a.close()
        _publish(c, "ledger", [f"m{n}" for n in range(100, 120)])

        # b's consumer went on at its offset, untold: every offset once, in order.
        assert through_b.read_until(120) == _numbered(range(120))
        through_b.connection.process_data_events(0.5)
        assert len(through_b.got) == 120 and not through_b.cancelled
        through_b.close()
        # The killed node's client consumes again on c, from the offset after the last it saw.
        assert _read_all(c, "ledger", 120 - last_on_a - 1, offset=last_on_a + 1) == _numbered(range(last_on_a + 1, 120))
        # Every confirmed record, at its offset, once.
        assert _read_all(b, "ledger", 120) == _numbered(range(120))

        a.broker.restart()
        wait_until(lambda: a.live_nodes() == ["a", "b", "c"] and _leader(a, "ledger") in ("b", "c"),
                   "the restarted node follows the new leader")
        leader = nodes[_leader(a, "ledger")]
        wait_until(lambda: _segments(a, "ledger") == _segments(leader, "ledger"),
                   "the restarted node holds the leader's records byte for byte", within=30)
        assert _read_all(a, "ledger", 120) == _numbered(range(120))


def test_a_tracked_consumer_resumes_after_its_last_ack_on_the_new_leader(tmp_path):
    with three_nodes(tmp_path) as nodes:
        a, b = nodes["a"], nodes["b"]
        _declare(nodes, a, "tracked")
        _publish(a, "tracked", [f"m{n}" for n in range(50)])
        reader = _Reader(a, "tracked", tag="billing", tracking=True, ack=False, prefetch=100)
        reader.read_until(50)
        reader.channel.basic_ack(reader.tags[29], multiple=True)  # offsets 0..29 acked, 30..49 not
        # A publish confirmed after the ack, on the same connection: the replica sent the offset it
        # stored for the ack before this record, so a replica that has the record has the offset.
        confirming = reader.connection.channel()
        confirming.confirm_delivery()
        confirming.basic_publish("", "tracked", b"marker")
        a.broker.kill()  # kill -9
        wait_until(lambda: _leader(b, "tracked") in ("b", "c"), "a survivor leads the stream",
                   within=SESSION_TTL + 15)
        resumed = _Reader(b, "tracked", tag="billing", tracking=True)
        got = resumed.read_until(21)
        resumed.close()
        assert got == _numbered(range(30, 50)) + [(50, b"marker")], got[:3]


def test_a_confirm_and_the_record_wait_for_a_majority_of_the_streams_replicas(tmp_path):
    """With both followers killed the leader holds the record but a majority does not: no
    confirm, and no consumer reads it; having heard from no majority for the session TTL the
    leader steps down (check-quorum, issue 27): the confirm is a nack. One follower back, the
    group elects again, a new record is confirmed and read."""
    with three_nodes(tmp_path) as nodes:
        a, b, c = nodes["a"], nodes["b"], nodes["c"]
        _declare(nodes, a, "majority")
        b.broker.kill()
        c.broker.kill()
        outcome: list[str] = []

        def confirmed() -> None:
            connection = pika.BlockingConnection(_parameters(a))
            channel = connection.channel()
            channel.confirm_delivery()
            try:
                channel.basic_publish("", "majority", b"confirm me")  # returns on basic.ack
                outcome.append("acked")
            except pika.exceptions.NackError:
                outcome.append("nacked")
            with contextlib.suppress(PikaError):
                connection.close()

        worker = threading.Thread(target=confirmed)
        worker.start()
        reader = _Reader(a, "majority")
        assert not poll(lambda: outcome or reader.got, SESSION_TTL * 0.6, pump=reader.connection.process_data_events), \
            "a confirm or a delivery came before a majority had the record"
        worker.join(SESSION_TTL + 10)
        assert outcome == ["nacked"]
        reader.close()
        b.broker.restart()

        def publish_confirmed() -> bool:
            connection = pika.BlockingConnection(_parameters(a))
            try:
                channel = connection.channel()
                channel.confirm_delivery()
                channel.basic_publish("", "majority", b"after")
                return True
            except pika.exceptions.NackError:
                return False
            finally:
                with contextlib.suppress(PikaError):
                    connection.close()

        wait_until(publish_confirmed, "a confirm once a majority is back", 30, every=0.5)
        # The nacked record may be there or not (it was in a's log); nothing else is.
        bodies = [body for _, body in _read_all(a, "majority", 1)]
        records = bodies if bodies[-1:] == [b"after"] else [body for _, body in _read_all(a, "majority", 2)]
        assert records[-1] == b"after" and set(records) <= {b"after", b"confirm me"}, records


def test_a_stream_deleted_and_declared_again_starts_empty_on_every_replica(tmp_path):
    """A declare right after the delete is refused with 405 while the old group's replicas are
    being removed (it would start over the old stream's files); once they are, the new stream
    holds none of the old records, on any node."""
    with three_nodes(tmp_path) as nodes:
        a, b = nodes["a"], nodes["b"]
        _declare(nodes, a, "again")
        _publish(a, "again", ["old0", "old1"])
        connection = pika.BlockingConnection(_parameters(a))
        channel = connection.channel()
        channel.queue_delete("again")
        refusals = []

        def declared() -> bool:
            nonlocal channel
            try:
                channel.queue_declare("again", durable=True, arguments=STREAM)
                return True
            except pika.exceptions.ChannelClosedByBroker as refusal:
                refusals.append(refusal.reply_code)
                channel = connection.channel()
                return False

        wait_until(declared, "the stream is declared again")
        connection.close()
        assert set(refusals) <= {405}, refusals
        queue_known_everywhere(nodes, "again")
        wait_until(lambda: sorted(a.api("queues/%2F/again").json().get("in_sync", [])) == sorted(nodes),
                   "every replica of the new stream is in sync")
        _publish(b, "again", ["new0"])
        for node in nodes.values():
            assert _read_all(node, "again", 1) == [(0, b"new0")]
        for node in nodes.values():
            wait_until(lambda node=node: _segments(node, "again") == _segments(a, "again"),
                       f"{node.name} holds the new stream's records only")


def test_retention_drops_the_same_segments_on_every_replica_and_one_away_catches_up(tmp_path):
    with three_nodes(tmp_path) as nodes:
        a, b, c = nodes["a"], nodes["b"], nodes["c"]
        _declare(nodes, a, "kept", **{"x-max-length-bytes": 4000, "x-stream-max-segment-size-bytes": 1000})
        c.broker.kill()  # away while segments are dropped: the leader no longer stores what it lacks
        texts = [f"record {n:04d} " + "x" * 150 for n in range(100)]
        _publish(b, "kept", texts)

        def same_segments() -> bool:
            return _segments(a, "kept") == _segments(b, "kept")

        wait_until(same_segments, "a and b hold the same segments")
        names = sorted(_segments(a, "kept"))
        assert names[0] != "00000000000000000000.seg" and len(names) <= 4000 // 1000 + 2, names
        c.broker.restart()
        wait_until(lambda: _segments(c, "kept") == _segments(a, "kept"),
                   "c, back, holds the leader's segments byte for byte", within=30)
        first = int(names[0].split(".")[0])
        kept = _read_all(c, "kept", 100 - first)
        assert kept == [(n, texts[n].encode()) for n in range(first, 100)]


def test_consumers_on_every_node_go_on_at_their_offset_across_a_leadership_transfer(tmp_path):
    """`ctl transfer_leadership` from a to c with a stream consumer on each node, each partway
    through: a's moves from the stream itself to a stand-in, b's from one stand-in to another,
    c's from a stand-in to the stream itself; none gets basic.cancel, and each goes on at its
    offset: every record once, in order (one handed nothing yet, from where it started). `ctl
    add_member` and `delete_member` take a stream too."""
    with three_nodes(tmp_path) as nodes:
        a, b, c = nodes["a"], nodes["b"], nodes["c"]
        _declare(nodes, a, "moving")
        _publish(a, "moving", [f"m{n}" for n in range(60)])
        readers = [_Reader(node, "moving") for node in (a, b, c)]
        for count, reader in zip((15, 25, 35), readers):
            reader.read_until(count)
        # And one on b that starts at `next`, handed nothing before the transfer: it goes on from
        # the time it consumed, less a second (an AMQP timestamp: whole seconds, rounded down),
        # so the records above must be older than that.
        time.sleep(2.5)
        waiting = _Reader(b, "moving", offset="next")
        code, text = _ctl(c, "transfer_leadership", "moving", "c")
        assert code == 0, text

        def moved() -> bool:
            for reader in (*readers, waiting):
                reader.connection.process_data_events(0)
            return _leader(a, "moving") == "c" and _leader(b, "moving") == "c"

        wait_until(moved, "c leads and holds the stream")
        _publish(b, "moving", [f"m{n}" for n in range(60, 80)])
        for reader in readers:
            assert reader.read_until(80) == _numbered(range(80))
            assert not reader.cancelled
            reader.close()
        assert waiting.read_until(20) == _numbered(range(60, 80))
        waiting.close()
        code, text = _ctl(a, "delete_member", "moving", "b")
        assert code == 0, text
        wait_until(lambda: sorted(a.api("queues/%2F/moving").json()["members"]) == ["a", "c"], "b is no member")
        code, text = _ctl(a, "add_member", "moving", "b")
        assert code == 0, text
        wait_until(lambda: sorted(a.api("queues/%2F/moving").json()["in_sync"]) == ["a", "b", "c"],
                   "b, a member again, is in sync")
        wait_until(lambda: _segments(b, "moving") == _segments(c, "moving"), "b holds the leader's records")


def _ctl(node: ClusterNode, *arguments: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = ctl_main(["--port", str(node.management_port), *arguments], out=out, err=err)
    return code, out.getvalue() + err.getvalue()


# -- the fault test ---------------------------------------------------------------------------------


@dataclass
class _Record:
    confirmed: list[bytes] = field(default_factory=list)
    seen: dict[int, bytes] = field(default_factory=dict)  # offset -> body, as the follower read them
    problems: list[str] = field(default_factory=list)


def _keep_publishing(hosts: list[pika.ConnectionParameters], record: _Record, stop: threading.Event,
                     who: int) -> None:
    """Publish with confirms, never the same body twice (one not confirmed is never sent again)."""
    numbers = itertools.count(1)

    def one(channel) -> None:
        body = f"p{who}-{next(numbers)}".encode()
        channel.basic_publish("", "faults", body)  # raises if nacked
        record.confirmed.append(body)

    publish_across_failovers(hosts, stop, one)


def _keep_reading(hosts: list[pika.ConnectionParameters], record: _Record, stop: threading.Event) -> None:
    """Follow the stream from its first record, across failovers and reconnections (from the
    offset after the last one read): every offset must come after the one before it."""
    while not stop.is_set():
        try:
            connection = pika.BlockingConnection(hosts)
            channel = connection.channel()
            channel.basic_qos(prefetch_count=50)
            start = max(record.seen, default=-1) + 1
            for method, properties, body in channel.consume("faults", inactivity_timeout=0.5,
                                                            arguments={"x-stream-offset": start}):
                if stop.is_set():
                    break
                if method is None:
                    continue
                offset = properties.headers["x-stream-offset"]
                expected = max(record.seen, default=-1) + 1
                if offset in record.seen:
                    if record.seen[offset] != body:
                        record.problems.append(f"offset {offset} was {record.seen[offset]!r}, now {body!r}")
                elif offset != expected:
                    record.problems.append(f"offsets {expected}..{offset - 1} skipped")
                record.seen[offset] = body
                channel.basic_ack(method.delivery_tag)
            connection.close()
        except (PikaError, OSError):
            time.sleep(0.2)


def _fault_run(tmp_path: Path, module: str, leader_kills: int, seed: int) -> tuple[_Record, list[tuple[int, bytes]]]:
    print(f"REPLICATED_STREAM_SEED={seed}")
    chooser = random.Random(seed)
    record = _Record()
    with three_nodes(tmp_path, module=module) as nodes:
        _declare(nodes, nodes["a"], "faults")
        order = list(nodes.values())
        stop = threading.Event()
        workers = [
            threading.Thread(target=_keep_publishing, args=([_parameters(n) for n in order], record, stop, 1)),
            threading.Thread(target=_keep_publishing,
                             args=([_parameters(n) for n in order[1:] + order[:1]], record, stop, 2)),
            threading.Thread(target=_keep_reading, args=([_parameters(n) for n in order[2:] + order[:2]], record, stop)),
        ]
        for worker in workers:
            worker.start()
        try:
            for _kill in range(leader_kills):
                time.sleep(chooser.uniform(1.0, 2.5))
                observer = next(n for n in order if n.broker.process.poll() is None)
                leader = wait_until(lambda: _leader(observer, "faults"), "the stream has a leader", 30)
                victim = nodes[leader]
                print(f"kill -9 leader {leader} ({len(record.confirmed)} confirmed so far)")
                victim.broker.kill()
                survivor = next(n for n in order if n is not victim)
                wait_until(lambda: _leader(survivor, "faults") not in (None, leader), "a survivor leads the stream",
                           within=SESSION_TTL + 20)
                victim.broker.restart()
                wait_until(lambda: victim.live_nodes() == sorted(nodes), "the killed node is back", 30)
                if _kill % 2 == 1:  # and now and then a follower
                    leader = wait_until(lambda: _leader(survivor, "faults"), "the stream has a leader", 30)
                    follower = chooser.choice([n for n in order if n.name != leader])
                    print(f"kill -9 follower {follower.name} ({len(record.confirmed)} confirmed so far)")
                    follower.broker.kill()
                    time.sleep(chooser.uniform(0.2, 1.0))
                    follower.broker.restart()
                    wait_until(lambda: follower.live_nodes() == sorted(nodes), "the killed follower is back", 30)
            time.sleep(1.0)
        finally:
            stop.set()
            for worker in workers:
                worker.join(30)
        observer = order[0]
        wait_until(lambda: _leader(observer, "faults"), "the stream has a leader", 30)
        final = _read_to_end(observer, "faults")
    return record, final


def _read_to_end(node: ClusterNode, name: str, quiet: float = 2.0) -> list[tuple[int, bytes]]:
    """Every record of the stream, from its first: read until none comes for `quiet` seconds."""
    reader = _Reader(node, name, prefetch=500)
    try:
        seen = [0, time.monotonic()]

        def quiet_for_a_while() -> bool:
            if len(reader.got) != seen[0]:
                seen[0], seen[1] = len(reader.got), time.monotonic()
            return time.monotonic() - seen[1] > quiet

        wait_until(quiet_for_a_while, "the stream read to its end", 120, pump=reader.connection.process_data_events)
        return reader.got
    finally:
        reader.close()


def _losses(record: _Record, final: list[tuple[int, bytes]]) -> tuple[list[bytes], list[str]]:
    """Confirmed messages missing at the end, and what else is wrong with the stream."""
    bodies = [body for _, body in final]
    problems = list(record.problems)
    if [offset for offset, _ in final] != list(range(len(final))):
        problems.append("the stream's offsets are not 0, 1, 2, ...")
    if len(set(bodies)) != len(bodies):
        problems.append(f"{len(bodies) - len(set(bodies))} messages are in the stream twice")
    at = dict(final)
    moved = [offset for offset, body in record.seen.items() if at.get(offset, body) != body]
    if moved:
        problems.append(f"{len(moved)} offsets name another message than the one read there before")
    present = set(bodies)
    lost = [body for body in record.confirmed if body not in present]
    print(f"confirmed: {len(record.confirmed)}, in the stream: {len(final)}, read while it ran: {len(record.seen)}, "
          f"confirmed lost: {len(lost)}")
    return lost, problems


def test_no_confirmed_record_is_lost_or_moved_over_leader_kills(tmp_path):
    seed = int(os.environ.get("REPLICATED_STREAM_SEED", random.randrange(1 << 30)))
    kills = int(os.environ.get("REPLICATED_STREAM_LEADER_KILLS", "3"))
    record, final = _fault_run(tmp_path, "amqp_server", kills, seed)
    assert record.confirmed, "nothing was confirmed"
    lost, problems = _losses(record, final)
    assert lost == [] and problems == []


def test_the_fault_test_catches_a_build_that_confirms_before_a_majority_has_the_record(tmp_path):
    seed = int(os.environ.get("REPLICATED_STREAM_SEED", random.randrange(1 << 30)))
    record, final = _fault_run(tmp_path, "interop_tests.broken_replication_broker", 3, seed)
    lost, _problems = _losses(record, final)
    assert lost, "the broken build lost nothing: the test would not notice a loss"
