"""The connection handshake, driven frame by frame: header, start, login, tune, open."""

from __future__ import annotations

import logging
import re

import pytest

from pamqp import commands
from pamqp.header import ProtocolHeader

from amqp_server.connection import connection as connection_module
from amqp_server.broker.broker import Broker
from amqp_server.config.settings import LimitsConfig, ServerConfig
from tests.frame_driver import PROTOCOL_HEADER, FakeClient, marshal, methods, plain_response, publish_frames


def only_method(received):
    assert len(received) == 1, received
    return received[0][1]


def test_wrong_protocol_header_is_answered_with_ours_then_closed():
    client = FakeClient()
    client.connection.receive_data(b"AMQP\x00\x00\x09\x00")
    assert client.connection.take_output() == PROTOCOL_HEADER
    assert client.connection.state == connection_module.CLOSED
    assert client.connection.close_when_flushed


def test_http_request_instead_of_amqp_is_answered_with_our_header():
    client = FakeClient()
    assert isinstance(only_method(client.send_bytes(b"GET / HTTP/1.1\r\n\r\n")), ProtocolHeader)
    assert client.connection.close_when_flushed


def test_input_after_a_wrong_header_is_ignored():
    client = FakeClient()
    client.send_bytes(b"AMQP\x01\x01\x00\x0a")
    assert client.send(0, commands.Connection.StartOk(response=plain_response("guest", "guest"))) == []


def test_legacy_0_9_header_starts_a_0_9_1_handshake():
    client = FakeClient()
    start = only_method(client.start(b"AMQP\x01\x01\x00\x09"))
    assert isinstance(start, commands.Connection.Start)
    assert (start.version_major, start.version_minor) == (0, 9)


def test_legacy_0_9_header_leads_to_an_open_connection():
    client = FakeClient()
    client.start(b"AMQP\x01\x01\x00\x09")
    client.start_ok()
    client.send(0, commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0))
    assert isinstance(only_method(client.send(0, commands.Connection.Open(virtual_host="/"))), commands.Connection.OpenOk)


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (b"AMQP\x00\x00\x09\x02", "{bad_version,{0,0,9,2}}"),
        (b"AMQP\x01\x01\x00\x0a", "{bad_version,{1,1,0,10}}"),
        (b"AMQP\x00\x01\x00\x00", "amqp1_0_plugin_not_enabled"),
        (b"AMQP\x03\x01\x00\x00", "amqp1_0_plugin_not_enabled"),
        # Near AMQP 0-8's two headers (protocols.py), which RabbitMQ 3.10.8 accepts; not these.
        (b"AMQP\x01\x01\x08\x01", "{bad_version,{1,1,8,1}}"),
        (b"AMQP\x00\x00\x08\x00", "{bad_version,{0,0,8,0}}"),
        (b"GET / HTTP/1.1\r\n", '{bad_header,<<"GET / HT">>}'),
    ],
)
def test_refused_header_is_logged_with_the_peer_and_what_it_sent(caplog, header, reason):
    client = FakeClient()
    with caplog.at_level(logging.ERROR, logger="amqp_server.connection.connection"):
        assert isinstance(only_method(client.send_bytes(header)), ProtocolHeader)
    assert client.connection.close_when_flushed
    assert [record.getMessage() for record in caplog.records] == [
        f"closing AMQP connection 127.0.0.1:50000: {reason}"
    ]


def test_start_names_the_product_with_a_dotted_version_and_capabilities():
    start = only_method(FakeClient().start())
    assert isinstance(start, commands.Connection.Start)
    assert (start.version_major, start.version_minor) == (0, 9)
    properties = start.server_properties
    assert properties["product"] == "amqp-server"
    assert re.fullmatch(r"\d+(\.\d+)+", properties["version"])
    capabilities = properties["capabilities"]
    for name in (
        "publisher_confirms",
        "basic.nack",
        "consumer_cancel_notify",
        "exchange_exchange_bindings",
        "consumer_priorities",
        "authentication_failure_close",
        "per_consumer_qos",
        "direct_reply_to",
    ):
        assert capabilities.get(name) is True, name
    assert set(start.mechanisms.split()) >= {"PLAIN", "AMQPLAIN"}
    assert "en_US" in start.locales.split()


