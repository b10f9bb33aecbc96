"""A refused login, as RabbitMQ 3.10 ends it (checked with INTEROP_BROKER_URL; there it resets
the socket where this broker closes it, which a client sees the same way).

RabbitMQ sends connection.close (403) to a client that announced authentication_failure_close,
nothing to others, and keeps the socket for 3 s or until the client's close-ok: the client
reads "access refused" before the socket goes. Until then it still answers a connection.close
with close-ok. An unknown SASL mechanism gets no reply at all and the same 3 s wait. The tests
that read this broker's configuration or memory start their own.
"""

from __future__ import annotations

import time

import pika
import pytest
from pamqp import commands, header
from pika.exceptions import ProbableAccessDeniedError, ProbableAuthenticationError

from bench.procfs import rss_kib
from interop_tests.broker_process import TEST_CONFIG
from interop_tests.raw_client import RawClient, ServerClosedSocket

LOGIN_REFUSED = (
    "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
    "For details see the broker logfile."
)
CLOSE_DELAY_S = 3.0  # RabbitMQ's, and this broker's default refused_login_close_delay_ms
PROMPTLY_S = 1.5  # well under the delay: the socket went because of what the client did
WAITING_SOCKETS = 200


def refused(broker, capabilities: dict | None = None, mechanism: str = "PLAIN") -> RawClient:
    """A raw client whose login with a wrong password has just been sent."""
    client = RawClient(broker.host, broker.port, timeout=15)
    client.send(header.ProtocolHeader())
    client.expect(commands.Connection.Start)
    client.send(commands.Connection.StartOk(
        client_properties={"capabilities": {"authentication_failure_close": True} if capabilities is None else capabilities},
        mechanism=mechanism, response="\0guest\0wrong", locale="en_US"))
    return client


def closed_after(client: RawClient) -> float:
    """Seconds until the broker closes the socket, sending no frame meanwhile."""
    start = time.monotonic()
    with pytest.raises(ServerClosedSocket):
        channel, value = client.read_frame(timeout=15)
        pytest.fail(f"expected no frame, got {value!r} on channel {channel}")
    return time.monotonic() - start


def test_pika_blocking_connection_reports_access_refused_never_a_reset(broker):
    for _ in range(20):  # a reset would show up as StreamLostError / AMQPConnectionError instead
        with pytest.raises(ProbableAuthenticationError) as error:
            pika.BlockingConnection(pika.URLParameters(broker.url("guest", "wrong")))
        assert error.value.args[0] == f"ConnectionClosedByBroker: (403) {LOGIN_REFUSED!r}"


def test_the_socket_stays_open_after_the_403_close_and_still_answers_a_close(broker):
    with refused(broker) as client:
        _, close = client.expect(commands.Connection.Close)
        assert (close.reply_code, close.reply_text) == (403, LOGIN_REFUSED)
        client.send(commands.Connection.Close(200, "bye", 0, 0))
        client.expect(commands.Connection.CloseOk)


def test_close_ok_after_the_403_close_ends_the_connection_at_once(broker):
    with refused(broker) as client:
        client.expect(commands.Connection.Close)
        client.send(commands.Connection.CloseOk())
        assert closed_after(client) < PROMPTLY_S


def test_without_close_ok_the_socket_is_closed_after_the_delay(broker):
    with refused(broker) as client:
        client.expect(commands.Connection.Close)
        assert CLOSE_DELAY_S - 0.5 < closed_after(client) < CLOSE_DELAY_S + 2


def test_a_client_without_authentication_failure_close_gets_no_frame_and_the_same_delay(broker):
    with refused(broker, capabilities={}) as client:
        assert CLOSE_DELAY_S - 0.5 < closed_after(client) < CLOSE_DELAY_S + 2


def test_an_unknown_mechanism_gets_no_reply_and_the_same_delay(broker):
    with refused(broker, mechanism="NO-SUCH-MECHANISM") as client:
        assert CLOSE_DELAY_S - 0.5 < closed_after(client) < CLOSE_DELAY_S + 2


def test_the_delay_is_configurable(broker_factory):
    own = broker_factory(config_text=TEST_CONFIG + "\n[limits]\nrefused_login_close_delay_ms = 500\n")
    with refused(own) as client:
        client.expect(commands.Connection.Close)
        assert closed_after(client) < PROMPTLY_S


def test_a_socket_waiting_after_a_refused_login_counts_against_max_connections(broker_factory):
    own = broker_factory(config_text=TEST_CONFIG + "\n[limits]\nmax_connections = 1\nrefused_login_close_delay_ms = 60000\n")
    # The harness's own port probe may still hold the only slot when the first socket comes; a
    # socket that finds the slot free holds it until it closes, so try again in that case.
    for _attempt in range(5):
        with refused(own) as waiting:
            waiting.expect(commands.Connection.Close)
            try:
                pika.BlockingConnection(pika.URLParameters(own.url())).close()
            except ProbableAccessDeniedError as error:
                assert "broker connection limit (1) is reached" in str(error)
                waiting.send(commands.Connection.CloseOk())
                closed_after(waiting)
                break
    else:
        pytest.fail("a connection opened while a socket waited after its refused login")
    deadline = time.monotonic() + 5
    while True:  # the broker frees the slot when it sees the socket go, just after the client does
        try:
            pika.BlockingConnection(pika.URLParameters(own.url())).close()
            return
        except ProbableAccessDeniedError:
            assert time.monotonic() < deadline, "the slot of the closed socket was never given back"
            time.sleep(0.05)


def test_sockets_waiting_after_a_refused_login_hold_a_few_kib_each(broker_factory):
    own = broker_factory(config_text=TEST_CONFIG + "\n[limits]\nrefused_login_close_delay_ms = 60000\n")
    resting_kib = rss_kib(own.process.pid)
    clients = []
    for _ in range(WAITING_SOCKETS):
        client = refused(own)
        client.expect(commands.Connection.Close)
        client.send(commands.Connection.Close(200, "bye", 0, 0))
        client.expect(commands.Connection.CloseOk)  # still there, and read
        # Most of a frame of the largest size still read: the broker holds it, and no more.
        client.send_bytes(b"\x01\x00\x00" + (500).to_bytes(4, "big") + b"\x00" * 400)
        clients.append(client)
    per_socket_kib = (rss_kib(own.process.pid) - resting_kib) / WAITING_SOCKETS
    for client in clients:
        client.close()
    assert per_socket_kib < 8, per_socket_kib
