"""RabbitMQ's Go client amqp091-go (Debian's golang-github-rabbitmq-amqp091-go-dev, 1.5.0).

The scenarios are interop_tests/clients/go/main.go, built once per session with Debian's Go
against the packaged source (go.mod replaces the module with /usr/share/gocode; GOPROXY=off, so
nothing is fetched) and run once per test; each prints its observations as JSON and the
assertions live here. amqp091-go has no automatic recovery: after a broker restart the test
checks what an application relies on to reconnect by itself. Against RabbitMQ
(INTEROP_BROKER_URL) the alarm and restart tests need INTEROP_RABBITMQCTL, and the TLS test
INTEROP_AMQPS_URL and INTEROP_TLS_CA too (interop_tests/README.md).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from interop_tests.scenario_programs import (ScenarioProgram, build, controlled_broker, require_files,
                                           tls_broker, unless_rabbitmq_agrees)

pytestmark = pytest.mark.timeout(90)

GO_DIR = Path(__file__).parent / "clients" / "go"
DEBIAN_SOURCE = Path("/usr/share/gocode/src/github.com/rabbitmq/amqp091-go/go.mod")
SHUTDOWN_CLOSE = {"code": 320, "reason": "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'",
                  "server": True, "recover": False}


@pytest.fixture(scope="session")
def go_client(tmp_path_factory: pytest.TempPathFactory) -> ScenarioProgram:
    require_files("the Go client's tests (Debian: golang, golang-github-rabbitmq-amqp091-go-dev)", DEBIAN_SOURCE)
    out = tmp_path_factory.mktemp("go-client")
    env = {**os.environ, "GO111MODULE": "on", "GOPROXY": "off", "GOFLAGS": "-mod=readonly", "GOTOOLCHAIN": "local",
           "GOCACHE": str(out / "cache"), "GOPATH": str(out / "gopath")}
    build("go build", ["go", "build", "-o", str(out / "amqp-scenarios"), "."], cwd=GO_DIR, env=env)
    return ScenarioProgram("go", (str(out / "amqp-scenarios"),))


def test_connect_reads_the_capabilities_and_tuning(broker, go_client):
    report = go_client.run("connect", broker.url())
    assert {"publisher_confirms", "basic.nack", "connection.blocked", "consumer_cancel_notify"} <= {
        name for name, on in report["serverCapabilities"].items() if on}
    assert report["version"] == "0-9"  # connection.start's version fields, as 0-9-1 defines them
    # amqp091-go proposes a 10 s heartbeat and no frame or channel limit: the broker's win.
    assert (report["frameMax"], report["channelMax"], report["heartbeat"]) == (131072, 2047, 10)
    assert report["queue"].startswith("amq.gen-") and report["body"] == "hello"


def test_publisher_confirms_ack_every_publish_and_a_return_comes_first(broker, go_client):
    report = go_client.run("confirms", broker.url())
    assert report["acked"] == list(range(1, 102)) and report["nacked"] == []
    assert report["return"] == {"replyCode": 312, "replyText": "NO_ROUTE", "routingKey": report["return"]["routingKey"],
                                "body": "unroutable"}
    assert report["returnedBeforeAck"] is True
    assert report["messageCount"] == 100


def test_consumer_with_prefetch_and_manual_acks(broker, go_client):
    report = go_client.run("prefetch", broker.url())
    assert report["heldUnacked"] == 10
    assert report["bodies"] == [str(i) for i in range(50)]
    assert (report["messageCount"], report["consumerCount"]) == (0, 1)


def test_reject_with_requeue_redelivers_the_message_first(broker, go_client):
    report = go_client.run("reject_requeue", broker.url())
    assert report["deliveries"] == [
        {"body": "0", "redelivered": False}, {"body": "0", "redelivered": True},
        {"body": "1", "redelivered": False}, {"body": "2", "redelivered": False},
    ]
    assert report["messageCount"] == 0


def test_a_channel_error_closes_the_channel_and_the_application_carries_on(broker, go_client):
    report = go_client.run("channel_error", broker.url())
    not_found = {"code": 404, "reason": f"NOT_FOUND - no queue '{report['missing']}' in vhost '/'",
                 "server": True, "recover": True}
    assert report["notFound"] == report["notifyClose"] == not_found
    assert (report["channelClosedAfter"], report["connectionClosedAfter"]) == (True, False)
    assert report["inequivalent"] == {
        "code": 406, "server": True, "recover": True,
        "reason": f"PRECONDITION_FAILED - inequivalent arg 'durable' for queue '{report['queue']}' in vhost '/': "
                  "received 'true' but current is 'false'"}
    assert report["bodyAfter"] == "still here"


def test_heartbeats_keep_an_idle_connection_open(broker, go_client):
    report = go_client.run("heartbeats", broker.url())
    assert report["heartbeat"] == 1
    assert "closedWhileIdle" not in report and report["openAfterIdle"] is True
    assert report["bodyAfterIdle"] == "after idle"


def test_messages_larger_than_a_frame(broker, go_client):
    report = go_client.run("large_message", broker.url())
    assert report["frameMax"] == 4096
    assert report["received"] == report["sent"]
    assert "1048576" in report["received"]


def test_tls_with_the_test_ca_as_the_only_root(broker_factory, tmp_path, go_client):
    ca_file, url = tls_broker(broker_factory, tmp_path / "certs")
    report = go_client.run("tls", url, str(ca_file))
    assert report["handshakeComplete"] is True and report["tlsVersion"] in ("TLS 1.2", "TLS 1.3")
    assert report["body"] == "over tls"


def test_connection_blocked_and_unblocked_by_a_memory_alarm(broker_factory, go_client):
    broker = controlled_broker(broker_factory)
    with go_client.start("blocked", broker.url()) as run:
        run.expect("ready")
        broker.raise_memory_alarm()
        try:
            run.proceed()
            run.expect("blocked")
        finally:
            broker.clear_memory_alarm()
        run.proceed()
        report = run.finish()
    assert report["blocked"] == {"active": True, "reason": "low on memory"}
    assert report["unblocked"] == {"active": False, "reason": ""}
    assert report["receivedAfter"] == "held" and report["publisherOpen"] is True
    assert report["deliveredWhileBlocked"] == 0


def test_a_broker_restart_is_reported_and_the_application_reconnects(broker_factory, go_client):
    broker = controlled_broker(broker_factory)
    with go_client.start("reconnect", broker.url()) as run:
        run.expect("ready")
        broker.restart()
        run.proceed()
        report = run.finish()
    assert report["confirmedBefore"] is True
    assert report["closeError"] == SHUTDOWN_CLOSE and report["closedAfter"] is True
    assert report["reconnected"] is True
    # The durable queue and its persistent, confirmed message outlived the restart.
    assert (report["bodyAfter"], report["redeliveredAfter"]) == ("kept", False)
