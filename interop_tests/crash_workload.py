"""A publish/consume workload that survives broker crashes, and the ledger that judges them.

`test_durability_crash.py` runs rounds: start publishers (confirm mode, and one in tx mode)
and consumers (manual acks), SIGKILL the broker at a random moment, restart it, repeat.
Every client writes what it observed into one `Ledger`, which then checks two sets of
promises against those observations.

`broken_guarantees` (what confirms and commits promise):
* every confirmed (or committed) message is still in the queue, or a consumer sent its ack
  (an ack cut off by the kill may or may not count: at-least-once);
* no message is delivered twice while the broker stays up, and the ready queue never holds
  one message id twice;
* bodies and properties are byte-exact (each body carries a SHA-256 of its payload);
* after a restart the ready queue is in publish order for each publisher.

`broken_delivery_promises` (what a crash may do to delivered messages):
* any message seen again after a kill is marked redelivered;
* a message a consumer held unacked at a kill comes back;
* an ack the broker answered a later method after (a passive queue.declare) stays acked.

The clients are pika BlockingConnections in threads; they end when the broker dies.
"""

from __future__ import annotations

import hashlib
import random
import threading
from collections import defaultdict
from dataclasses import dataclass, field

import pika
import pika.exceptions

from interop_tests.pika_helpers import connect

QUEUE = "durability-crash"

# Exceptions that mean "the broker went away": they end a client, they are not failures.
# Except ConnectionClosedByBroker (a subclass of ConnectionClosed): a Connection.Close the
# broker sent on purpose is a failure unless the round was already over (see `closed_by_broker`).
CONNECTION_LOST = (
    pika.exceptions.AMQPConnectionError,
    pika.exceptions.ConnectionClosed,
    pika.exceptions.StreamLostError,
    pika.exceptions.ChannelWrongStateError,
    pika.exceptions.ConnectionWrongStateError,
    ConnectionError,
    OSError,
)


def closed_by_broker(ledger: "Ledger", client: str, error: Exception, stop: threading.Event) -> None:
    """A SIGKILL never sends Connection.Close; one that arrives before the round ended is a broker bug."""
    if not stop.is_set():
        with ledger.lock:
            ledger.errors.append(f"{client}: broker closed the connection: {error!r}")


# -- message bodies --------------------------------------------------------------------------


def message_id(publisher: int, n: int) -> str:
    return f"p{publisher}-{n}"


def parse_id(msg_id: str) -> tuple[int, int]:
    publisher, n = msg_id[1:].split("-")
    return int(publisher), int(n)


def make_body(msg_id: str, payload: bytes) -> bytes:
    """`<id>|<sha256 of payload, hex>|<payload>`: a reader can check it without any state."""
    return f"{msg_id}|{hashlib.sha256(payload).hexdigest()}|".encode() + payload


def body_problem(msg_id: str | None, body: bytes, properties: pika.BasicProperties) -> str | None:
    """What is wrong with a delivered message, or None when body and properties are intact."""
    try:
        claimed_id, digest, payload = body.split(b"|", 2)
    except ValueError:
        return f"body of {msg_id!r} is not <id>|<sha>|<payload> ({len(body)} bytes)"
    if hashlib.sha256(payload).hexdigest().encode() != digest:
        return f"body of {claimed_id!r} fails its checksum ({len(body)} bytes)"
    if claimed_id.decode() != msg_id:
        return f"body of {claimed_id!r} arrived with message_id {msg_id!r}"
    headers = properties.headers or {}
    if properties.delivery_mode != 2 or headers.get("sha") != digest[:16].decode():
        return f"properties of {msg_id!r} changed: {properties}"
    return None


def payload_size(rng: random.Random) -> int:
    """Mostly small bodies; a few cross pika's 128 KiB frame size."""
    roll = rng.random()
    if roll < 0.85:
        return rng.randint(0, 2_000)
    if roll < 0.98:
        return rng.randint(2_000, 40_000)
    return rng.randint(120_000, 300_000)


def properties_for(msg_id: str, payload: bytes) -> pika.BasicProperties:
    return pika.BasicProperties(
        delivery_mode=2,
        message_id=msg_id,
        content_type="application/octet-stream",
        headers={"sha": hashlib.sha256(payload).hexdigest()[:16]},
    )


# -- what the clients observed ---------------------------------------------------------------


