"""Dead-lettering, TTL and length limits with pika, checked against RabbitMQ 3.10 too
(INTEROP_BROKER_URL); the one place this broker does better than RabbitMQ is marked."""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import NackError

from interop_tests.pika_helpers import channel_for_test, wait_ready

WAIT_S = 8.0


@pytest.fixture
def channel(broker) -> Iterator[BlockingChannel]:
    yield from channel_for_test(broker)


def test_x_death_records_each_queue_and_reason_with_count_and_first_time(broker, channel, unique):
    work, dead = unique("dl-work"), unique("dl-dead")
    channel.exchange_declare(unique("dlx"), "fanout", auto_delete=True)
    dlx = unique("dlx")
    channel.queue_declare(dead, auto_delete=True)
    channel.queue_bind(dead, dlx)
    channel.queue_declare(work, auto_delete=True, arguments={"x-dead-letter-exchange": dlx})
    channel.basic_publish("", work, b"m", pika.BasicProperties(expiration="60000", headers={"CC": [dead + "-cc"]}))
    method, _p, _b = channel.basic_get(work)
    channel.basic_reject(method.delivery_tag, requeue=False)
    assert wait_ready(channel, dead, 1, WAIT_S) == 1
    _method, properties, _body = channel.basic_get(dead, auto_ack=True)
    headers = properties.headers
    [death] = headers["x-death"]
    assert death["reason"] == "rejected" and death["queue"] == work and death["count"] == 1
    assert death["exchange"] == "" and death["routing-keys"] == [work, dead + "-cc"]
    assert death["original-expiration"] == "60000"
    assert isinstance(death["time"], datetime.datetime)
    assert properties.expiration is None
    assert (headers["x-first-death-queue"], headers["x-first-death-reason"]) == (work, "rejected")
    if not broker.is_external:  # x-last-death-* came with RabbitMQ 3.13; 3.10 does not set them
        assert (headers["x-last-death-queue"], headers["x-last-death-reason"]) == (work, "rejected")


def test_a_retry_loop_through_a_ttl_queue_counts_deaths_per_queue_and_reason(broker, channel, unique):
    work, wait = unique("loop-work"), unique("loop-wait")
    channel.queue_declare(work, auto_delete=True, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": wait,
    })
    channel.queue_declare(wait, auto_delete=True, arguments={
        "x-message-ttl": 50, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": work,
    })
    channel.basic_publish("", work, b"job")
    for _ in range(2):
        assert wait_ready(channel, work, 1, WAIT_S) == 1
        method, _p, _b = channel.basic_get(work)
        channel.basic_reject(method.delivery_tag, requeue=False)  # -> wait -> (expired) -> work
    assert wait_ready(channel, work, 1, WAIT_S) == 1
    _method, properties, _body = channel.basic_get(work, auto_ack=True)
    deaths = [(d["queue"], d["reason"], d["count"]) for d in properties.headers["x-death"]]
    assert deaths == [(wait, "expired", 2), (work, "rejected", 2)]
    assert properties.headers["x-first-death-reason"] == "rejected"
    if not broker.is_external:  # RabbitMQ >= 3.13
        assert properties.headers["x-last-death-reason"] == "expired"


def test_an_expiry_only_cycle_is_dropped(channel, unique):
    ping, pong = unique("cycle-ping"), unique("cycle-pong")
    channel.queue_declare(ping, auto_delete=True, arguments={
        "x-message-ttl": 30, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": pong,
    })
    # pong keeps it long enough to be seen there: proof that the first hop happened.
    channel.queue_declare(pong, auto_delete=True, arguments={
        "x-message-ttl": 400, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": ping,
    })
    channel.basic_publish("", ping, b"round and round")
    assert wait_ready(channel, pong, 1, WAIT_S) == 1
    assert wait_ready(channel, pong, 0, WAIT_S) == 0  # expired from pong: back to ping would close the cycle
    assert channel.queue_declare(ping, passive=True).method.message_count == 0
    # Had it gone on to ping, it would be back in pong (for 400 ms) within ping's 30 ms TTL.
    time.sleep(0.2)
    assert channel.queue_declare(ping, passive=True).method.message_count == 0
    assert channel.queue_declare(pong, passive=True).method.message_count == 0


