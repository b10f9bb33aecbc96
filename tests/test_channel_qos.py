"""basic.qos through a channel: per-consumer and channel-wide (global) prefetch limits."""

from __future__ import annotations

from pamqp import commands

from tests.frame_driver import methods, opened_client, publish_frames


def deliveries(received):
    return [frame for frame in methods(received) if isinstance(frame, commands.Basic.Deliver)]


def setup(client, *consumer_tags: str) -> None:
    client.call(1, commands.Queue.Declare(queue="q"))
    for tag in consumer_tags:
        client.call(1, commands.Basic.Consume(queue="q", consumer_tag=tag))


def publish_many(client, count: int):
    return client.send_bytes(b"".join(publish_frames(1, b"m%d" % n, routing_key="q") for n in range(count)))


def test_per_consumer_prefetch_limits_unacked_deliveries():
    client = opened_client()
    client.call(1, commands.Basic.Qos(prefetch_count=2))
    setup(client, "c1")
    assert [d.delivery_tag for d in deliveries(publish_many(client, 5))] == [1, 2]
    assert [d.delivery_tag for d in deliveries(client.send(1, commands.Basic.Ack(delivery_tag=1)))] == [3]


def test_multiple_ack_frees_room_for_as_many_deliveries():
    client = opened_client()
    client.call(1, commands.Basic.Qos(prefetch_count=2))
    setup(client, "c1")
    publish_many(client, 5)
    received = client.send(1, commands.Basic.Ack(delivery_tag=2, multiple=True))
    assert [d.delivery_tag for d in deliveries(received)] == [3, 4]


def test_global_and_per_consumer_prefetch_apply_together():
    client = opened_client()
    # This order, as RabbitMQ documents it: a later global=false qos would clear the global limit.
    client.call(1, commands.Basic.Qos(prefetch_count=2, global_=False))
    client.call(1, commands.Basic.Qos(prefetch_count=3, global_=True))
    setup(client, "c1", "c2")
    first = deliveries(publish_many(client, 10))
    assert len(first) == 3  # the channel's limit, not 2 + 2
    per_consumer = {tag: [d.consumer_tag for d in first].count(tag) for tag in ("c1", "c2")}
    assert sorted(per_consumer.values()) == [1, 2]
    more = deliveries(client.send(1, commands.Basic.Ack(delivery_tag=1)))
    assert len(more) == 1


def test_per_consumer_limit_holds_below_a_larger_global_limit():
    client = opened_client()
    client.call(1, commands.Basic.Qos(prefetch_count=1, global_=False))
    client.call(1, commands.Basic.Qos(prefetch_count=10, global_=True))
    setup(client, "c1", "c2")
    first = deliveries(publish_many(client, 10))
    assert sorted(d.consumer_tag for d in first) == ["c1", "c2"]


def test_prefetch_size_is_not_implemented():
    client = opened_client()
    close = client.call(1, commands.Basic.Qos(prefetch_size=1000))
    assert isinstance(close, commands.Connection.Close)
    assert close.reply_code == 540


def test_no_ack_consumers_ignore_the_prefetch_limit():
    client = opened_client()
    client.call(1, commands.Basic.Qos(prefetch_count=1))
    client.call(1, commands.Queue.Declare(queue="q"))
    client.call(1, commands.Basic.Consume(queue="q", consumer_tag="c1", no_ack=True))
    assert len(deliveries(publish_many(client, 5))) == 5


def test_recover_redelivers_every_unacked_message():
    client = opened_client()
    setup(client, "c1")
    publish_many(client, 2)
    received = client.send(1, commands.Basic.Recover(requeue=True))
    assert any(isinstance(frame, commands.Basic.RecoverOk) for frame in methods(received))
    redelivered = deliveries(received)
    assert [(d.delivery_tag, d.redelivered) for d in redelivered] == [(3, True), (4, True)]