@dataclass
class Ledger:
    """Observations of every client, across all rounds; thread-safe."""

    confirmed: set[str] = field(default_factory=set)  # basic.ack or tx.commit-ok received
    unconfirmed: set[str] = field(default_factory=set)  # sent, no answer before the kill
    deliveries: list[tuple[int, str, bool]] = field(default_factory=list)  # (round, id, redelivered)
    acks_sent: set[str] = field(default_factory=set)
    acks_answered: dict[str, int] = field(default_factory=dict)  # id -> round: a later method got its reply
    held_at_kill: dict[int, set[str]] = field(default_factory=lambda: defaultdict(set))
    corrupt: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def broken_guarantees(self, final_ready: list[tuple[str, bool]]) -> list[str]:
        """What a confirm or commit promises, checked against the queue drained at the end:
        nothing confirmed is lost, nothing is duplicated or damaged, order is kept."""
        found = list(self.errors) + list(self.corrupt)
        per_round: set[tuple[int, str]] = set()
        for round_, msg_id, _ in self.deliveries:
            if (round_, msg_id) in per_round:
                found.append(f"{msg_id} delivered twice while the broker was up (round {round_})")
            per_round.add((round_, msg_id))
        ready_ids = [msg_id for msg_id, _ in final_ready]
        if len(set(ready_ids)) != len(ready_ids):
            twice = sorted({i for i in ready_ids if ready_ids.count(i) > 1})
            found.append(f"ready queue holds ids twice: {twice[:10]}")
        lost = self.confirmed - set(ready_ids) - self.acks_sent
        if lost:
            found.append(f"{len(lost)} confirmed messages neither in the queue nor acked: {sorted(lost)[:10]}")
        unknown = set(ready_ids) - self.confirmed - self.unconfirmed
        if unknown:
            found.append(f"ready queue holds ids nobody published: {sorted(unknown)[:10]}")
        last_n: dict[int, int] = {}
        for msg_id in ready_ids:
            publisher, n = parse_id(msg_id)
            if n <= last_n.get(publisher, -1):
                found.append(f"ready queue out of publish order: {msg_id} after p{publisher}-{last_n[publisher]}")
            last_n[publisher] = n
        return found

    def broken_delivery_promises(self, final_ready: list[tuple[str, bool]], final_round: int) -> list[str]:
        """What a crash may do to delivered messages (docs/queue-files.md §5, §7): a message
        seen before a kill comes back marked redelivered; one held unacked comes back; an ack
        the broker answered a later method after stays acked."""
        found = []
        deliveries = self.deliveries + [(final_round, msg_id, redelivered) for msg_id, redelivered in final_ready]
        first_round: dict[str, int] = {}
        for round_, msg_id, redelivered in deliveries:
            seen_in = first_round.setdefault(msg_id, round_)
            if seen_in < round_ and not redelivered:
                found.append(f"{msg_id} seen in round {seen_in}, came back in round {round_} without redelivered")
            answered = self.acks_answered.get(msg_id)
            if answered is not None and answered < round_:
                found.append(f"{msg_id} came back in round {round_} after its ack was answered in round {answered}")
        later = {(round_, msg_id) for round_, msg_id, _ in deliveries}
        last_round = {msg_id: round_ for round_, msg_id in sorted(later)}
        for round_, held in sorted(self.held_at_kill.items()):
            for msg_id in sorted(held):
                if last_round.get(msg_id, -1) <= round_:
                    found.append(f"{msg_id} held unacked at the kill ending round {round_} never came back")
        return [f"{p} [{'confirmed' if p.split()[0] in self.confirmed else 'unconfirmed'}]" for p in found]


# -- clients ---------------------------------------------------------------------------------

# pika_helpers.connect's settings for every client: one attempt, and no heartbeats (a test this
# short needs none; a kill closes the socket).
CLIENT_SETTINGS = {"connection_attempts": 1, "heartbeat": 0}