def test_plain_login_is_answered_with_tune():
    client = FakeClient()
    client.start()
    tune = only_method(client.start_ok(mechanism="PLAIN"))
    assert isinstance(tune, commands.Connection.Tune)
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (2047, 131072, 60)


def test_amqplain_login_is_answered_with_tune():
    client = FakeClient()
    client.start()
    assert isinstance(only_method(client.start_ok(mechanism="AMQPLAIN")), commands.Connection.Tune)


def test_wrong_password_gives_403_close_when_client_advertises_authentication_failure_close():
    client = FakeClient()
    client.start()
    close = only_method(client.start_ok(password="wrong"))
    assert isinstance(close, commands.Connection.Close)
    assert close.reply_code == 403
    assert close.reply_text == (
        "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
        "For details see the broker logfile."
    )


def test_after_a_refused_login_the_socket_waits_for_close_ok():
    client = FakeClient()
    client.start()
    client.start_ok(password="wrong")
    # RabbitMQ keeps the socket for 3 s (the shell's close-ok timeout) so the client reads the close.
    assert client.connection.state == connection_module.CLOSING
    assert not client.connection.close_when_flushed
    assert client.connection.close_ok_timeout_s == 3.0

    assert client.send(0, commands.Connection.CloseOk()) == []
    assert client.connection.state == connection_module.CLOSED
    assert client.connection.close_when_flushed


def test_a_close_after_a_refused_login_is_answered_and_the_wait_goes_on():
    client = FakeClient()
    client.start()
    client.start_ok(password="wrong")
    assert isinstance(only_method(client.send(0, commands.Connection.Close(200, "bye", 0, 0))), commands.Connection.CloseOk)
    assert client.connection.state == connection_module.CLOSING


def test_frames_after_a_refused_login_are_ignored_and_a_big_one_ends_the_wait():
    client = FakeClient()
    client.start()
    client.start_ok(password="wrong")
    assert client.send(0, commands.Connection.TuneOk(channel_max=0, frame_max=131072, heartbeat=0)) == []
    assert client.send(1, commands.Channel.Open()) == []
    assert client.connection.state == connection_module.CLOSING
    # A frame of more than 512 bytes is not something to wait for: the socket closes now.
    client.send_bytes(b"\x01\x00\x00\x00\x00\x10\x00" + b"\x00" * 4096)
    assert client.connection.state == connection_module.CLOSED
    assert client.connection.close_when_flushed


def test_wrong_password_closes_without_a_frame_when_client_lacks_authentication_failure_close():
    client = FakeClient()
    client.start()
    assert client.start_ok(password="wrong", capabilities={}) == []
    # RabbitMQ sends nothing but still closes only after its 3 s delay (or the client's close-ok).
    assert client.connection.state == connection_module.CLOSING
    assert not client.connection.close_when_flushed


def test_an_unknown_mechanism_gets_no_reply_and_is_not_read_any_more():
    client = FakeClient()
    client.start()
    paused = []
    client.connection.on_reading_paused = paused.append
    reply = client.send(0, commands.Connection.StartOk(
        client_properties={"capabilities": {"authentication_failure_close": True}}, mechanism="FOO", response="x"))
    # RabbitMQ: no connection.close, the socket is dropped 3 s later whatever the client sends.
    assert reply == []
    assert paused == [True]
    assert client.send(0, commands.Connection.CloseOk()) == []
    assert client.connection.state == connection_module.CLOSING


def test_a_refused_login_delay_of_zero_closes_once_the_close_is_written():
    broker = Broker(ServerConfig(limits=LimitsConfig(refused_login_close_delay_ms=0)))
    client = FakeClient(broker)
    client.start()
    assert only_method(client.start_ok(password="wrong")).reply_code == 403
    assert client.connection.close_when_flushed


