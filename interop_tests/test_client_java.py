"""RabbitMQ's Java client (Debian's librabbitmq-client-java, 5.0.0) against the broker.

The scenarios are interop_tests/clients/java/Scenarios.java, compiled once per session with
javac against Debian's jar and run once per test; each prints its observations as JSON and the
assertions live here. Against RabbitMQ (INTEROP_BROKER_URL) the alarm and restart tests need
INTEROP_RABBITMQCTL, and the TLS test
INTEROP_AMQPS_URL and INTEROP_TLS_CA too (interop_tests/README.md).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from interop_tests.scenario_programs import (ScenarioProgram, build, controlled_broker, require_files,
                                           tls_broker, unless_rabbitmq_agrees)

pytestmark = pytest.mark.timeout(90)

JAVA_DIR = Path(__file__).parent / "clients" / "java"
# The client, and the logging API it calls with a binding that writes to stderr (shown on failure).
JARS = tuple(Path("/usr/share/java") / jar for jar in ("amqp-client.jar", "slf4j-api.jar", "slf4j-simple.jar"))
SHUTDOWN_CLOSE = {"replyCode": 320, "replyText": "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"}


@pytest.fixture(scope="session")
def java(tmp_path_factory: pytest.TempPathFactory) -> ScenarioProgram:
    require_files("the Java client's tests (Debian: librabbitmq-client-java)", *JARS)
    classes = tmp_path_factory.mktemp("java-client")
    build("javac", ["javac", "-d", str(classes), "-cp", str(JARS[0]), "Scenarios.java"], cwd=JAVA_DIR)
    classpath = os.pathsep.join([str(classes), *map(str, JARS)])
    # C1 and the serial collector: a short-lived program starts faster and leaves the CPU to the broker.
    return ScenarioProgram("java", ("java", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-cp", classpath, "Scenarios"))


def test_connect_reads_the_capabilities_and_tuning(broker, java):
    report = java.run("connect", broker.url())
    assert {"publisher_confirms", "basic.nack", "connection.blocked", "consumer_cancel_notify",
            "exchange_exchange_bindings", "authentication_failure_close"} <= {
        name for name, on in report["serverCapabilities"].items() if on}
    assert (report["frameMax"], report["channelMax"], report["heartbeat"]) == (131072, 2047, 60)
    assert report["queue"].startswith("amq.gen-") and report["body"] == "hello"


def test_publisher_confirms_ack_every_publish_and_a_return_comes_first(broker, java):
    report = java.run("confirms", broker.url())
    assert report["allConfirmed"] is True
    assert report["acked"] == list(range(1, report["published"] + 1)) and report["nacked"] == []
    assert report["returns"] == [{"replyCode": 312, "replyText": "NO_ROUTE", "routingKey": report["returns"][0]["routingKey"],
                                  "body": "unroutable"}]
    assert report["returnedBeforeAck"] == [True]  # one ack for it, after its basic.return
    assert report["messageCount"] == 100


def test_consumer_with_prefetch_and_manual_acks(broker, java):
    report = java.run("prefetch", broker.url())
    assert report["heldUnacked"] == 10  # no more than the prefetch while nothing is acked
    assert report["bodies"] == [str(i) for i in range(50)]
    assert (report["messageCount"], report["consumerCount"]) == (0, 1)


def test_reject_with_requeue_redelivers_the_message_first(broker, java):
    report = java.run("reject_requeue", broker.url())
    assert report["deliveries"] == [
        {"body": "0", "redelivered": False}, {"body": "0", "redelivered": True},
        {"body": "1", "redelivered": False}, {"body": "2", "redelivered": False},
    ]
    assert report["messageCount"] == 0  # "2" was rejected without requeue: gone


def test_a_channel_error_closes_the_channel_and_the_application_carries_on(broker, java):
    report = java.run("channel_error", broker.url())
    assert report["notFound"] == {"replyCode": 404, "replyText": f"NOT_FOUND - no queue '{report['missing']}' in vhost '/'",
                                  "classId": 50, "methodId": 10, "hardError": False}
    assert (report["channelOpenAfter"], report["connectionOpenAfter"]) == (False, True)
    assert report["inequivalent"] == {
        "replyCode": 406, "classId": 50, "methodId": 10, "hardError": False,
        "replyText": f"PRECONDITION_FAILED - inequivalent arg 'durable' for queue '{report['queue']}' in vhost '/': "
                     "received 'true' but current is 'false'"}
    assert report["bodyAfter"] == "still here"


def test_heartbeats_keep_an_idle_connection_open(broker, java):
    report = java.run("heartbeats", broker.url())
    assert report["heartbeat"] == 1
    assert report["openAfterIdle"] is True and report["unexpectedShutdowns"] == []
    assert report["bodyAfterIdle"] == "after idle"


def test_messages_larger_than_a_frame(broker, java):
    report = java.run("large_message", broker.url())
    assert report["frameMax"] == 4096
    assert report["received"] == report["sent"]
    assert "1048576" in report["received"]


def test_tls_with_the_test_ca_as_the_only_root(broker_factory, tmp_path, java):
    ca_file, url = tls_broker(broker_factory, tmp_path / "certs")
    report = java.run("tls", url, str(ca_file))
    assert report["ssl"] is True and report["body"] == "over tls"


def test_connection_blocked_and_unblocked_by_a_memory_alarm(broker_factory, java):
    broker = controlled_broker(broker_factory)
    with java.start("blocked", broker.url()) as run:
        run.expect("ready")
        broker.raise_memory_alarm()
        try:
            run.proceed()
            run.expect("blocked")
        finally:
            broker.clear_memory_alarm()
        run.proceed()
        report = run.finish()
    assert report["reasons"] == ["low on memory"]
    assert report["unblocked"] is True and report["receivedAfter"] == "held"
    assert report["publisherOpen"] is True
    assert report["deliveredWhileBlocked"] == 0  # the publish that blocked waits for the alarm to clear


def test_automatic_recovery_after_a_broker_restart(broker_factory, java):
    broker = controlled_broker(broker_factory)
    with java.start("recovery", broker.url()) as run:
        run.expect("ready")
        broker.restart()
        run.proceed()
        report = run.finish()
    assert report["shutdowns"] == [{"initiatedByApplication": False, **SHUTDOWN_CLOSE}]
    assert report["recoveryStarted"] is True and report["recovered"] is True
    # The queue (not durable, so lost in the restart), its binding and the consumer came back:
    # a message published after recovery reaches the same consumer, under its old tag.
    assert report["received"] == ["before", "after"]
    assert len(report["consumerTags"]) == 1
    assert report["channelOpen"] is True and report["messageCount"] == 0
