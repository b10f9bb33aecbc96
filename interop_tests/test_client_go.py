"""RabbitMQ's Go client amqp091-go (Debian's golang-github-rabbitmq-amqp091-go-dev, 1.5.0).

The scenarios are interop_tests/clients/go/main.go, built once per session with Debian's Go
against the packaged source (go.mod replaces the module with /usr/share/gocode; GOPROXY=off, so
nothing is fetched) and run once per test; each prints its observations as JSON and the
assertions live here and, for what every client observes alike, in client_expectations.py.
amqp091-go has no automatic recovery: after a broker restart the test checks what an
application relies on to reconnect by itself. The alarm, restart and TLS tests use
`controlled_broker`, which against RabbitMQ (INTEROP_BROKER_URL) needs INTEROP_RABBITMQCTL, and
INTEROP_BROKER_AMQPS_URL and INTEROP_BROKER_CA_FILE for TLS (interop_tests/README.md).
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

DEBIAN_SOURCE = Path("/usr/share/gocode/src/github.com/rabbitmq/amqp091-go/go.mod")


@pytest.fixture(scope="session")
def go_client(tmp_path_factory: pytest.TempPathFactory) -> ScenarioProgram:
    require_files("the Go client's tests (Debian: golang, golang-github-rabbitmq-amqp091-go-dev)", DEBIAN_SOURCE)
    out = tmp_path_factory.mktemp("go-client")
    env = {**os.environ, "GO111MODULE": "on", "GOPROXY": "off", "GOFLAGS": "-mod=readonly", "GOTOOLCHAIN": "local",
           "GOCACHE": str(out / "cache"), "GOPATH": str(out / "gopath")}
    build("go build", ["go", "build", "-o", str(out / "amqp-scenarios"), "."], cwd=CLIENTS_DIR / "go", env=env)
    return ScenarioProgram("go", (str(out / "amqp-scenarios"),))


def test_connect_reads_the_capabilities_and_tuning(broker, go_client):
    report = go_client.run("connect", broker.url())
    expect_server_capabilities(report["serverCapabilities"])
    assert report["version"] == "0-9"  # connection.start's version fields, as 0-9-1 defines them
    # amqp091-go proposes a 10 s heartbeat and no frame or channel limit: the broker's win.
    assert (report["frameMax"], report["channelMax"], report["heartbeat"]) == (131072, 2047, 10)
    assert report["queue"].startswith("amq.gen-") and report["body"] == "hello"


def test_publisher_confirms_ack_every_publish_and_a_return_comes_first(broker, go_client):
    report = go_client.run("confirms", broker.url())
    returned = report["return"]
    assert returned["routingKey"].startswith("no-such-queue-")
    expect_confirms(report["acked"], report["nacked"], (returned["replyCode"], returned["replyText"], returned["body"]),
                    report["returnedBeforeAck"], report["messageCount"])


def test_consumer_with_prefetch_and_manual_acks(broker, go_client):
    report = go_client.run("prefetch", broker.url())
    expect_prefetch(report["heldUnacked"], report["bodies"], report["messageCount"])
    assert report["consumerCount"] == 1


def test_reject_with_requeue_redelivers_the_message_first(broker, go_client):
    report = go_client.run("reject_requeue", broker.url())
    expect_reject_requeue(report["deliveries"], report["messageCount"])


def test_a_channel_error_closes_the_channel_and_the_application_carries_on(broker, go_client):
    report = go_client.run("channel_error", broker.url())
    assert report["notFound"] == report["notifyClose"] == {
        "code": 404, "reason": not_found(report["missing"]), "server": True, "recover": True}
    assert (report["channelClosedAfter"], report["connectionClosedAfter"]) == (True, False)
    assert report["inequivalent"] == {
        "code": 406, "reason": inequivalent_durable(report["queue"]), "server": True, "recover": True}
    assert report["bodyAfter"] == "still here"


def test_heartbeats_keep_an_idle_connection_open(broker, go_client):
    report = go_client.run("heartbeats", broker.url())
    assert "closedWhileIdle" not in report and report["openAfterIdle"] is True
    expect_heartbeats(report["heartbeat"], report["bodyAfterIdle"])


def test_messages_larger_than_a_frame(broker, go_client):
    report = go_client.run("large_message", broker.url())
    expect_large_message(report["frameMax"], report["bodies"])


def test_tls_with_the_test_ca_as_the_only_root(controlled_broker, go_client):
    report = go_client.run("tls", controlled_broker.amqps_url(), str(controlled_broker.ca_file))
    assert report["handshakeComplete"] is True and report["tlsVersion"] in ("TLS 1.2", "TLS 1.3")
    assert report["body"] == "over tls"


def test_connection_blocked_and_unblocked_by_a_memory_alarm(controlled_broker, go_client):
    report = drive_memory_alarm(go_client, controlled_broker)
    assert report["blocked"] == {"active": True, "reason": LOW_ON_MEMORY}
    assert report["unblocked"] == {"active": False, "reason": ""}
    assert report["publisherOpen"] is True
    expect_delivered_after_the_alarm(report["deliveredWhileBlocked"], report["receivedAfter"])


def test_a_broker_restart_is_reported_and_the_application_reconnects(controlled_broker, go_client):
    report = drive_restart(go_client, controlled_broker)
    assert report["confirmedBefore"] is True
    assert report["closeError"] == {"code": 320, "reason": SHUTDOWN_TEXT, "server": True, "recover": False}
    assert report["closedAfter"] is True
    assert report["reconnected"] is True
    # The durable queue and its persistent, confirmed message outlived the restart.
    assert (report["bodyAfter"], report["redeliveredAfter"]) == ("kept", False)
