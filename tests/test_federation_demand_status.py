"""Queue federation's consumer demand, and a link's status as /api/federation-links shows it."""

from __future__ import annotations

import pytest

from amqp_server.federation.demand import DemandWatch, wants_messages
from amqp_server.federation.status import EXCHANGE, QUEUE, IllegalLinkTransition, LinkKey, LinkState, LinkStatus
from queues.consumer import Consumer
from queues.message import Message, content_header
from queues.queue import Queue


class Sink:
    global_prefetch_count = 0

    def __init__(self) -> None:
        self.open = True
        self.delivered: list[object] = []

    def can_deliver(self) -> bool:
        return self.open

    def deliver(self, consumer, entry) -> None:
        self.delivered.append(entry)

    def consumer_cancelled(self, consumer) -> None:
        pass


def message() -> Message:
    return Message("", "q", content_header(1, b"\x00\x00"), b"x")


def test_demand_needs_an_empty_queue_and_a_consumer_with_room():
    queue = Queue("q", "/")
    assert not wants_messages(queue), "no consumer"
    sink = Sink()
    consumer = Consumer("c", queue, sink, no_ack=False, prefetch_count=1)
    queue.add_consumer(consumer)
    assert wants_messages(queue)
    queue.publish(message())  # delivered: the consumer's one slot is taken
    assert sink.delivered and not wants_messages(queue)
    queue.publish(message())  # waits in the queue
    assert queue.message_count == 1 and not wants_messages(queue)


def test_a_consumer_below_priority_zero_makes_no_demand():
    queue = Queue("q", "/")
    queue.add_consumer(Consumer("low", queue, Sink(), no_ack=True, priority=-1))
    assert not wants_messages(queue)
    blocked = Sink()
    blocked.open = False
    queue.add_consumer(Consumer("blocked", queue, blocked, no_ack=True))
    assert not wants_messages(queue)


def test_a_watch_reports_only_changes():
    queue = Queue("q", "/")
    watch = DemandWatch()
    assert not watch.changed(queue)
    consumer = Consumer("c", queue, Sink(), no_ack=True)
    queue.add_consumer(consumer)
    assert watch.changed(queue) and watch.wanted
    assert not watch.changed(queue)
    queue.remove_consumer(consumer)
    assert watch.changed(queue) and not watch.wanted


class Clock:
    now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_link_status_counts_reconnects_and_shows_rabbitmqs_fields():
    clock = Clock()
    key = LinkKey("/", EXCHANGE, "fed.x", "u1", "fed.x")
    status = LinkStatus(key, "amqp://127.0.0.1:5771", clock=clock)
    status.connecting("amqp://127.0.0.1:5771")
    assert (status.state, status.reconnects) == (LinkState.STARTING, 0)
    status.connected("federation link 1")
    item = status.as_json("node@host")
    assert {k: item[k] for k in ("node", "exchange", "upstream_exchange", "type", "vhost", "upstream", "status",
                                 "local_connection", "uri")} == {
        "node": "node@host", "exchange": "fed.x", "upstream_exchange": "fed.x", "type": "exchange", "vhost": "/",
        "upstream": "u1", "status": "running", "local_connection": "federation link 1",
        "uri": "amqp://127.0.0.1:5771"}
    assert len(item["id"]) == 8 and item["id"] == LinkKey("/", EXCHANGE, "fed.x", "u1", "fed.x").id
    status.failed("connection refused", retry_in_s=5)
    clock.now += 2
    item = status.as_json("n")
    assert (item["status"], item["error"], item["next_attempt_in"]) == ("error", "connection refused", 3.0)
    assert "local_connection" not in item
    status.connecting("amqp://127.0.0.1:5771")
    assert status.reconnects == 1
    status.failed("ACCESS_REFUSED - Login was refused", retry_in_s=5)
    status.connecting("amqp://127.0.0.1:5771")
    assert status.reconnects == 2


def test_a_queue_link_names_its_queues_and_consumer_tag():
    status = LinkStatus(LinkKey("/", QUEUE, "fed.q", "u1", "up.q"), "amqp://h", consumer_tag="federation-link-u1")
    item = status.as_json("n")
    assert (item["queue"], item["upstream_queue"], item["consumer_tag"], item["status"]) == (
        "fed.q", "up.q", "federation-link-u1", "starting")


def test_a_running_link_cannot_be_connected_again():
    status = LinkStatus(LinkKey("/", QUEUE, "q", "u", "q"), "amqp://h")
    status.connected("c")
    with pytest.raises(IllegalLinkTransition):
        status.connected("c")
