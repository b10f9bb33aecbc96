"""A client's queue.declare without x-queue-type becomes a quorum (replicated) queue when it carries
x-quorum-initial-group-size or the broker's default_queue_type is quorum, if it is durable,
non-exclusive and non-auto-delete; redeclaring it as the client first did stays equivalent."""

from __future__ import annotations

from typing import Any

import pytest
from pamqp import commands

from amqp_server.broker.broker import Broker
from amqp_server.config.settings import ServerConfig
from amqp_server.management.definitions_import import import_definitions
from tests.frame_driver import methods, opened_client

GROUP_SIZE = {"x-quorum-initial-group-size": 3}


def broker(default_queue_type: str = "classic") -> Broker:
    return Broker(ServerConfig(default_queue_type=default_queue_type))


def declare(client: Any, name: str, channel: int = 1, **options: Any) -> Any:
    options.setdefault("durable", True)
    return methods(client.send(channel, commands.Queue.Declare(queue=name, **options)))[0]


def queue_type(broker: Broker, name: str) -> Any:
    return broker.vhosts["/"].queues[name].arguments.get("x-queue-type")


def test_a_durable_queue_asking_for_a_group_size_is_a_quorum_queue():
    server = broker()
    client = opened_client(server)

    assert isinstance(declare(client, "q", arguments=GROUP_SIZE), commands.Queue.DeclareOk)

    assert queue_type(server, "q") == "quorum"
    # Stored as quorum, so RabbitMQ's quorum checks apply to it from now on.
    assert server.vhosts["/"].queues["q"].settings.queue_type == "quorum"


def test_the_quorum_checks_apply_to_a_queue_made_quorum_by_its_group_size():
    client = opened_client(broker())

    refused = declare(client, "q", arguments={**GROUP_SIZE, "x-max-priority": 5})

    assert isinstance(refused, commands.Channel.Close)
    assert refused.reply_code == 406
    assert "invalid arg 'x-max-priority'" in refused.reply_text
    assert "rabbit_quorum_queue" in refused.reply_text


@pytest.mark.parametrize("default_queue_type", ["classic", "quorum"])
@pytest.mark.parametrize(
    "flags", [{"durable": False}, {"exclusive": True}, {"auto_delete": True}],
    ids=["transient", "exclusive", "auto-delete"],
)
def test_transient_exclusive_and_auto_delete_queues_stay_classic(default_queue_type, flags):
    server = broker(default_queue_type)
    client = opened_client(server)

    assert isinstance(declare(client, "q", arguments=dict(GROUP_SIZE), **flags), commands.Queue.DeclareOk)

    assert queue_type(server, "q") is None
    assert server.vhosts["/"].queues["q"].settings.queue_type != "quorum"


def test_the_quorum_default_makes_a_plain_durable_queue_quorum():
    server = broker("quorum")
    client = opened_client(server)

    assert isinstance(declare(client, "q"), commands.Queue.DeclareOk)

    assert queue_type(server, "q") == "quorum"


def test_the_classic_default_keeps_a_plain_durable_queue_classic():
    server = broker()
    client = opened_client(server)

    declare(client, "q")

    assert queue_type(server, "q") is None


def test_an_explicit_type_wins_over_the_default():
    server = broker("quorum")
    client = opened_client(server)

    declare(client, "q", arguments={"x-queue-type": "classic"})

    assert queue_type(server, "q") == "classic"


def test_a_server_named_queue_stays_classic_under_the_quorum_default():
    server = broker("quorum")
    client = opened_client(server)

    ok = declare(client, "")

    assert isinstance(ok, commands.Queue.DeclareOk)
    assert queue_type(server, ok.queue) is None


@pytest.mark.parametrize(
    ("default_queue_type", "arguments"), [("quorum", {}), ("classic", GROUP_SIZE), ("quorum", GROUP_SIZE)]
)
def test_redeclaring_as_the_client_first_declared_is_equivalent(default_queue_type, arguments):
    server = broker(default_queue_type)
    client = opened_client(server, channels=(1, 2))
    declare(client, "q", arguments=dict(arguments))

    again = declare(client, "q", channel=2, arguments=dict(arguments))

    assert isinstance(again, commands.Queue.DeclareOk), again
    assert queue_type(server, "q") == "quorum"


def test_redeclaring_a_quorum_queue_with_its_type_named_is_equivalent():
    client = opened_client(broker("quorum"))
    declare(client, "q")

    assert isinstance(declare(client, "q", arguments={"x-queue-type": "quorum"}), commands.Queue.DeclareOk)


def test_a_classic_queue_made_before_the_default_changed_is_still_equivalent_without_a_type():
    server = broker("quorum")
    client = opened_client(server, channels=(1, 2))
    declare(client, "q", arguments={"x-queue-type": "classic"})

    # The client that omits the type gets the queue as it is, as RabbitMQ 3.13 resolves an omitted type.
    assert isinstance(declare(client, "q", channel=2), commands.Queue.DeclareOk)
    assert queue_type(server, "q") == "classic"


def test_with_the_classic_default_a_quorum_queue_redeclared_without_its_type_is_refused_as_by_rabbitmq_3_10():
    client = opened_client(broker())
    declare(client, "q", arguments={"x-queue-type": "quorum"})

    refused = declare(client, "q")

    assert isinstance(refused, commands.Channel.Close)
    assert refused.reply_code == 406
    assert "inequivalent arg 'x-queue-type'" in refused.reply_text


def test_a_definitions_import_gets_the_default_too():
    server = broker("quorum")
    import_definitions(server, {"queues": [
        {"name": "q", "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}},
    ]})

    assert queue_type(server, "q") == "quorum"


def test_stored_definitions_are_taken_as_they_are():
    # A stored (or cluster) definition is not a client's declaration: a durable queue kept without a
    # type was classic when made, and stays classic when the default is quorum now.
    server = broker("quorum")
    server.vhosts["/"].declare_queue("q", connection=None, durable=True)

    assert queue_type(server, "q") is None


def test_the_http_api_queue_put_gets_the_default_and_the_vhost_shows_it():
    from tests.test_management_client import ManagementClient

    server = broker("quorum")
    api = ManagementClient(server)
    try:
        assert api.request("PUT", "/api/queues/%2F/q", {"durable": True}, user="guest").status == 201
        assert api.request("PUT", "/api/queues/%2F/t", {"durable": False}, user="guest").status == 201
        assert api.get("/api/queues/%2F/q")["type"] == "quorum"
        assert api.get("/api/queues/%2F/t")["type"] == "classic"
        assert api.get("/api/vhosts/%2F")["default_queue_type"] == "quorum"
    finally:
        api.close()
