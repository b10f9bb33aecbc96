"""A client cannot forge a line of the broker's log.

A login name or client product string holding a newline (or a carriage return, or a terminal
escape) is written escaped, inside the one line that mentions it: the broker's log never gains a
line the client wrote. The forged text below is what an attacker would want an operator (or a
log shipper) to read: a well-formed line saying that 'admin' logged in.
"""

from __future__ import annotations

from pamqp import commands, header

from interop_tests.raw_client import CLIENT_CAPABILITIES, RawClient, ServerClosedSocket

FORGED = "2026-01-01 00:00:00,000 INFO amqp_server.connection.connection: user 'admin' authenticated and granted access"


def start_ok(client: RawClient, user: str, password: str, product: str) -> None:
    client.send(header.ProtocolHeader())
    client.expect(commands.Connection.Start)
    client.send(
        commands.Connection.StartOk(
            client_properties={"product": product, "capabilities": CLIENT_CAPABILITIES},
            mechanism="PLAIN",
            response=f"\0{user}\0{password}",
            locale="en_US",
        )
    )


def assert_not_forged(log_text: str) -> None:
    lines = log_text.splitlines()
    assert not [line for line in lines if line.startswith(FORGED[:30])], log_text
    # The forged text is there, escaped, inside the broker's own line.
    assert any("\\n" + FORGED in line for line in lines), log_text


def test_a_newline_in_a_refused_login_name_does_not_forge_a_log_line(broker_factory):
    broker = broker_factory()
    with RawClient(broker.host, broker.port) as client:
        start_ok(client, f"nobody\n{FORGED}", "wrong", "raw_client")
        try:
            client.expect_connection_close()
        except ServerClosedSocket:
            pass
    assert_not_forged(broker.wait_for_log("login refused"))


def test_a_newline_in_the_client_product_does_not_forge_a_log_line(broker_factory):
    broker = broker_factory()
    with RawClient(broker.host, broker.port) as client:
        start_ok(client, "guest", "guest", f"innocent\r\n{FORGED}\x1b[2K")
        _, tune = client.expect(commands.Connection.Tune)
        client.send(commands.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0))
        client.send(commands.Connection.Open(virtual_host="/"))
        client.expect(commands.Connection.OpenOk)
        log_text = broker.wait_for_log("granted access")
    assert_not_forged(log_text)
    assert "\x1b" not in log_text and "\r" not in log_text
    assert "innocent\\r\\n" in log_text and "\\x1b[2K" in log_text
