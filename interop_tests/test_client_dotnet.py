"""The RabbitMQ .NET client that Mono ships (Debian's libmono-rabbitmq4.0-cil: RabbitMQ.Client
4.0.0.0, the API of the 1.x client of 2008) under mono.

The scenarios are interop_tests/clients/dotnet/Scenarios.cs, compiled once per session with mcs
and run once per test; each prints its observations as JSON. This client speaks AMQP 0-8 unless
told otherwise, and AMQP 0-9 when asked (a 0-9-1 broker answers it as 0-9-1): every scenario
runs in both (SCENARIO_PROTOCOL tells the program which), as RabbitMQ 3.10 speaks both, and one
more checks the client's default. It has no publisher confirms (the test uses transactions), no
connection.blocked (the broker must not send it) and no recovery (the application reconnects).
The assertions live here and, for what every client observes alike, in client_expectations.py.
The alarm, restart and TLS tests use `controlled_broker`, which against RabbitMQ
(INTEROP_BROKER_URL) needs INTEROP_RABBITMQCTL, and INTEROP_BROKER_AMQPS_URL (with
INTEROP_BROKER_CA_FILE) for TLS (interop_tests/README.md).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from interop_tests.client_expectations import (SHUTDOWN_TEXT, drive_memory_alarm,
                                               drive_restart, expect_delivered_after_the_alarm, expect_heartbeats,
                                               expect_large_message, expect_prefetch, expect_reject_requeue,
                                               expect_server_capabilities, inequivalent_durable, not_found)
from interop_tests.scenario_programs import CLIENTS_DIR, ScenarioProgram, build, require_files

pytestmark = pytest.mark.timeout(90)

CLIENT_DLL = Path("/usr/lib/mono/4.5/RabbitMQ.Client.dll")
# The client's names of the protocols it speaks (Protocols.Lookup): header AMQP 1 1 0 9, AMQP 1 1 8 0.
PROTOCOLS = ("AMQP_0_9", "AMQP_0_8")


@pytest.fixture(scope="session")
def scenarios_exe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_files("the .NET client's tests (Debian: mono-mcs, libmono-rabbitmq4.0-cil)", CLIENT_DLL)
    exe = tmp_path_factory.mktemp("dotnet-client") / "Scenarios.exe"
    build("mcs", ["mcs", f"-r:{CLIENT_DLL}", f"-out:{exe}", "Scenarios.cs"], cwd=CLIENTS_DIR / "dotnet")
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
        expect_server_capabilities(report["serverCapabilities"])
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
    expect_prefetch(report["heldUnacked"], report["bodies"], report["messageCount"])


def test_reject_with_requeue_redelivers_the_message_first(broker, dotnet):
    report = dotnet.run("reject_requeue", broker.url())
    expect_reject_requeue(report["deliveries"], report["messageCount"])


def test_a_channel_error_closes_the_channel_and_the_application_carries_on(broker, dotnet):
    report = dotnet.run("channel_error", broker.url())
    assert report["notFound"] == {"classId": 50, "initiator": "Peer", "methodId": 10, "replyCode": 404,
                                  "replyText": not_found(report["missing"])}
    assert (report["channelOpenAfter"], report["connectionOpenAfter"]) == (False, True)
    assert report["inequivalent"] == {"classId": 50, "initiator": "Peer", "methodId": 10, "replyCode": 406,
                                      "replyText": inequivalent_durable(report["queue"])}
    assert report["bodyAfter"] == "still here"


def test_heartbeats_keep_an_idle_connection_open(broker, dotnet):
    report = dotnet.run("heartbeats", broker.url())
    assert report["openAfterIdle"] is True and report["shutdownsWhileIdle"] == []
    expect_heartbeats(report["heartbeat"], report["bodyAfterIdle"])


def test_messages_larger_than_a_frame(broker, dotnet):
    report = dotnet.run("large_message", broker.url())
    expect_large_message(report["frameMax"], report["bodies"])


def test_tls_1_2(controlled_broker, dotnet):
    # The client checks the chain against Mono's own trust store (no test CA there): only the
    # host name is verified.
    report = dotnet.run("tls", controlled_broker.amqps_url())
    assert report["body"] == "over tls"


def test_a_memory_alarm_holds_the_publisher_without_connection_blocked(controlled_broker, dotnet):
    report = drive_memory_alarm(dotnet, controlled_broker)
    # The client did not announce connection.blocked: a frame it does not know would have closed
    # its connection. It stays open, and its message arrives once the alarm clears.
    assert report["publisherOpenWhileBlocked"] is True and report["publisherOpen"] is True
    assert report["publisherShutdowns"] == []
    expect_delivered_after_the_alarm(report["deliveredWhileBlocked"], report["receivedAfter"])


def test_a_broker_restart_is_reported_and_the_application_reconnects(controlled_broker, dotnet):
    report = drive_restart(dotnet, controlled_broker)
    assert report["shutdown"] == {"initiator": "Peer", "replyCode": 320, "replyText": SHUTDOWN_TEXT}
    assert report["openAfter"] is False
    assert report["reconnected"] is True
    assert (report["bodyAfter"], report["redeliveredAfter"]) == ("kept", False)
