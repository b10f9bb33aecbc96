"""Vhost and user limits refuse pika clients with RabbitMQ's codes and texts, when the limit is hit.

Each test works in a vhost (or as a user) of its own, made over the management API and removed
afterwards. Checked against RabbitMQ 3.10 with INTEROP_BROKER_URL and INTEROP_MANAGEMENT_URL.
"""

from __future__ import annotations

import pytest
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker, ProbableAccessDeniedError

from interop_tests.broker_process import BrokerProcess
from interop_tests.management_helpers import api, managed, quote  # noqa: F401 (fixtures)
from interop_tests.pika_helpers import connect


def refusal(broker: BrokerProcess, vhost: str, user: str = "guest", password: str = "guest") -> tuple[int, str]:
    """pika reports a close at connection.open as ProbableAccessDeniedError naming the close."""
    with pytest.raises(ProbableAccessDeniedError) as raised:
        connect(broker, user, password, vhost)
    reported = str(raised.value)
    code, text = reported.split("ConnectionClosedByBroker: (", 1)[1].split(') "', 1)
    return int(code), text.rsplit('"', 1)[0]


def test_a_vhosts_connection_limit_refuses_the_next_connection(api, managed, unique):
    broker, vhost = managed[0], unique("lim-conn")
    api.add_vhost(vhost)
    api.put(f"/api/vhost-limits/{quote(vhost)}/max-connections", {"value": 1})
    first = connect(broker, vhost=vhost)
    try:
        assert refusal(broker, vhost) == (
            530, f"NOT_ALLOWED - access to vhost '{vhost}' refused for user 'guest': connection limit (1) is reached")
    finally:
        first.close()


def test_a_vhost_limit_of_zero_refuses_every_connection(api, managed, unique):
    broker, vhost = managed[0], unique("lim-zero")
    api.add_vhost(vhost)
    api.put(f"/api/vhost-limits/{quote(vhost)}/max-connections", {"value": 0})
    assert refusal(broker, vhost)[0] == 530


def test_a_vhosts_queue_limit_refuses_the_next_new_queue(api, managed, unique):
    broker, vhost = managed[0], unique("lim-queues")
    api.add_vhost(vhost)
    api.put(f"/api/vhost-limits/{quote(vhost)}/max-queues", {"value": 1})
    connection = connect(broker, vhost=vhost)
    try:
        channel = connection.channel()
        channel.queue_declare("one")
        channel.queue_declare("one")  # a redeclare is not a new queue
        with pytest.raises(ChannelClosedByBroker) as raised:
            channel.queue_declare("two")
        assert (raised.value.reply_code, raised.value.reply_text) == (
            406, f"PRECONDITION_FAILED - cannot declare queue 'two': queue limit in vhost '{vhost}' (1) is reached")
    finally:
        connection.close()


@pytest.fixture
def user(api, unique) -> str:
    """A user of its own with every permission on "/"."""
    name = unique("lim-user")
    api.put(f"/api/users/{name}", {"password": name, "tags": ""})
    api.put(f"/api/permissions/%2F/{name}", {"configure": ".*", "write": ".*", "read": ".*"})
    return name


def test_a_users_connection_limit_refuses_their_next_connection(api, managed, user):
    broker = managed[0]
    api.put(f"/api/user-limits/{user}/max-connections", {"value": 1})
    first = connect(broker, user, user)
    try:
        assert refusal(broker, "/", user, user) == (
            530, f"NOT_ALLOWED - connection refused for user '{user}': user connection limit (1) is reached")
    finally:
        first.close()


def test_a_users_channel_limit_closes_the_connection_that_opens_one_more(api, managed, user):
    broker = managed[0]
    api.put(f"/api/user-limits/{user}/max-channels", {"value": 2})
    first, second = connect(broker, user, user), connect(broker, user, user)
    try:
        first.channel()
        second.channel()
        with pytest.raises(ConnectionClosedByBroker) as raised:
            second.channel()
        assert (raised.value.reply_code, raised.value.reply_text) == (
            530, f"NOT_ALLOWED - number of channels opened for user '{user}' has reached the maximum allowed user "
                 "limit of (2)")
    finally:
        first.close()


def test_limits_are_listed_as_rabbitmq_lists_them(api, unique, user):
    vhost = unique("lim-list")
    api.add_vhost(vhost)
    api.put(f"/api/vhost-limits/{quote(vhost)}/max-queues", {"value": 7})
    api.put(f"/api/user-limits/{user}/max-channels", {"value": 3})
    assert api.get(f"/api/vhost-limits/{quote(vhost)}") == [{"vhost": vhost, "value": {"max-queues": 7}}]
    assert api.get(f"/api/user-limits/{user}") == [{"user": user, "value": {"max-channels": 3}}]


def test_refused_limits_answer_rabbitmqs_texts(api, unique, user):
    vhost = unique("lim-bad")
    api.add_vhost(vhost)
    vhost_limit, user_limit = f"/api/vhost-limits/{quote(vhost)}", f"/api/user-limits/{user}"
    cases = [
        # A vhost's limits are a runtime parameter ("Validation failed"); a user's are not.
        (f"{vhost_limit}/max-channels", {"value": 3},
         'Validation failed\n\nUnrecognised terms [{<<"max-channels">>,3}] in limits\n'),
        (f"{vhost_limit}/max-queues", {"value": "5"},
         'Validation failed\n\nmax-queues should be a number, actually was <<"5">>\n'),
        (f"{vhost_limit}/max-queues", {"valu": 5}, "[{key_missing,value}]"),
        (f"{user_limit}/max-queues", {"value": 3}, 'Unrecognised terms [{<<"max-queues">>,3}] in user-limits'),
        (f"{user_limit}/max-channels", {"value": 1.5}, "max-channels should be a number, actually was 1.5"),
        (f"{user_limit}/max-channels", {}, "[{key_missing,value}]"),
    ]
    for path, body, text in cases:
        reply = api.request("PUT", path, body)
        assert (reply.status_code, reply.json()) == (400, {"error": "bad_request", "reason": text}), path
    assert api.get(f"/api/vhost-limits/{quote(vhost)}") == [] and api.get(user_limit) == []
    reply = api.request("PUT", f"/api/vhost-limits/{quote(unique('lim-none'))}/max-queues", {"value": 1})
    assert (reply.status_code, reply.json()) == (404, {"error": "not_found", "reason": "vhost_not_found"})
