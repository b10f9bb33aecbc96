"""A persistent message's publisher confirm leaves only after its queue's journal is fsynced, and
the publishes of one read wait together: one sync request per queue for the whole read
(amqp_server/channel/channel.py, StoreWait), made while the read is handled."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from pamqp import commands

from amqp_server.broker.broker import Broker
from tests.frame_driver import methods, opened_client, publish_frames

PERSISTENT = commands.Basic.Properties(delivery_mode=2)


def test_the_confirms_of_one_read_wait_for_one_fsync_of_their_queue(tmp_path: Path, monkeypatch) -> None:
    async def scenario() -> None:
        broker = Broker(message_dir=tmp_path)
        syncing = threading.Event()  # the committer's thread is inside an fsync
        disk_done = threading.Event()  # the test lets that fsync finish

        def slow_fsync(fd: int) -> None:
            syncing.set()
            assert disk_done.wait(10), "the test never let the fsync finish"

        monkeypatch.setattr(broker.committer, "_sync_file", slow_fsync)
        client = opened_client(broker)
        client.call(1, commands.Queue.Declare(queue="q", durable=True))
        client.call(1, commands.Confirm.Select())
        store = broker.vhosts["/"].queues["q"].journal.store
        requests = []
        request_sync = broker.committer.request_sync
        monkeypatch.setattr(
            broker.committer, "request_sync", lambda s, callback: (requests.append(s), request_sync(s, callback))
        )

        one_read = b"".join(publish_frames(1, b"m%d" % n, routing_key="q", properties=PERSISTENT) for n in range(3))
        client.connection.receive_data(one_read)
        assert requests == [store]  # asked once for the three, as the read was handled (not at the write)
        await asyncio.get_running_loop().run_in_executor(None, syncing.wait, 10)
        received = client.take()
        assert not [m for m in methods(received) if isinstance(m, commands.Basic.Ack)], "confirmed before fsync"

        disk_done.set()
        await broker.committer.idle()
        acks = [m for m in methods(client.take()) if isinstance(m, commands.Basic.Ack)]
        assert [(ack.delivery_tag, ack.multiple) for ack in acks] == [(3, True)]
        broker.committer.close()

    asyncio.run(scenario())


def test_a_duplicates_confirm_waits_for_the_fsync_of_the_first_copy(tmp_path: Path, monkeypatch) -> None:
    """x-message-deduplication: a republish of a message whose first copy is not on disk yet is
    confirmed only once it is (else a crash right then loses a message confirmed twice)."""
    async def scenario() -> None:
        broker = Broker(message_dir=tmp_path)
        syncing, disk_done = threading.Event(), threading.Event()

        def slow_fsync(fd: int) -> None:
            syncing.set()
            assert disk_done.wait(10), "the test never let the fsync finish"

        monkeypatch.setattr(broker.committer, "_sync_file", slow_fsync)
        client = opened_client(broker, channels=(1, 2))
        client.call(1, commands.Queue.Declare(queue="dd", durable=True, arguments={"x-message-deduplication": True}))
        client.call(1, commands.Confirm.Select())
        client.call(2, commands.Confirm.Select())
        same = commands.Basic.Properties(delivery_mode=2, headers={"x-deduplication-header": "X"})
        client.connection.receive_data(publish_frames(1, b"x", routing_key="dd", properties=same))
        await asyncio.get_running_loop().run_in_executor(None, syncing.wait, 10)
        client.connection.receive_data(publish_frames(2, b"x", routing_key="dd", properties=same))
        await asyncio.sleep(0)
        confirms_before = [m for _, m in client.take() if isinstance(m, (commands.Basic.Ack, commands.Basic.Nack))]
        disk_done.set()
        await broker.committer.idle()
        confirms_after = [(channel, type(m).__name__) for channel, m in client.take()
                          if isinstance(m, (commands.Basic.Ack, commands.Basic.Nack))]
        broker.committer.close()
        assert confirms_before == [], "a confirm left before the first copy's fsync"
        assert sorted(confirms_after) == [(1, "Ack"), (2, "Ack")]
        assert broker.vhosts["/"].queues["dd"].message_count == 1

    asyncio.run(scenario())
