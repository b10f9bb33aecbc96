"""connection.update-secret on an open connection: accepted as RabbitMQ's internal backend accepts
it (or checked as the password, with verify_updated_secret), answered, and permissions looked up
again."""

from __future__ import annotations

import logging

import pytest
from pamqp import commands

from amqp_server.broker.access_control import AuthenticationFailed
from amqp_server.broker.broker import Broker
from amqp_server.config.settings import load_config
from tests.frame_driver import FakeClient, methods, opened_client

REFUSED = ("NOT_ALLOWED - New secret was refused by one of the backends", 10, 70)


def close_fields(close: commands.Connection.Close) -> tuple[str, int, int]:
    assert isinstance(close, commands.Connection.Close), close
    assert close.reply_code == 530
    return close.reply_text, close.class_id, close.method_id


def test_the_right_secret_is_answered_with_update_secret_ok_and_the_connection_carries_on(caplog):
    client = opened_client()
    with caplog.at_level(logging.INFO, logger="amqp_server.connection.connection"):
        reply = client.call(0, commands.Connection.UpdateSecret("guest", "token refresh"))

    assert isinstance(reply, commands.Connection.UpdateSecretOk)
    assert isinstance(client.call(1, commands.Queue.Declare(queue="after-update")), commands.Queue.DeclareOk)
    assert "connection 127.0.0.1:50000: user 'guest' updated secret, reason: token refresh" in caplog.messages


def strict_client(broker=None) -> FakeClient:
    """A client of a broker with [server] verify_updated_secret = true."""
    client = opened_client(broker)
    client.broker.access.verify_updated_secret = True
    return client


def test_any_secret_is_accepted_for_an_internal_user_as_rabbitmq_does(caplog):
    client = opened_client()
    with caplog.at_level(logging.INFO, logger="amqp_server.connection.connection"):
        reply = client.call(0, commands.Connection.UpdateSecret("an OAuth token, not the password", "token refresh"))

    assert isinstance(reply, commands.Connection.UpdateSecretOk)
    assert isinstance(client.call(1, commands.Queue.Declare(queue="after-any-secret")), commands.Queue.DeclareOk)
    assert "connection 127.0.0.1:50000: user 'guest' updated secret, reason: token refresh" in caplog.messages


def test_the_setting_turns_the_password_check_on():
    config = load_config(["--config", "/dev/null"], {})
    assert config.verify_updated_secret is False
    assert Broker(config).access.verify_updated_secret is False
    config.verify_updated_secret = True
    assert Broker(config).access.verify_updated_secret is True


def test_with_the_check_a_wrong_secret_closes_the_connection_with_530(caplog):
    client = strict_client()
    with caplog.at_level(logging.ERROR, logger="amqp_server.connection.connection"):
        reply = client.call(0, commands.Connection.UpdateSecret("wrong", "token refresh"))

    assert close_fields(reply) == REFUSED
    assert "Secret update was refused for user 'guest': user 'guest' - invalid credentials" in caplog.messages


def test_with_the_check_the_secret_is_checked_for_the_user_the_connection_logged_in_as():
    client = strict_client()
    client.broker.access.add_user("other", "")
    client.broker.access.change_password("other", "other-secret")

    assert close_fields(client.call(0, commands.Connection.UpdateSecret("other-secret", "r"))) == REFUSED


def test_with_the_check_a_password_changed_since_login_is_the_secret_that_counts():
    renewing = strict_client()
    stale = strict_client(renewing.broker)
    renewing.broker.access.change_password("guest", "rotated")

    assert isinstance(renewing.call(0, commands.Connection.UpdateSecret("rotated", "r")), commands.Connection.UpdateSecretOk)
    assert close_fields(stale.call(0, commands.Connection.UpdateSecret("guest", "r"))) == REFUSED


def test_a_user_deleted_since_login_cannot_renew_its_secret():
    client = opened_client()
    client.broker.access.delete_user("guest")

    assert close_fields(client.call(0, commands.Connection.UpdateSecret("guest", "r"))) == REFUSED


def test_amqplain_logins_renew_their_secret_too():
    client = FakeClient()
    client.start()
    client.start_ok(mechanism="AMQPLAIN")
    client.send(0, commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0))
    client.send(0, commands.Connection.Open(virtual_host="/"))

    assert isinstance(client.call(0, commands.Connection.UpdateSecret("guest", "r")), commands.Connection.UpdateSecretOk)


def test_permissions_are_looked_up_again_after_the_secret_is_renewed():
    client = opened_client()
    assert methods(client.publish(1, b"first", exchange="amq.direct", routing_key="k")) == []
    client.broker.access.set_permissions("guest", "/", ".*", "^nothing$", ".*")
    # Until the secret is renewed the channel trusts the check it made for its first publish, as
    # RabbitMQ's per-channel permission cache does.
    assert methods(client.publish(1, b"second", exchange="amq.direct", routing_key="k")) == []

    assert isinstance(client.call(0, commands.Connection.UpdateSecret("guest", "r")), commands.Connection.UpdateSecretOk)
    (close,) = methods(client.publish(1, b"third", exchange="amq.direct", routing_key="k"))

    assert isinstance(close, commands.Channel.Close)
    assert (close.reply_code, close.reply_text) == (
        403, "ACCESS_REFUSED - access to exchange 'amq.direct' in vhost '/' refused for user 'guest'")


def test_only_a_password_mechanism_has_a_secret_to_renew():
    client = opened_client()
    access = client.broker.access
    assert access.check_new_secret("guest", "PLAIN", "anything").name == "guest"
    with pytest.raises(AuthenticationFailed, match="mechanism EXTERNAL has no secret to update"):
        access.check_new_secret("guest", "EXTERNAL", "guest")