def test_max_length_drop_head_dead_letters_the_oldest_as_maxlen(channel, unique):
    queue, dead = unique("maxlen"), unique("maxlen-dead")
    channel.queue_declare(dead, auto_delete=True)
    channel.queue_declare(queue, auto_delete=True, arguments={
        "x-max-length": 2, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead,
    })
    for n in range(4):
        channel.basic_publish("", queue, b"%d" % n)
    assert wait_ready(channel, dead, 2, WAIT_S) == 2
    assert [channel.basic_get(queue, auto_ack=True)[2] for _ in range(2)] == [b"2", b"3"]
    dropped = [channel.basic_get(dead, auto_ack=True) for _ in range(2)]
    assert [body for _m, _p, body in dropped] == [b"0", b"1"]
    assert all(p.headers["x-death"][0]["reason"] == "maxlen" for _m, p, _b in dropped)


@pytest.mark.parametrize("overflow", ["reject-publish", "reject-publish-dlx"])
def test_a_full_queue_nacks_the_publisher(channel, unique, overflow):
    queue, dead = unique("full"), unique("full-dead")
    channel.queue_declare(dead, auto_delete=True)
    channel.queue_declare(queue, auto_delete=True, arguments={
        "x-max-length": 1, "x-overflow": overflow, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead,
    })
    channel.confirm_delivery()
    channel.basic_publish("", queue, b"fits")
    with pytest.raises(NackError):
        channel.basic_publish("", queue, b"refused")
    assert channel.queue_declare(queue, passive=True).method.message_count == 1
    expected_dead = 1 if overflow == "reject-publish-dlx" else 0
    if expected_dead:
        assert wait_ready(channel, dead, 1, WAIT_S) == 1
    assert channel.queue_declare(dead, passive=True).method.message_count == expected_dead


def test_x_expires_deletes_an_unused_queue(channel, unique):
    queue = unique("expiring")
    channel.queue_declare(queue, arguments={"x-expires": 300})
    assert channel.queue_declare(queue, passive=True).method.queue == queue  # it exists at first
    deadline = time.monotonic() + WAIT_S
    while True:
        # Polled less often than x-expires: RabbitMQ counts a passive declare as a use.
        time.sleep(0.4)
        try:
            channel.queue_declare(queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker as closed:
            assert closed.reply_code == 404
            break
        assert time.monotonic() < deadline, f"{queue} never expired"


def test_per_message_ttl_expires_behind_a_longer_lived_head(broker, channel, unique):
    """RabbitMQ expires a message only when it reaches the head (ttl.md); here it leaves on
    time wherever it is, so a dead-letter consumer is not held up by the message in front."""
    if broker.is_external:
        pytest.skip("RabbitMQ expires per-message TTLs only at the head of the queue")
    queue, dead = unique("ttl-middle"), unique("ttl-middle-dead")
    channel.queue_declare(dead, auto_delete=True)
    channel.queue_declare(queue, auto_delete=True, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead,
    })
    channel.basic_publish("", queue, b"long-lived", pika.BasicProperties(expiration="60000"))
    channel.basic_publish("", queue, b"short-lived", pika.BasicProperties(expiration="200"))
    assert wait_ready(channel, dead, 1, 2.0) == 1
    assert channel.queue_declare(queue, passive=True).method.message_count == 1
    _m, properties, body = channel.basic_get(dead, auto_ack=True)
    assert body == b"short-lived" and properties.headers["x-death"][0]["reason"] == "expired"


def test_a_dead_letter_routing_key_too_long_for_amqp_is_delivered_cut_to_255_bytes(broker, channel, unique):
    """x-dead-letter-routing-key is a long string, so it can exceed what basic.deliver carries
    (a short string). RabbitMQ 3.10 closes the consumer's connection with 541 there and the
    message is lost; here it is delivered with the key's first 255 bytes, cut between characters."""
    if broker.is_external:
        pytest.skip("RabbitMQ closes the consumer's connection with 541 INTERNAL_ERROR")
    work, dead = unique("long-key-work"), unique("long-key-dead")
    long_key = "k" * 254 + "é" + "tail"  # the 2-byte é straddles byte 255: cut before it
    channel.queue_declare(dead, auto_delete=True)
    channel.queue_bind(dead, "amq.fanout")
    channel.queue_declare(work, auto_delete=True, arguments={
        "x-dead-letter-exchange": "amq.fanout", "x-dead-letter-routing-key": long_key})
    channel.basic_publish("", work, b"m")
    method, _p, _b = channel.basic_get(work)
    channel.basic_reject(method.delivery_tag, requeue=False)
    assert wait_ready(channel, dead, 1, WAIT_S) == 1
    got, properties, body = channel.basic_get(dead, auto_ack=True)
    assert (got.routing_key, got.exchange, body) == ("k" * 254, "amq.fanout", b"m")
    assert properties.headers["x-death"][0]["reason"] == "rejected"
    assert channel.is_open  # and the connection too: the next call still works
    assert channel.queue_declare(dead, passive=True).method.message_count == 0
