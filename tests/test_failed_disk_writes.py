"""A disk write that fails has one outcome per kind of operation, decided at the queue's journal
(queues/journal.py), whichever connection or timer made the write:

- a published message is nacked to its publisher (in a transaction, tx.commit fails with
  RabbitMQ's 406 "partial tx completion"), and nothing is enqueued;
- a later state record (delivered, acked...) is logged and the queue is marked failed: the
  management API shows it "crashed", and it keeps serving from memory;
- no connection is ever closed with 541 for it, least of all one that did nothing wrong.

The store's writes are made to fail the way a full disk fails them (OSError ENOSPC).
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands

from amqp_server.broker.broker import Broker
from amqp_server.connection.connection import OPEN
from tests.frame_driver import FakeClient, bodies, methods, opened_client
from tests.test_management_client import ManagementClient

PERSISTENT = commands.Basic.Properties(delivery_mode=2)


def no_space(*_args: Any, **_kwargs: Any) -> Any:
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.fixture
def broker(tmp_path: Path) -> Broker:
    return Broker(message_dir=tmp_path)


@pytest.fixture
def api(broker: Broker):
    client = ManagementClient(broker)
    yield client
    client.close()


def run(api: ManagementClient, scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run `scenario` on the loop the management client serves on (the journal's group
    committer needs a running loop), then write out and close the broker."""
    api.loop.run_until_complete(scenario())


def declared(client: FakeClient, broker: Broker, name: str = "q"):
    client.call(1, commands.Queue.Declare(queue=name, durable=True))
    return broker.vhosts["/"].queues[name]


def said(received: list) -> list[tuple[str, dict]]:
    """The method frames in `received` as (name, fields), comparable with `==`."""
    return [(method.name, dict(method)) for method in methods(received)]


def expected(*frames: Any) -> list[tuple[str, dict]]:
    return [(method.name, dict(method)) for method in frames]


PARTIAL_TX = commands.Channel.Close(
    reply_code=406, reply_text="PRECONDITION_FAILED - partial tx completion", class_id=90, method_id=20
)


def api_state(api: ManagementClient, name: str = "q") -> str:
    return api.get(f"/api/queues/%2F/{name}")["state"]


def test_a_publish_whose_write_fails_is_nacked_and_not_enqueued(broker: Broker, api: ManagementClient, monkeypatch) -> None:
    async def scenario() -> None:
        client = opened_client(broker)
        queue = declared(client, broker)
        client.call(1, commands.Confirm.Select())
        with monkeypatch.context() as patch:
            patch.setattr(queue.journal.store, "append_message", no_space)
            received = client.publish(1, b"lost", routing_key="q", properties=PERSISTENT)
        await broker.committer.idle()
        received += client.take()
        assert said(received) == expected(commands.Basic.Nack(delivery_tag=1, multiple=False, requeue=True))
        assert queue.message_count == 0
        # The disk has room again: the next publish is stored and confirmed on the same channel.
        client.publish(1, b"kept", routing_key="q", properties=PERSISTENT)
        await broker.committer.idle()
        assert said(client.take()) == expected(commands.Basic.Ack(delivery_tag=2, multiple=False))
        assert queue.message_count == 1
        assert client.connection.state == OPEN

    run(api, scenario)
    assert api_state(api) == "running"  # a refused publish is the publisher's business only


async def commit_failing_at(broker: Broker, monkeypatch, store_method: str) -> Any:
    """Publish a persistent message in a transaction and commit it while the queue's store fails
    `store_method` as a full disk fails it: the commit fails with RabbitMQ's 406, and only the
    channel is closed (the connection and its other channels go on). Returns the queue."""
    client = opened_client(broker, channels=(1, 2))
    queue = declared(client, broker)
    client.call(1, commands.Tx.Select())
    client.publish(1, b"lost", routing_key="q", properties=PERSISTENT)
    with monkeypatch.context() as patch:
        patch.setattr(queue.journal.store, store_method, no_space)
        received = client.send(1, commands.Tx.Commit())
        await broker.committer.idle()
    received += client.take()
    assert said(received) == expected(PARTIAL_TX)
    assert client.connection.state == OPEN
    assert isinstance(client.call(2, commands.Queue.Declare(queue="q", passive=True)), commands.Queue.DeclareOk)
    return queue


