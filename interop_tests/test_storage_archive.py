"""Archived segments: fully acked history stays on disk for analytics instead of being deleted."""

from __future__ import annotations

import pika

CONFIG = '''
[[users]]
name = "guest"
password = "guest"
tags = ["administrator"]

[[vhosts]]
name = "/"

[[permissions]]
user = "guest"
vhost = "/"
configure = ".*"
write = ".*"
read = ".*"
'''

BODY = b"m" * 4096
COUNT = 600  # about 2.5 MiB: more than the 1 MiB after which a drained queue's segment is replaced


def publish_and_drain(url: str, queue: str, arguments: dict, data_dir) -> int:
    """Publish COUNT confirmed messages, then get and ack them all; returns the bytes of
    segment files under data_dir/"queues" measured when all were published."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(queue, durable=True, arguments=arguments)
    for _ in range(COUNT):
        channel.basic_publish("", queue, BODY, pika.BasicProperties(delivery_mode=2))
    published_bytes = segment_bytes(data_dir / "queues")
    for _ in range(COUNT):
        method, _properties, _body = channel.basic_get(queue)
        channel.basic_ack(method.delivery_tag)
    # One more confirmed publish: the acks before it were written out with it.
    channel.basic_publish("", queue, b"last", pika.BasicProperties(delivery_mode=2))
    connection.close()
    return published_bytes


def segment_bytes(root) -> int:
    return sum(path.stat().st_size for path in root.rglob("*.seg")) if root.exists() else 0


def test_queue_with_x_archive_keeps_acked_segments_in_the_archive(broker_factory):
    broker = broker_factory(CONFIG)
    # Positive control: the messages really were in the queue's segments before the drain.
    assert publish_and_drain(broker.url(), "archived", {"x-archive": True}, broker.data_dir) > COUNT * len(BODY) // 2
    assert segment_bytes(broker.data_dir / "archive") > COUNT * len(BODY) // 2


def test_queue_without_archive_frees_acked_segments(broker_factory):
    broker = broker_factory(CONFIG)
    # Positive control: the segments were large before the drain, so the small size after means freed.
    assert publish_and_drain(broker.url(), "plain", {}, broker.data_dir) > COUNT * len(BODY) // 2
    assert segment_bytes(broker.data_dir / "archive") == 0
    assert segment_bytes(broker.data_dir / "queues") < 1024 * 1024


def test_archive_for_a_whole_vhost_from_the_config(broker_factory):
    broker = broker_factory(CONFIG + '\n[[vhosts]]\nname = "history"\narchive = true\n'
                            '\n[[permissions]]\nuser = "guest"\nvhost = "history"\nconfigure = ".*"\nwrite = ".*"\nread = ".*"\n')
    published = publish_and_drain(broker.url(vhost="history"), "events", {}, broker.data_dir)
    assert published > COUNT * len(BODY) // 2
    assert segment_bytes(broker.data_dir / "archive") > COUNT * len(BODY) // 2
