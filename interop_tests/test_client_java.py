"""RabbitMQ's Java client (Debian's librabbitmq-client-java, 5.0.0) against the broker.

The scenarios are interop_tests/clients/java/Scenarios.java, compiled once per session with
javac against Debian's jar and run once per test; each prints its observations as JSON and the
assertions live here and, for what every client observes alike, in client_expectations.py. The
alarm, restart and TLS tests use `controlled_broker`, which against RabbitMQ
(INTEROP_BROKER_URL) needs INTEROP_RABBITMQCTL, and INTEROP_BROKER_AMQPS_URL and
INTEROP_BROKER_CA_FILE for TLS (interop_tests/README.md).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from interop_tests.client_expectations import (LOW_ON_MEMORY, SHUTDOWN_TEXT, drive_memory_alarm, drive_restart,
                                               expect_confirms, expect_delivered_after_the_alarm, expect_heartbeats,
                                               expect_large_message, expect_prefetch, expect_reject_requeue,
                                               expect_server_capabilities, inequivalent_durable, not_found)
from interop_tests.scenario_programs import CLIENTS_DIR, ScenarioProgram, build, require_files

pytestmark = pytest.mark.timeout(90)

# The client, and the logging API it calls with a binding that writes to stderr (shown on failure).
JARS = tuple(f"/usr/share/java/{jar}" for jar in ("amqp-client.jar", "slf4j-api.jar", "slf4j-simple.jar"))


@pytest.fixture(scope="session")
def java(tmp_path_factory: pytest.TempPathFactory) -> ScenarioProgram:
    require_files("the Java client's tests (Debian: librabbitmq-client-java)", *map(Path, JARS))
    classes = tmp_path_factory.mktemp("java-client")
    build("javac", ["javac", "-d", str(classes), "-cp", JARS[0], "Scenarios.java"], cwd=CLIENTS_DIR / "java")
    classpath = os.pathsep.join([str(classes), *JARS])
    # C1 and the serial collector: a short-lived program starts faster and leaves the CPU to the broker.
    return ScenarioProgram("java", ("java", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-cp", classpath, "Scenarios"))


def test_connect_reads_the_capabilities_and_tuning(broker, java):
    report = java.run("connect", broker.url())
    expect_server_capabilities(report["serverCapabilities"])
    assert (report["frameMax"], report["channelMax"], report["heartbeat"]) == (131072, 2047, 60)
    assert report["queue"].startswith("amq.gen-") and report["body"] == "hello"


def test_publisher_confirms_ack_every_publish_and_a_return_comes_first(broker, java):
    report = java.run("confirms", broker.url())
    assert report["allConfirmed"] is True
    # One basic.return, and one ack for that publish (after the return, says returnedBeforeAck).
    assert len(report["returns"]) == 1 and len(report["returnedBeforeAck"]) == 1
    returned = report["returns"][0]
    assert returned["routingKey"].startswith("no-such-queue-")
    expect_confirms(report["acked"], report["nacked"], (returned["replyCode"], returned["replyText"], returned["body"]),
                    report["returnedBeforeAck"][0], report["messageCount"])


def test_consumer_with_prefetch_and_manual_acks(broker, java):
    report = java.run("prefetch", broker.url())
    expect_prefetch(report["heldUnacked"], report["bodies"], report["messageCount"])
    assert report["consumerCount"] == 1


def test_reject_with_requeue_redelivers_the_message_first(broker, java):
    report = java.run("reject_requeue", broker.url())
    expect_reject_requeue(report["deliveries"], report["messageCount"])


def test_a_channel_error_closes_the_channel_and_the_application_carries_on(broker, java):
    report = java.run("channel_error", broker.url())
    assert report["notFound"] == {"replyCode": 404, "replyText": not_found(report["missing"]),
                                  "classId": 50, "methodId": 10, "hardError": False}
    assert (report["channelOpenAfter"], report["connectionOpenAfter"]) == (False, True)
    assert report["inequivalent"] == {"replyCode": 406, "replyText": inequivalent_durable(report["queue"]),
                                      "classId": 50, "methodId": 10, "hardError": False}
    assert report["bodyAfter"] == "still here"


def test_heartbeats_keep_an_idle_connection_open(broker, java):
    report = java.run("heartbeats", broker.url())
    assert report["openAfterIdle"] is True and report["unexpectedShutdowns"] == []
    expect_heartbeats(report["heartbeat"], report["bodyAfterIdle"])


def test_messages_larger_than_a_frame(broker, java):
    report = java.run("large_message", broker.url())
    expect_large_message(report["frameMax"], report["bodies"])


def test_tls_with_the_test_ca_as_the_only_root(controlled_broker, java):
    report = java.run("tls", controlled_broker.amqps_url(), str(controlled_broker.ca_file))
    assert report["ssl"] is True and report["body"] == "over tls"


def test_connection_blocked_and_unblocked_by_a_memory_alarm(controlled_broker, java):
    report = drive_memory_alarm(java, controlled_broker)
    assert report["reasons"] == [LOW_ON_MEMORY]
    assert report["unblocked"] is True and report["publisherOpen"] is True
    expect_delivered_after_the_alarm(report["deliveredWhileBlocked"], report["receivedAfter"])


def test_automatic_recovery_after_a_broker_restart(controlled_broker, java):
    report = drive_restart(java, controlled_broker)
    assert report["shutdowns"] == [{"initiatedByApplication": False, "replyCode": 320, "replyText": SHUTDOWN_TEXT}]
    assert report["recoveryStarted"] is True and report["recovered"] is True
    # The queue (not durable, so lost in the restart), its binding and the consumer came back:
    # a message published after recovery reaches the same consumer, under its old tag.
    assert report["received"] == ["before", "after"]
    assert len(report["consumerTags"]) == 1
    assert report["channelOpen"] is True and report["messageCount"] == 0