def test_a_transaction_whose_write_fails_fails_its_commit_with_rabbitmqs_error(
    broker: Broker, api: ManagementClient, monkeypatch
) -> None:
    async def scenario() -> None:
        queue = await commit_failing_at(broker, monkeypatch, "append_message")
        assert queue.message_count == 0

    run(api, scenario)


def test_a_transaction_whose_fsync_fails_fails_its_commit_with_rabbitmqs_error(
    broker: Broker, api: ManagementClient, monkeypatch
) -> None:
    async def scenario() -> None:
        await commit_failing_at(broker, monkeypatch, "prepare_sync")

    run(api, scenario)


def test_failed_state_records_mark_the_queue_crashed_and_close_no_connection(
    broker: Broker, api: ManagementClient, monkeypatch, caplog
) -> None:
    async def scenario() -> None:
        publisher = opened_client(broker)
        queue = declared(publisher, broker)
        publisher.call(1, commands.Confirm.Select())
        consumer = opened_client(broker)
        consumer.call(1, commands.Basic.Qos(prefetch_count=10))
        consumer.call(1, commands.Basic.Consume(queue="q", consumer_tag="c"))
        monkeypatch.setattr(queue.journal.store, "append_state", no_space)
        # The message is written; recording its delivery (made by the publisher's publish,
        # to the consumer's connection) fails, and so does recording the consumer's ack.
        publisher.publish(1, b"hello", routing_key="q", properties=PERSISTENT)
        await broker.committer.idle()
        assert bodies(consumer.take()) == [b"hello"]
        consumer.send(1, commands.Basic.Ack(delivery_tag=1))
        assert said(publisher.take()) == expected(commands.Basic.Ack(delivery_tag=1, multiple=False))
        assert publisher.connection.state == OPEN and consumer.connection.state == OPEN
        assert queue.unacked_count == 0
        assert queue.failure is not None and queue.failure.errno == errno.ENOSPC
        # The queue keeps serving from memory; a rejection (its record fails too) drops the message.
        publisher.publish(1, b"again", routing_key="q", properties=PERSISTENT)
        await broker.committer.idle()
        assert bodies(consumer.take()) == [b"again"]
        consumer.send(1, commands.Basic.Reject(delivery_tag=2, requeue=False))
        assert consumer.connection.state == OPEN
        assert (queue.message_count, queue.unacked_count) == (0, 0)

    run(api, scenario)
    assert api_state(api) == "crashed"
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
        "'q': could not record message 1 as delivered: [Errno 28] No space left on device; the queue is marked crashed"
    ]


def _confirming_client_with_durable_delayed_exchange(broker: Broker):
    """A client in confirm mode, the durable delayed exchange "later" it declared, its pending store,
    and the properties of a persistent message delayed for a minute."""
    client = opened_client(broker)
    client.call(1, commands.Exchange.Declare(exchange="later", exchange_type="x-delayed-message", durable=True,
                                             arguments={"x-delayed-type": "direct"}))
    client.call(1, commands.Confirm.Select())
    pending = broker.vhosts["/"].exchanges["later"].pending
    delayed = commands.Basic.Properties(delivery_mode=2, headers={"x-delay": 60_000})
    return client, pending, delayed


def test_a_delayed_message_that_is_written_is_acked(broker: Broker, api: ManagementClient) -> None:
    # The write that succeeds, beside the one below that fails: a persistent message held by a
    # durable delayed exchange is confirmed once its journal is fsynced (no 541 since 7170f99).
    async def scenario() -> None:
        client, pending, delayed = _confirming_client_with_durable_delayed_exchange(broker)
        received = client.publish(1, b"kept", exchange="later", routing_key="q", properties=delayed)
        await broker.committer.idle()
        received += client.take()
        assert said(received) == expected(commands.Basic.Ack(delivery_tag=1, multiple=False))
        assert len(pending) == 1
        assert client.connection.state == OPEN

    run(api, scenario)


def test_a_delayed_message_whose_write_fails_is_nacked(broker: Broker, api: ManagementClient, monkeypatch) -> None:
    async def scenario() -> None:
        client, pending, delayed = _confirming_client_with_durable_delayed_exchange(broker)
        with monkeypatch.context() as patch:
            patch.setattr(pending.journal.store, "append_message", no_space)
            received = client.publish(1, b"lost", exchange="later", routing_key="q", properties=delayed)
        await broker.committer.idle()
        received += client.take()
        assert said(received) == expected(commands.Basic.Nack(delivery_tag=1, multiple=False, requeue=True))
        assert len(pending) == 0
        assert client.connection.state == OPEN

    run(api, scenario)
