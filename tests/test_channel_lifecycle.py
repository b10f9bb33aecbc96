"""Channel open and close, and how a channel error stays on its channel."""

from __future__ import annotations

import struct

from pamqp import commands
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from amqp_server.connection import connection as connection_module
from tests.frame_driver import marshal, opened_client, raw_frame


def only(received):
    assert len(received) == 1, received
    return received[0]


def connection_close(received):
    channel, close = only(received)
    assert channel == 0
    assert isinstance(close, commands.Connection.Close), close
    return close


def channel_close(received, channel_id=1):
    channel, close = only(received)
    assert channel == channel_id
    assert isinstance(close, commands.Channel.Close), close
    return close


def test_opening_a_channel_twice_gives_504():
    client = opened_client()
    close = connection_close(client.open_channel(1))
    assert (close.reply_code, close.class_id, close.method_id) == (504, 20, 10)
    assert close.reply_text == "CHANNEL_ERROR - second 'channel.open' seen"


def test_method_on_an_unopened_channel_gives_504():
    client = opened_client(channels=())
    close = connection_close(client.send(1, commands.Queue.Declare(queue="q")))
    assert (close.reply_code, close.class_id, close.method_id) == (504, 50, 10)
    assert close.reply_text == "CHANNEL_ERROR - expected 'channel.open'"


def test_opening_more_channels_than_channel_max_gives_530():
    # RabbitMQ counts open channels; the channel number itself is not checked.
    client = opened_client(channels=(7, 9), channel_max=2)
    close = connection_close(client.open_channel(1))
    assert close.reply_code == 530
    assert close.reply_text == (
        "NOT_ALLOWED - number of channels opened (2) has reached the negotiated channel_max (2)"
    )


def test_content_body_without_header_gives_505():
    client = opened_client()
    close = connection_close(client.send(1, ContentBody(b"abc")))
    assert close.reply_code == 505
    assert close.reply_text == "UNEXPECTED_FRAME - expected method frame, got non method frame instead"


def test_content_header_without_publish_gives_505():
    client = opened_client()
    close = connection_close(client.send(1, ContentHeader(body_size=3)))
    assert close.reply_code == 505


def test_method_where_a_content_header_is_due_gives_505():
    client = opened_client()
    close = connection_close(
        client.send(1, commands.Basic.Publish(routing_key="q"), commands.Basic.Qos(prefetch_count=1))
    )
    assert close.reply_code == 505


def test_unknown_method_on_a_channel_gives_503():
    client = opened_client()
    close = connection_close(client.send_bytes(raw_frame(1, 1, struct.pack(">HH", 60, 999))))
    assert (close.reply_code, close.class_id, close.method_id) == (503, 60, 999)
    assert close.reply_text == "COMMAND_INVALID - unknown method"


def test_unknown_class_on_a_channel_gives_503():
    client = opened_client()
    close = connection_close(client.send_bytes(raw_frame(1, 1, struct.pack(">HH", 77, 10))))
    assert close.reply_code == 503


def test_connection_method_on_a_channel_gives_503():
    client = opened_client()
    close = connection_close(client.send(1, commands.Connection.Open(virtual_host="/")))
    assert close.reply_code == 503


def test_a_reply_text_too_long_for_a_short_string_is_cut_as_rabbitmq_cuts_it():
    client = opened_client()
    close = channel_close(client.send(1, commands.Queue.Declare(queue="q" * 255, passive=True)))
    assert close.reply_code == 404
    assert len(close.reply_text.encode()) == 255  # as RabbitMQ 3.10 answers the same declare
    assert close.reply_text == ("NOT_FOUND - no queue '" + "q" * 255)[:252] + "..."


def test_a_channel_error_closes_only_that_channel():
    client = opened_client(channels=(1, 2))
    close = channel_close(client.send(1, commands.Basic.Get(queue="missing")))
    assert (close.reply_code, close.class_id, close.method_id) == (404, 60, 70)
    assert close.reply_text == "NOT_FOUND - no queue 'missing' in vhost '/'"
    channel, declare_ok = only(client.send(2, commands.Queue.Declare(queue="still-works")))
    assert channel == 2
    assert isinstance(declare_ok, commands.Queue.DeclareOk)
    assert client.connection.state == connection_module.OPEN


def test_frames_for_a_channel_the_server_closed_are_ignored_until_close_ok():
    client = opened_client()
    client.send(1, commands.Basic.Get(queue="missing"))
    assert client.send(1, commands.Queue.Declare(queue="ignored")) == []
    body_frames = marshal(1, commands.Basic.Publish(routing_key="ignored"), ContentHeader(body_size=3), ContentBody(b"abc"))
    assert client.send_bytes(body_frames) == []
    assert "ignored" not in client.broker.vhosts["/"].queues
    assert client.send(1, commands.Channel.CloseOk()) == []
    channel, open_ok = only(client.open_channel(1))
    assert (channel, type(open_ok)) == (1, commands.Channel.OpenOk)


def test_channel_close_crossing_the_servers_close_is_answered_with_close_ok():
    client = opened_client()
    client.send(1, commands.Basic.Get(queue="missing"))
    channel, close_ok = only(client.send(1, commands.Channel.Close(200, "bye", 0, 0)))
    assert (channel, type(close_ok)) == (1, commands.Channel.CloseOk)


def test_client_channel_close_is_answered_and_the_number_may_be_reused():
    client = opened_client()
    channel, close_ok = only(client.send(1, commands.Channel.Close(200, "bye", 0, 0)))
    assert (channel, type(close_ok)) == (1, commands.Channel.CloseOk)
    assert isinstance(only(client.open_channel(1))[1], commands.Channel.OpenOk)


def test_closing_a_channel_requeues_its_unacked_messages():
    client = opened_client(channels=(1, 2))
    client.send(1, commands.Queue.Declare(queue="q"))
    client.publish(1, b"first", routing_key="q")
    get_ok = client.send(1, commands.Basic.Get(queue="q"))[0][1]
    assert not get_ok.redelivered
    client.send(1, commands.Channel.Close(200, "bye", 0, 0))
    again = client.send(2, commands.Basic.Get(queue="q"))
    assert again[0][1].redelivered
    assert again[-1][1].value == b"first"


def test_access_request_is_granted_for_old_clients():
    client = opened_client()
    client.connection.receive_data(raw_frame(1, 1, struct.pack(">HH", 30, 10) + b"\x01/\x00"))
    output = client.connection.take_output()
    assert output == raw_frame(1, 1, struct.pack(">HHH", 30, 11, 1))