class Publisher:
    """Publishes persistent messages with ids p<index>-0, p<index>-1, ... across rounds.

    In confirm mode each basic_publish waits for its basic.ack; in tx mode a batch of 1..20
    waits for tx.commit-ok. Either answer means "on disk" and puts the ids in `confirmed`.
    """

    def __init__(self, index: int, ledger: Ledger, seed: int, transactional: bool = False) -> None:
        self.index = index
        self.ledger = ledger
        self.rng = random.Random(seed * 1000 + index)
        self.transactional = transactional
        self.next_n = 0

    def run(self, url: str, stop: threading.Event) -> None:
        in_flight: list[str] = []
        try:
            connection = connect(url, **CLIENT_SETTINGS)
            channel = connection.channel()
            channel.tx_select() if self.transactional else channel.confirm_delivery()
            while not stop.is_set():
                batch = self.rng.randint(1, 20) if self.transactional else 1
                for _ in range(batch):
                    msg_id = message_id(self.index, self.next_n)
                    self.next_n += 1
                    payload = self.rng.randbytes(payload_size(self.rng))
                    in_flight.append(msg_id)
                    channel.basic_publish("", QUEUE, make_body(msg_id, payload), properties_for(msg_id, payload))
                if self.transactional:
                    channel.tx_commit()
                with self.ledger.lock:
                    self.ledger.confirmed.update(in_flight)
                in_flight = []
        except pika.exceptions.ConnectionClosedByBroker as error:
            closed_by_broker(self.ledger, f"publisher {self.index}", error, stop)
        except CONNECTION_LOST:
            pass
        except Exception as error:  # a nack or a channel error is a broker bug here
            with self.ledger.lock:
                self.ledger.errors.append(f"publisher {self.index}: {error!r}")
        with self.ledger.lock:
            self.ledger.unconfirmed.update(in_flight)


class Consumer:
    """Consumes with manual acks, holding a random number of deliveries unacked at any time.

    Acks are single or multiple. Every few acks it makes a round trip (a passive
    queue.declare); acks sent before that reply are `acks_answered`: the broker processed
    them, and a crash afterwards must not bring those messages back. Whatever it holds
    when the broker dies goes to `held_at_kill`.
    """

    def __init__(self, index: int, ledger: Ledger, seed: int) -> None:
        self.index = index
        self.ledger = ledger
        self.rng = random.Random(seed * 1000 + 500 + index)

    def run(self, url: str, stop: threading.Event, round_: int) -> None:
        rng, ledger = self.rng, self.ledger
        held: list[tuple[int, str]] = []  # (delivery tag, id), oldest first
        unanswered: list[str] = []  # acked since the last round trip
        prefetch = rng.choice([1, 5, 20, 100])
        try:
            connection = connect(url, **CLIENT_SETTINGS)
            channel = connection.channel()
            channel.basic_qos(prefetch_count=prefetch)
            for method, properties, body in channel.consume(QUEUE, inactivity_timeout=0.02):
                if stop.is_set():
                    break
                if method is not None:
                    problem = body_problem(properties.message_id, body, properties)
                    with ledger.lock:
                        ledger.deliveries.append((round_, properties.message_id, method.redelivered))
                        if problem:
                            ledger.corrupt.append(problem)
                    held.append((method.delivery_tag, properties.message_id))
                keep = rng.randint(0, prefetch)
                if len(held) > keep:
                    multiple = rng.random() < 0.5
                    if multiple:  # settles every held tag up to the last one taken
                        cut = len(held) - keep
                        acked, held = held[:cut], held[cut:]
                    else:
                        acked = [held.pop(rng.randrange(len(held)))]
                    # Counted as sent before sending: an ack cut off by the kill may or may not count.
                    with ledger.lock:
                        ledger.acks_sent.update(msg_id for _, msg_id in acked)
                    unanswered.extend(msg_id for _, msg_id in acked)
                    channel.basic_ack(acked[-1][0], multiple=multiple)
                if len(unanswered) >= 10:
                    channel.queue_declare(QUEUE, durable=True, passive=True)
                    with ledger.lock:
                        ledger.acks_answered.update((msg_id, round_) for msg_id in unanswered)
                    unanswered = []
        except pika.exceptions.ConnectionClosedByBroker as error:
            closed_by_broker(ledger, f"consumer {self.index}", error, stop)
        except CONNECTION_LOST:
            pass
        except Exception as error:
            with ledger.lock:
                ledger.errors.append(f"consumer {self.index}: {error!r}")
        with ledger.lock:
            ledger.held_at_kill[round_].update(msg_id for _, msg_id in held)


def drain_ready(url: str, ledger: Ledger) -> list[tuple[str, bool]]:
    """Take every ready message with basic.get (auto-ack); (id, redelivered) in queue order.

    Damaged bodies go to `ledger.corrupt`."""
    ready: list[tuple[str, bool]] = []
    connection = connect(url, **CLIENT_SETTINGS)
    try:
        channel = connection.channel()
        while True:
            method, properties, body = channel.basic_get(QUEUE, auto_ack=True)
            if method is None:
                return ready
            problem = body_problem(properties.message_id, body, properties)
            if problem:
                ledger.corrupt.append(problem)
            ready.append((properties.message_id, method.redelivered))
    finally:
        connection.close()
