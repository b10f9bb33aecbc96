"""The RabbitMQ .NET client that Mono ships (Debian's libmono-rabbitmq4.0-cil: RabbitMQ.Client
4.0.0.0, the API of the 1.x client of 2008) under mono.

The scenarios are interop_tests/clients/dotnet/Scenarios.cs, compiled once per session with mcs
and run once per test; each prints its observations as JSON and the assertions live here. This
client speaks AMQP 0-8 unless told otherwise, and AMQP 0-9 when asked (a 0-9-1 broker answers it
as 0-9-1): every scenario runs in both (SCENARIO_PROTOCOL tells the program which), as RabbitMQ
3.10 speaks both, and one more checks the client's default. It has no publisher confirms (the
test uses transactions), no connection.blocked (the broker must not send it) and no recovery
(the application reconnects). Against RabbitMQ (INTEROP_BROKER_URL) the alarm and restart tests
need INTEROP_RABBITMQCTL, and the TLS test
INTEROP_AMQPS_URL and INTEROP_TLS_CA too (interop_tests/README.md).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from interop_tests.scenario_programs import ScenarioProgram, build, controlled_broker, require_files, tls_broker

pytestmark = pytest.mark.timeout(90)

DOTNET_DIR = Path(__file__).parent / "clients" / "dotnet"
CLIENT_DLL = Path("/usr/lib/mono/4.5/RabbitMQ.Client.dll")
SHUTDOWN_CLOSE = {"initiator": "Peer", "replyCode": 320,
                  "replyText": "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"}


# The client's names of the protocols it speaks (Protocols.Lookup): header AMQP 1 1 0 9, AMQP 1 1 8 0.
PROTOCOLS = ("AMQP_0_9", "AMQP_0_8")


@pytest.fixture(scope="session")
def scenarios_exe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_files("the .NET client's tests (Debian: mono-mcs, libmono-rabbitmq4.0-cil)", CLIENT_DLL)
    exe = tmp_path_factory.mktemp("dotnet-client") / "Scenarios.exe"
    build("mcs", ["mcs", f"-r:{CLIENT_DLL}", f"-out:{exe}", "Scenarios.cs"], cwd=DOTNET_DIR)
    return exe


@pytest.fixture(scope="session", params=PROTOCOLS, ids=("0-9", "0-8"))
def dotnet(request: pytest.FixtureRequest, scenarios_exe: Path) -> ScenarioProgram:
    """The scenarios, speaking one protocol (the program is built once for both)."""
    return ScenarioProgram(f"dotnet {request.param}", ("mono", str(scenarios_exe)),
                           env={**os.environ, "SCENARIO_PROTOCOL": request.param})


def test_connect(broker, dotnet):
    report = dotnet.run("connect", broker.url())
    assert report["protocol"] == dotnet.env["SCENARIO_PROTOCOL"]
    assert report["clientProperties"]["product"] == "RabbitMQ" and report["clientProperties"]["platform"] == ".NET"
    assert "capabilities" not in report["clientProperties"]  # so no connection.blocked, no cancel notifications
    if report["protocol"] == "AMQP_0_8":
        assert report["serverCapabilities"] == {}  # 0-8 has none of RabbitMQ's extensions
    else:
        assert report["serverCapabilities"]["publisher_confirms"] is True
    assert (report["frameMax"], report["channelMax"], report["heartbeat"]) == (131072, 2047, 60)
    assert report["queue"].startswith("amq.gen-") and report["body"] == "hello"


def test_connect_with_the_default_protocol_amqp_0_8(broker, scenarios_exe):
    # The client's default, with nothing configured: the header AMQP 1 1 8 0.
    report = ScenarioProgram("dotnet", ("mono", str(scenarios_exe))).run("connect_default_protocol", broker.url())
    assert report["defaultProtocol"] == "AMQP_0_8"
    assert report["connected"] is True and report["protocol"] == "AMQP_0_8"
    assert report["body"] == "hello"


def test_transactions_and_a_mandatory_return(broker, dotnet):
    report = dotnet.run("tx_publish", broker.url())
    assert (report["afterCommit"], report["afterRollback"]) == (10, 10)
    assert report["returns"] == [{"body": "unroutable", "replyCode": 312, "replyText": "NO_ROUTE",
                                  "routingKey": report["returns"][0]["routingKey"]}]


def test_consumer_with_prefetch_and_manual_acks(broker, dotnet):
    report = dotnet.run("prefetch", broker.url())
    assert report["heldUnacked"] == 10
    assert report["bodies"] == [str(i) for i in range(50)]
    assert report["messageCount"] == 0


def test_reject_with_requeue_redelivers_the_message_first(broker, dotnet):
    report = dotnet.run("reject_requeue", broker.url())
    assert report["deliveries"] == [
        {"body": "0", "redelivered": False}, {"body": "0", "redelivered": True},
        {"body": "1", "redelivered": False}, {"body": "2", "redelivered": False},
    ]
    assert report["messageCount"] == 0


def test_a_channel_error_closes_the_channel_and_the_application_carries_on(broker, dotnet):
    report = dotnet.run("channel_error", broker.url())
    assert report["notFound"] == {"classId": 50, "initiator": "Peer", "methodId": 10, "replyCode": 404,
                                  "replyText": f"NOT_FOUND - no queue '{report['missing']}' in vhost '/'"}
    assert (report["channelOpenAfter"], report["connectionOpenAfter"]) == (False, True)
    assert report["inequivalent"] == {
        "classId": 50, "initiator": "Peer", "methodId": 10, "replyCode": 406,
        "replyText": f"PRECONDITION_FAILED - inequivalent arg 'durable' for queue '{report['queue']}' in vhost '/': "
                     "received 'true' but current is 'false'"}
    assert report["bodyAfter"] == "still here"


def test_heartbeats_keep_an_idle_connection_open(broker, dotnet):
    report = dotnet.run("heartbeats", broker.url())
    assert report["heartbeat"] == 1
    assert report["openAfterIdle"] is True and report["shutdownsWhileIdle"] == []
    assert report["bodyAfterIdle"] == "after idle"


def test_messages_larger_than_a_frame(broker, dotnet):
    report = dotnet.run("large_message", broker.url())
    assert report["frameMax"] == 4096
    assert report["received"] == report["sent"]
    assert "1048576" in report["received"]


def test_tls_1_2(broker_factory, tmp_path, dotnet):
    _ca_file, url = tls_broker(broker_factory, tmp_path / "certs")
    report = dotnet.run("tls", url)
    assert report["body"] == "over tls"


def test_a_memory_alarm_holds_the_publisher_without_connection_blocked(broker_factory, dotnet):
    broker = controlled_broker(broker_factory)
    with dotnet.start("blocked", broker.url()) as run:
        run.expect("ready")
        broker.raise_memory_alarm()
        try:
            run.proceed()
            run.expect("blocked")
        finally:
            broker.clear_memory_alarm()
        run.proceed()
        report = run.finish()
    # The client did not announce connection.blocked: a frame it does not know would have closed
    # its connection. It stays open, and its message arrives once the alarm clears.
    assert report["publisherOpenWhileBlocked"] is True and report["publisherOpen"] is True
    assert report["publisherShutdowns"] == []
    assert report["receivedAfter"] == "held"
    assert report["deliveredWhileBlocked"] == 0


def test_a_broker_restart_is_reported_and_the_application_reconnects(broker_factory, dotnet):
    broker = controlled_broker(broker_factory)
    with dotnet.start("reconnect", broker.url()) as run:
        run.expect("ready")
        broker.restart()
        run.proceed()
        report = run.finish()
    assert report["shutdown"] == SHUTDOWN_CLOSE and report["openAfter"] is False
    assert report["reconnected"] is True
    assert (report["bodyAfter"], report["redeliveredAfter"]) == ("kept", False)
