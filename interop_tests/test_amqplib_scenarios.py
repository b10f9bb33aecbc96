"""amqplib (Node.js) against the broker, with frame_max 4096 as amqplib < 0.10.7 proposed it.

Each scenario is a script in interop_tests/node/ that prints its observations as
JSON; the assertions live here.
"""

from __future__ import annotations

from interop_tests.node_runner import run_scenario


def test_confirm_channel_publish_consume_ack(broker) -> None:
    report = run_scenario("confirm_publish_consume.js", broker.url())
    assert report["frameMax"] == 4096
    assert report["serverCapabilities"]["publisher_confirms"] is True
    assert report["serverCapabilities"]["basic.nack"] is True
    assert report["queueName"].startswith("amq.gen-")
    assert sorted(report["confirmed"]) == list(range(50))  # every publish acked, none nacked
    deliveries = report["deliveries"]
    assert [d["id"] for d in deliveries] == [f"m{i}" for i in range(50)]
    assert all(d["size"] == (10000 if i % 10 == 0 else len(f"message {i}")) for i, d in enumerate(deliveries))
    assert all(d["contentType"] == "text/plain" and d["redelivered"] is False for d in deliveries)
    assert report["remaining"] == 0


def test_topic_routing(broker) -> None:
    report = run_scenario("topic_routing.js", broker.url())
    assert report["orange"] == ["quick.orange.rabbit", "lazy.orange.elephant", "quick.orange.fox"]
    assert report["rabbitOrLazy"] == [
        "quick.orange.rabbit", "lazy.orange.elephant", "lazy.brown.fox", "lazy.pink.rabbit",
        "lazy", "lazy.orange.male.rabbit",
    ]


def test_prefetch_one_dispatches_to_the_free_consumer(broker) -> None:
    report = run_scenario("prefetch_fair_dispatch.js", broker.url())
    # "slow" never acks, so with prefetch 1 it holds exactly one message ...
    assert len(report["slow"]) == 1
    # ... and "fast" gets every other one, each message delivered once.
    assert sorted(report["slow"] + report["fast"], key=int) == [str(i) for i in range(20)]
    assert report["readyAfter"] == 0


def test_assert_queue_with_arguments(broker) -> None:
    report = run_scenario("assert_queue_arguments.js", broker.url())
    declared, again = report["declared"], report["again"]
    assert declared["queue"] == again["queue"]
    assert declared["messageCount"] == 0 and declared["consumerCount"] == 0
    # x-max-length 2 keeps the newest two; the two oldest are dead-lettered with the
    # configured routing key and an x-death reason of maxlen.
    assert report["kept"] == ["2", "3"]
    assert report["dead"] == [
        {"body": "0", "routingKey": "dead", "reason": "maxlen"},
        {"body": "1", "routingKey": "dead", "reason": "maxlen"},
    ]


def test_one_mebibyte_message_round_trip(broker) -> None:
    report = run_scenario("large_message.js", broker.url())
    assert report["frameMax"] == 4096
    assert report["receivedSize"] == report["sentSize"] == 1024 * 1024
    assert report["receivedDigest"] == report["sentDigest"] == report["headerDigest"]


def test_channel_error_404_surfaces_as_error_event(broker) -> None:
    report = run_scenario("channel_error.js", broker.url())
    assert report["rejected"]["code"] == 404
    event = report["errorEvent"]
    assert event["code"] == 404
    assert "NOT_FOUND" in event["message"] and report["missing"] in event["message"]
    assert (event["classId"], event["methodId"]) == (50, 10)  # queue.declare
    assert report["connectionUsable"] is True


def test_headers_at_the_nesting_limit_round_trip_and_one_more_level_is_refused(broker) -> None:
    report = run_scenario("deep_headers.js", broker.url())
    assert (report["body"], report["levels"], report["leaf"]) == ("deep", 64, "deep")
    assert report["refused"]["code"] == 406
    assert "invalid message: tables and arrays nested deeper than 64" in report["refused"]["message"]