def test_wrong_amqplain_password_names_the_mechanism_in_the_close():
    client = FakeClient()
    client.start()
    close = only_method(client.start_ok(password="wrong", mechanism="AMQPLAIN"))
    assert close.reply_code == 403
    assert "mechanism AMQPLAIN" in close.reply_text


def test_guest_is_refused_from_a_remote_peer():
    client = FakeClient(peer_host="10.1.2.3")
    client.start()
    assert only_method(client.start_ok()).reply_code == 403


def test_login_without_tune_ok_cannot_open_and_gets_no_reply(caplog):
    client = FakeClient()
    client.start()
    client.start_ok()
    # RabbitMQ answers a client that has not tuned yet with nothing: the socket goes 3 s later.
    with caplog.at_level(logging.WARNING, logger="amqp_server.connection.connection"):
        assert client.send(0, commands.Connection.Open(virtual_host="/")) == []
    assert client.connection.state == connection_module.CLOSING
    assert client.send(0, commands.Connection.CloseOk()) == []  # not even read any more
    assert client.connection.state == connection_module.CLOSING
    assert "CHANNEL_ERROR - unexpected method in connection state tuning" in caplog.text


def test_a_channel_frame_before_login_gets_no_reply():
    client = FakeClient()
    client.start()
    assert client.send(1, commands.Channel.Open()) == []
    assert client.connection.state == connection_module.CLOSING


def test_anything_but_connection_open_after_tuning_is_504_naming_the_method():
    client = FakeClient()
    client.start()
    client.start_ok()
    client.send(0, commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0))
    close = only_method(client.send(0, commands.Connection.Close(200, "bye", 0, 0)))
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        504, "CHANNEL_ERROR - unexpected method in connection state opening", 10, 50)


def test_a_channel_frame_after_tuning_but_before_open_is_505():
    client = FakeClient()
    client.start()
    client.start_ok()
    client.send(0, commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0))
    close = only_method(client.send(1, commands.Channel.Open()))
    assert (close.reply_code, close.reply_text) == (505, "UNEXPECTED_FRAME - type 1, all octets = <<0,20,0,10,1,48>>")


def test_tune_ok_with_frame_max_4096_is_accepted():
    client = FakeClient()
    assert isinstance(client.handshake(frame_max=4096)[-1][1], commands.Connection.OpenOk)
    assert client.connection.frame_max == 4096


def test_tune_ok_with_frame_max_4095_is_refused():
    # RabbitMQ 3.10 closes the socket silently during tuning; we say why in a 530 close.
    client = FakeClient()
    client.start()
    client.start_ok()
    close = only_method(client.send(0, commands.Connection.TuneOk(channel_max=2047, frame_max=4095, heartbeat=0)))
    assert isinstance(close, commands.Connection.Close)
    assert close.reply_code == 530
    assert close.reply_text == "NOT_ALLOWED - frame_max=4095 < 4096 min size"
    assert client.send(0, commands.Connection.Open(virtual_host="/")) == []


def test_tune_ok_with_frame_max_above_the_servers_is_refused():
    client = FakeClient()
    client.start()
    client.start_ok()
    close = only_method(client.send(0, commands.Connection.TuneOk(channel_max=2047, frame_max=131073, heartbeat=0)))
    assert close.reply_code == 530


def test_tune_ok_with_frame_max_zero_keeps_the_servers_maximum():
    client = FakeClient()
    assert isinstance(client.handshake(frame_max=0)[-1][1], commands.Connection.OpenOk)
    assert client.connection.frame_max == 131072


def test_open_of_an_unknown_vhost_gives_530():
    client = FakeClient()
    close = only_method(client.handshake(vhost="nope"))
    assert isinstance(close, commands.Connection.Close)
    assert (close.reply_code, close.class_id, close.method_id) == (530, 10, 40)
    assert close.reply_text == "NOT_ALLOWED - vhost nope not found"


