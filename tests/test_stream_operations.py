"""What operators see of a stream (issue 23, "Operations"): the management API's JSON and the
Prometheus series, against a broker with a data directory, a stream declared and fed through
the real connection code (tests.frame_driver).

RabbitMQ 3.10.8 (checked against a local node) shows a stream with `"type": "stream"`,
`messages` = `messages_ready` = its records and `messages_unacknowledged` 0 even while
deliveries are unacked, `members`, `online` and `readers`, and none of a classic queue's byte
and paging items; our own figures are the `stream_*` items and the `amqp_server_stream_*` series.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pamqp import commands

from amqp_server.broker.broker import Broker
from amqp_server.metrics.core_collector import AGGREGATED, PER_OBJECT, CoreCollector
from amqp_server.metrics.detailed_collector import DetailedCollector
from tests.frame_driver import FakeClient, methods, opened_client
from tests.test_management_client import ManagementClient
from tests.test_metrics_values import FIXED_PROCESS, scrape, value

STREAM = {"x-queue-type": "stream"}
CLASSIC_ONLY = ("message_bytes", "message_bytes_ready", "message_bytes_unacknowledged", "messages_ready_ram",
                "messages_unacknowledged_ram", "messages_ram", "messages_paged_out", "messages_delayed",
                "consumer_utilisation", "head_message_timestamp", "exclusive_consumer_tag",
                "single_active_consumer_tag", "recoverable_slaves")


class Scene:
    """A broker with a data directory, its management API, and one AMQP client (channels 1-3)."""

    def __init__(self, data_dir: Path) -> None:
        self.broker = Broker(message_dir=data_dir)
        self.api = ManagementClient(self.broker)
        self.client: FakeClient = opened_client(self.broker, channels=(1, 2, 3))

    def run(self, coroutine) -> None:
        """Run on the API's event loop, where the broker's fsync worker answers too."""
        self.api.loop.run_until_complete(coroutine)

    def declare_stream(self, name: str, arguments: dict | None = None) -> None:
        self.client.call(1, commands.Queue.Declare(queue=name, durable=True, arguments={**STREAM, **(arguments or {})}))

    def publish(self, queue: str, count: int, body: bytes = b"record") -> None:
        """`count` records, confirmed (so committed: fsynced and readable)."""
        async def confirmed() -> None:
            for _ in range(count):
                self.client.publish(1, body, routing_key=queue)
            await self.broker.committer.idle()
        self.run(confirmed())
        acks = [m for m in methods(self.client.take()) if isinstance(m, commands.Basic.Ack)]
        assert acks, "confirmed"

    def consume(self, channel: int, queue: str, tag: str, prefetch: int, offset: object) -> None:
        self.client.call(channel, commands.Basic.Qos(prefetch_count=prefetch))
        self.client.send(channel, commands.Basic.Consume(queue=queue, consumer_tag=tag,
                                                         arguments={"x-stream-offset": offset}))
        self.client.take()

    def close(self) -> None:
        self.api.close()
        self.broker.committer.close()


@pytest.fixture
def scene(tmp_path: Path) -> Iterator[Scene]:
    scene = Scene(tmp_path)
    scene.client.call(1, commands.Confirm.Select())
    yield scene
    scene.close()


@pytest.fixture
def read(scene: Scene) -> Scene:
    """Stream "s" with records 0..4; on channel 1 consumer "c1" from `first` with prefetch 2
    (holds 0 and 1 unacked: reads 2 next), on channel 2 another "c1" from offset 3 (got 3 and
    4: reads 5 next); classic queue "q" with a consumer and one message unacked."""
    scene.declare_stream("s")
    scene.publish("s", 5)
    scene.consume(1, "s", "c1", prefetch=2, offset="first")
    scene.consume(2, "s", "c1", prefetch=10, offset=3)
    scene.client.call(3, commands.Queue.Declare(queue="q"))
    scene.client.publish(3, b"classic", routing_key="q")
    scene.client.call(3, commands.Basic.Qos(prefetch_count=5))
    scene.client.send(3, commands.Basic.Consume(queue="q", consumer_tag="cq"))
    scene.client.take()
    return scene


def test_a_stream_in_the_api_has_rabbitmqs_stream_shape_and_its_offsets(read):
    item = read.api.get("/api/queues/%2F/s")
    assert (item["type"], item["durable"], item["arguments"]) == ("stream", True, STREAM)
    # RabbitMQ: every record is ready, none unacknowledged, whatever consumers hold.
    assert (item["messages"], item["messages_ready"], item["messages_unacknowledged"]) == (5, 5, 0)
    assert item["consumers"] == 2
    node = item["node"]
    assert (item["members"], item["online"], item["readers"]) == ([node], [node], {node: 2})
    log = read.broker.vhosts["/"].queues["s"].log
    assert (item["stream_first_offset"], item["stream_last_offset"], item["stream_segments"]) == (0, 4, 1)
    assert item["stream_disk_bytes"] == log.disk_bytes() > 0
    assert not set(CLASSIC_ONLY) & set(item), "a stream has none of a classic queue's byte and paging items"
    offsets = {c["channel_details"]["number"]: (c["consumer_tag"], c["stream_offset"]) for c in item["consumer_details"]}
    assert offsets == {1: ("c1", 2), 2: ("c1", 5)}
    [segment] = item["stream_segment_details"]
    assert (segment["first_offset"], segment["next_offset"], segment["bytes"]) == (0, 5, item["stream_disk_bytes"])
    assert segment["first_timestamp"] <= segment["last_timestamp"]
    assert item["message_stats"]["publish"] == 5 and item["message_stats"]["deliver"] == 4


def test_the_queue_list_shows_the_stream_beside_a_classic_queue(read):
    listed = {q["name"]: q for q in read.api.get("/api/queues/%2F")}
    stream, classic = listed["s"], listed["q"]
    assert (stream["type"], stream["messages"], stream["stream_last_offset"]) == ("stream", 5, 4)
    assert "consumer_details" not in stream and "stream_segment_details" not in stream
    assert classic["type"] == "classic" and (classic["messages"], classic["messages_unacknowledged"]) == (1, 1)
    assert set(CLASSIC_ONLY) <= set(classic) and not [key for key in classic if key.startswith("stream_")]
    columns = read.api.get("/api/queues?columns=name,type,stream_first_offset,stream_disk_bytes")
    assert {q["name"]: q["type"] for q in columns} == {"s": "stream", "q": "classic"}


def test_consumers_of_streams_carry_their_offset_in_the_consumer_list(read):
    consumers = read.api.get("/api/consumers/%2F")
    offsets = sorted((c["queue"]["name"], c["channel_details"]["number"], c.get("stream_offset")) for c in consumers)
    assert offsets == [("q", 3, None), ("s", 1, 2), ("s", 2, 5)]
    assert "stream_offset" not in next(c for c in consumers if c["queue"]["name"] == "q")


def test_totals_count_a_streams_records_ready_and_its_deliveries_on_the_channels_only(read):
    totals = read.api.get("/api/overview")["queue_totals"]
    assert (totals["messages_ready"], totals["messages_unacknowledged"], totals["messages"]) == (5, 1, 6)
    vhost = read.api.get("/api/vhosts/%2F")
    assert (vhost["messages_ready"], vhost["messages_unacknowledged"]) == (5, 1)
    unacked = {c["number"]: c["messages_unacknowledged"] for c in read.api.get("/api/channels")}
    assert unacked == {1: 2, 2: 2, 3: 1}


def test_offsets_follow_acks_retention_and_new_records(scene):
    """Small segments: many of them; x-max-length-bytes drops the oldest whole; a consumer's
    offset moves as it acks and reads on."""
    scene.declare_stream("r", {"x-stream-max-segment-size-bytes": 400, "x-max-length-bytes": 1200})
    scene.publish("r", 30, body=b"x" * 40)
    item = scene.api.get("/api/queues/%2F/r")
    segments = item["stream_segment_details"]
    assert item["stream_segments"] == len(segments) > 1
    assert sum(s["bytes"] for s in segments) == item["stream_disk_bytes"]
    assert [s["first_offset"] for s in segments] == sorted(s["first_offset"] for s in segments)
    assert item["stream_first_offset"] == segments[0]["first_offset"] > 0, "retention dropped the oldest segments"
    assert item["stream_last_offset"] == 29
    assert item["messages"] == 30 - item["stream_first_offset"]

    scene.consume(2, "r", "reader", prefetch=1, offset="first")
    first = item["stream_first_offset"]
    [reader] = scene.api.get("/api/queues/%2F/r")["consumer_details"]
    assert reader["stream_offset"] == first + 1  # holds `first` unacked
    scene.client.send(2, commands.Basic.Ack(delivery_tag=1))
    scene.client.take()
    [reader] = scene.api.get("/api/queues/%2F/r")["consumer_details"]
    assert reader["stream_offset"] == first + 2


def test_an_empty_stream_has_no_last_offset(scene):
    scene.declare_stream("empty")
    item = scene.api.get("/api/queues/%2F/empty")
    assert (item["messages"], item["stream_first_offset"], item["stream_last_offset"]) == (0, 0, None)
    assert item["stream_disk_bytes"] == sum(s["bytes"] for s in item["stream_segment_details"])
    samples = scrape(CoreCollector(scene.broker, PER_OBJECT, lambda: FIXED_PROCESS))
    assert value(samples, "amqp_server_stream_first_offset", vhost="/", queue="empty") == 0
    assert ("amqp_server_stream_last_offset", frozenset({("vhost", "/"), ("queue", "empty")})) not in samples


def test_per_object_metrics_report_the_streams_figures_and_rabbitmqs_counts(read):
    samples = scrape(CoreCollector(read.broker, PER_OBJECT, lambda: FIXED_PROCESS))
    s = {"vhost": "/", "queue": "s"}
    assert value(samples, "rabbitmq_queue_messages_ready", **s) == 5
    assert value(samples, "rabbitmq_queue_messages_unacked", **s) == 0
    assert value(samples, "rabbitmq_queue_messages", **s) == 5
    assert value(samples, "rabbitmq_queue_consumers", **s) == 2
    assert value(samples, "rabbitmq_queue_messages_published_total", **s) == 5
    item = read.api.get("/api/queues/%2F/s")
    assert value(samples, "amqp_server_stream_first_offset", **s) == 0
    assert value(samples, "amqp_server_stream_last_offset", **s) == 4
    assert value(samples, "amqp_server_stream_segments", **s) == 1
    assert value(samples, "amqp_server_stream_disk_bytes", **s) == item["stream_disk_bytes"]
    channels = {c["channel_details"]["number"]: c["channel_details"]["name"] for c in item["consumer_details"]}
    offsets = {labels: v for (name, labels), v in samples.items() if name == "amqp_server_stream_consumer_offset"}
    assert offsets == {
        frozenset({**s, "channel": channels[1], "consumer_tag": "c1"}.items()): 2,
        frozenset({**s, "channel": channels[2], "consumer_tag": "c1"}.items()): 5,
    }
    # RabbitMQ has no byte, paging or utilisation series for a stream; the classic queue keeps its own.
    for name in ("rabbitmq_queue_messages_ready_bytes", "rabbitmq_queue_messages_bytes",
                 "rabbitmq_queue_messages_unacked_bytes", "rabbitmq_queue_messages_paged_out",
                 "rabbitmq_queue_consumer_utilisation"):
        assert (name, frozenset(s.items())) not in samples, name
        assert (name, frozenset({"vhost": "/", "queue": "q"}.items())) in samples, name
    assert not [name for name, labels in samples if name.startswith("amqp_server_stream_") and ("queue", "q") in labels]


def test_aggregated_and_detailed_metrics_count_a_stream_as_rabbitmq_does(read):
    samples = scrape(CoreCollector(read.broker, AGGREGATED, lambda: FIXED_PROCESS))
    assert value(samples, "rabbitmq_queue_messages_ready") == 5  # the stream's records; q's message is unacked
    assert value(samples, "rabbitmq_queue_messages_unacked") == 1  # the classic queue's
    assert value(samples, "rabbitmq_queue_messages") == 6
    assert value(samples, "rabbitmq_channel_messages_unacked") == 5  # what the channels hold
    assert not [name for name, _labels in samples if name.startswith("amqp_server_stream_")], "per-object only"
    detailed = scrape(DetailedCollector(read.broker, ["queue_coarse_metrics", "queue_metrics"]))
    s = {"vhost": "/", "queue": "s"}
    assert value(detailed, "rabbitmq_detailed_queue_messages_ready", **s) == 5
    assert value(detailed, "rabbitmq_detailed_queue_messages_unacked", **s) == 0
    assert value(detailed, "rabbitmq_detailed_queue_messages", **s) == 5
    assert value(detailed, "rabbitmq_detailed_queue_messages_published_total", **s) == 5
    assert ("rabbitmq_detailed_queue_messages_ready_bytes", frozenset(s.items())) not in detailed
    assert ("rabbitmq_detailed_queue_messages_bytes", frozenset(s.items())) not in detailed
