"""Authentication, vhost access and per-vhost permissions.

Relies on the users of broker_process.TEST_CONFIG (created by hand on RabbitMQ,
see README): `limited` may configure ^limited-.*, write ^limited-.*|^amq\\.default$
and read ^limited-.*|^amq\\.topic$ in "/"; nobody has permissions in vhost "other".
"""

from __future__ import annotations

import pytest
from pamqp import commands, header
from pika.exceptions import ProbableAccessDeniedError, ProbableAuthenticationError

from interop_tests.pika_helpers import channel_error, connect, connection_for_test
from interop_tests.raw_client import RawClient

LOGIN_REFUSED = (
    "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
    "For details see the broker logfile."
)


def pika_close_reason(code: int, text: str) -> str:
    """How pika's Probable*Error reports the broker's connection.close."""
    return f"ConnectionClosedByBroker: ({code}) {text!r}"


def raw_login(broker, user: str, password: str) -> commands.Connection.Close:
    """Send start-ok with PLAIN credentials and return the server's connection.close."""
    with RawClient(broker.host, broker.port) as client:
        client.send(header.ProtocolHeader())
        client.expect(commands.Connection.Start)
        client.send(commands.Connection.StartOk(
            client_properties={"capabilities": {"authentication_failure_close": True}},
            mechanism="PLAIN", response=f"\0{user}\0{password}", locale="en_US"))
        return client.expect_connection_close()


def raw_open_vhost(broker, user: str, password: str, vhost: str) -> commands.Connection.Close:
    with RawClient(broker.host, broker.port) as client:
        client.send(header.ProtocolHeader())
        client.expect(commands.Connection.Start)
        client.send(commands.Connection.StartOk(mechanism="PLAIN", response=f"\0{user}\0{password}"))
        _, tune = client.expect(commands.Connection.Tune)
        client.send(commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0))
        client.send(commands.Connection.Open(virtual_host=vhost))
        return client.expect_connection_close()


@pytest.mark.parametrize(("user", "password"), [("guest", "wrong"), ("nobody", "guest")])
def test_failed_login_is_refused_with_403(broker, user, password):
    with pytest.raises(ProbableAuthenticationError) as error:
        connect(broker, user, password)

    assert error.value.args[0] == pika_close_reason(403, LOGIN_REFUSED)


def test_failed_login_close_frame_is_a_403_connection_close(broker):
    close = raw_login(broker, "guest", "wrong")

    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (403, LOGIN_REFUSED, 0, 0)


def test_vhost_without_permissions_is_refused_with_530(broker):
    with pytest.raises(ProbableAccessDeniedError) as error:
        connect(broker, vhost="other")

    assert error.value.args[0] == pika_close_reason(530, "NOT_ALLOWED - access to vhost 'other' refused for user 'guest'")


def test_vhost_refusal_close_frame_names_connection_open(broker):
    close = raw_open_vhost(broker, "limited", "limited", "other")

    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        530, "NOT_ALLOWED - access to vhost 'other' refused for user 'limited'", 10, 40)


def test_missing_vhost_is_refused_with_530(broker, unique):
    vhost = unique("no-such-vhost")

    with pytest.raises(ProbableAccessDeniedError) as error:
        connect(broker, vhost=vhost)

    assert error.value.args[0] == pika_close_reason(530, f"NOT_ALLOWED - vhost {vhost} not found")


def test_other_users_with_permissions_can_work(broker, unique):
    with connect(broker, "remote", "remote") as connection:
        channel = connection.channel()
        queue = channel.queue_declare(unique("remote-q"), exclusive=True).method.queue
        channel.basic_publish("", queue, b"hi")
        assert channel.basic_get(queue, auto_ack=True)[2] == b"hi"


@pytest.fixture
def limited(broker):
    yield from connection_for_test(broker, "limited", "limited")


def refusal(kind: str, name: str) -> tuple[int, str]:
    return 403, f"ACCESS_REFUSED - access to {kind} '{name}' in vhost '/' refused for user 'limited'"


def test_limited_user_works_with_resources_matching_its_patterns(limited, unique):
    channel = limited.channel()
    channel.confirm_delivery()
    queue = unique("limited-q")
    channel.queue_declare(queue, exclusive=True)
    channel.queue_bind(queue, "amq.topic", "news.#")  # read on amq.topic is allowed

    channel.basic_publish("", queue, b"via default exchange")  # write on amq.default is allowed
    assert channel.basic_get(queue, auto_ack=True)[2] == b"via default exchange"
    assert channel.queue_purge(queue).method.message_count == 0


def test_limited_user_receives_what_others_publish_to_amq_topic(broker, limited, unique):
    channel = limited.channel()
    queue = unique("limited-q")
    channel.queue_declare(queue, exclusive=True)
    channel.queue_bind(queue, "amq.topic", queue)

    with connect(broker) as publisher:
        confirming = publisher.channel()
        confirming.confirm_delivery()
        confirming.basic_publish("amq.topic", queue, b"news")

    assert channel.basic_get(queue, auto_ack=True)[2] == b"news"


def test_configure_permission_is_needed_to_declare_a_queue(limited, unique):
    queue = unique("not-limited")
    channel = limited.channel()

    assert channel_error(lambda: channel.queue_declare(queue, exclusive=True)) == refusal("queue", queue)


def test_configure_permission_is_checked_against_server_generated_names(limited):
    channel = limited.channel()

    code, text = channel_error(lambda: channel.queue_declare("", exclusive=True))

    assert code == 403
    assert text.startswith("ACCESS_REFUSED - access to queue 'amq.gen-")
    assert text.endswith("' in vhost '/' refused for user 'limited'")


def test_configure_permission_is_needed_to_declare_or_delete_an_exchange(limited, unique):
    exchange, queue = unique("not-limited-x"), unique("not-limited-q")
    declaring, deleting = limited.channel(), limited.channel()

    assert channel_error(lambda: declaring.exchange_declare(exchange, "direct")) == refusal("exchange", exchange)
    assert channel_error(lambda: deleting.queue_delete(queue)) == refusal("queue", queue)


def test_write_permission_is_needed_to_publish(limited):
    channel = limited.channel()
    channel.confirm_delivery()

    assert channel_error(lambda: channel.basic_publish("amq.direct", "k", b"x")) == refusal("exchange", "amq.direct")


def test_read_permission_on_the_exchange_is_needed_to_bind(limited, unique):
    channel = limited.channel()
    queue = unique("limited-q")
    channel.queue_declare(queue, exclusive=True)
    other = limited.channel()

    assert channel_error(lambda: other.queue_bind(queue, "amq.direct", "k")) == refusal("exchange", "amq.direct")


@pytest.mark.parametrize("operation", ["get", "consume", "purge"])
def test_read_permission_is_needed_to_take_from_a_queue(broker, limited, unique, operation):
    queue = unique("guest-owned")
    with connect(broker) as owner:
        owner.channel().queue_declare(queue)
        try:
            channel = limited.channel()
            operations = {
                "get": lambda: channel.basic_get(queue),
                "consume": lambda: channel.basic_consume(queue, lambda *args: None),
                "purge": lambda: channel.queue_purge(queue),
            }
            assert channel_error(operations[operation]) == refusal("queue", queue)
        finally:
            owner.channel().queue_delete(queue)


def test_passive_declare_needs_no_permission(broker, limited, unique):
    queue = unique("guest-owned")
    with connect(broker) as owner:
        owner.channel().queue_declare(queue)
        try:
            assert limited.channel().queue_declare(queue, passive=True).method.queue == queue
        finally:
            owner.channel().queue_delete(queue)