def test_open_of_a_vhost_without_permissions_gives_530():
    broker = Broker()
    broker.add_vhost("other")
    close = only_method(FakeClient(broker).handshake(vhost="other"))
    assert close.reply_code == 530
    assert close.reply_text == "NOT_ALLOWED - access to vhost 'other' refused for user 'guest'"


def test_client_close_is_answered_with_close_ok_and_ends_the_connection():
    client = FakeClient()
    client.handshake()
    close_ok = only_method(client.send(0, commands.Connection.Close(200, "bye", 0, 0)))
    assert isinstance(close_ok, commands.Connection.CloseOk)
    assert client.connection.state == connection_module.CLOSED


def test_close_ok_after_a_server_close_ends_the_connection():
    client = FakeClient()
    client.start()
    client.start_ok(password="wrong")
    assert client.send(0, commands.Connection.CloseOk()) == []
    assert client.connection.state == connection_module.CLOSED


def test_output_callback_fires_when_output_becomes_available():
    client = FakeClient()
    client.connection.receive_data(PROTOCOL_HEADER)
    assert client.output_signals == 1
    client.connection.take_output()
    assert client.connection.take_output() == b""


def _whole_session() -> bytes:
    return b"".join(
        (
            PROTOCOL_HEADER,
            marshal(
                0,
                commands.Connection.StartOk(
                    client_properties={"capabilities": {"publisher_confirms": True}},
                    mechanism="PLAIN",
                    response=plain_response("guest", "guest"),
                ),
                commands.Connection.TuneOk(channel_max=2047, frame_max=4096, heartbeat=0),
                commands.Connection.Open(virtual_host="/"),
            ),
            marshal(1, commands.Channel.Open(), commands.Confirm.Select(), commands.Queue.Declare(queue="split")),
            publish_frames(1, b"x" * 10000, routing_key="split", frame_max=4096),
            marshal(1, commands.Basic.Consume(queue="split", consumer_tag="c1")),
            publish_frames(1, b"second", routing_key="split", frame_max=4096),
            marshal(1, commands.Basic.Ack(delivery_tag=2, multiple=True)),
        )
    )


def test_frames_split_at_every_byte_give_the_same_output_as_one_chunk():
    session = _whole_session()
    whole = FakeClient()
    whole.connection.receive_data(session)
    expected = whole.connection.take_output()
    split = FakeClient()
    for index in range(len(session)):
        split.connection.receive_data(session[index : index + 1])
    assert split.connection.take_output() == expected
    # And the session did what it says: both messages delivered and confirmed with one ack.
    received = methods(FakeClient().send_bytes(session))
    assert [type(method).__name__ for method in received] == [
        "Start", "Tune", "OpenOk", "OpenOk", "SelectOk", "DeclareOk", "ConsumeOk", "Deliver", "Deliver", "Ack",
    ]
    assert (received[-1].delivery_tag, received[-1].multiple) == (2, True)


def test_a_second_start_ok_or_open_on_an_open_connection_is_504_not_a_new_login():
    for method in (
        commands.Connection.StartOk(response=plain_response("guest", "guest")),
        commands.Connection.Open(virtual_host="/"),
    ):
        client = FakeClient()
        client.handshake()
        close = only_method(client.send(0, method))
        assert (close.reply_code, close.reply_text) == (504, "CHANNEL_ERROR - unexpected method in connection state running")
        assert client.connection.state == connection_module.CLOSING


def test_channel_open_ok_carries_an_empty_channel_id_as_rabbitmq_sends_it():
    client = FakeClient()
    client.handshake()
    assert client.open_channel(1)[0][1].channel_id == ""


def test_frames_sent_along_with_an_unknown_mechanism_are_not_read():
    client = FakeClient()
    client.start()
    start_ok = commands.Connection.StartOk(client_properties={}, mechanism="FOO", response="x")
    assert client.send(0, start_ok, commands.Connection.CloseOk()) == []
    assert client.connection.state == connection_module.CLOSING
