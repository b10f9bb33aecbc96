"""Declare-ok, bind-ok, delete-ok and unbind-ok for durable definitions wait for their fsync,
which runs in the group committer's worker thread: the event loop keeps answering everyone
else meanwhile, and replies on the waiting channel stay in order."""

from __future__ import annotations

import asyncio
import base64
import os
import threading
from pathlib import Path

from pamqp import commands

from amqp_server.broker.broker import Broker
from amqp_server.config.settings import ServerConfig
from interop_tests.waiting import wait_until_async
from persistence.definitions import FileDefinitionStore
from persistence.group_commit import GroupCommitter
from tests.frame_driver import methods, opened_client
from tests.test_management_client import ManagementClient


class GatedFsync:
    """An fsync that blocks (in the worker thread) until the test opens the gate, and records
    how many bytes of each file it made durable."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.started = threading.Event()
        self.durable_sizes: dict[tuple[int, int], int] = {}

    def __call__(self, fd: int) -> None:
        stat = os.fstat(fd)
        self.started.set()
        self.gate.wait(10)
        key = (stat.st_dev, stat.st_ino)
        self.durable_sizes[key] = max(self.durable_sizes.get(key, 0), stat.st_size)

    def durable_size(self, path: Path) -> int:
        stat = os.stat(path)
        return self.durable_sizes.get((stat.st_dev, stat.st_ino), 0)


def names(received) -> list[str]:
    return [type(method).__name__ for method in methods(received)]


def current_log(directory: Path) -> Path:
    return max(directory.glob("definitions-*.log"))


def run_with_gated_fsync(tmp_path: Path, scenario) -> None:
    async def main() -> None:
        store = FileDefinitionStore(tmp_path)
        broker = Broker(ServerConfig(), store=store)
        fsync = GatedFsync()
        committer = GroupCommitter("always", sync_file=fsync)
        store.sync_with(committer)
        try:
            await scenario(broker, store, fsync)
        finally:
            fsync.gate.set()
            await committer.idle()
            committer.close()
            store.close()

    asyncio.run(main())


def test_declare_ok_waits_for_the_fsync_and_later_replies_on_the_channel_wait_behind_it(tmp_path):
    async def scenario(broker, store, fsync):
        client = opened_client(broker)
        other = opened_client(broker)
        received = client.send(1, commands.Queue.Declare(queue="kept", durable=True))
        received += client.send(1, commands.Queue.Declare(queue="kept", passive=True))
        received += client.send(1, commands.Basic.Qos(prefetch_count=5))
        assert received == [], "nothing is answered before the declaration is on disk"
        size_to_cover = current_log(tmp_path).stat().st_size
        await wait_until_async(fsync.started.is_set, "the fsync started", 5.0, every=0.001)
        # The fsync is running in the worker thread; the event loop answers everyone else.
        assert names(other.send(1, commands.Basic.Qos(prefetch_count=1))) == ["QosOk"]
        assert names(other.send(1, commands.Queue.Declare(queue="kept", passive=True))) == ["DeclareOk"]
        assert client.take() == []
        signals = client.output_signals
        fsync.gate.set()
        await wait_until_async(lambda: client.output_signals > signals, "the reply went out", 5.0, every=0.001)
        assert fsync.durable_size(current_log(tmp_path)) >= size_to_cover
        assert names(client.take()) == ["DeclareOk", "DeclareOk", "QosOk"], "in the order of the methods"

    run_with_gated_fsync(tmp_path, scenario)


def test_bind_unbind_and_delete_oks_wait_for_the_fsync_too(tmp_path):
    async def scenario(broker, store, fsync):
        fsync.gate.set()
        client = opened_client(broker)
        client.send(1, commands.Exchange.Declare(exchange="ex", exchange_type="direct", durable=True))
        client.send(1, commands.Queue.Declare(queue="q", durable=True))
        await broker.definitions_durable()
        assert names(client.take()) == ["DeclareOk", "DeclareOk"]
        for method, reply in [
            (commands.Queue.Bind(queue="q", exchange="ex", routing_key="k"), "BindOk"),
            (commands.Queue.Unbind(queue="q", exchange="ex", routing_key="k"), "UnbindOk"),
            (commands.Exchange.Delete(exchange="ex"), "DeleteOk"),
            (commands.Queue.Delete(queue="q"), "DeleteOk"),
        ]:
            fsync.gate.clear()
            fsync.started.clear()
            assert client.send(1, method) == [], f"{reply} before the fsync"
            await wait_until_async(fsync.started.is_set, "the fsync started", 5.0, every=0.001)
            assert client.take() == []
            signals = client.output_signals
            fsync.gate.set()
            await wait_until_async(lambda: client.output_signals > signals, "the reply went out", 5.0, every=0.001)
            assert names(client.take()) == [reply]

    run_with_gated_fsync(tmp_path, scenario)


def test_transient_declarations_are_answered_at_once(tmp_path):
    async def scenario(broker, store, fsync):
        client = opened_client(broker)
        assert names(client.send(1, commands.Queue.Declare(queue="t", durable=False))) == ["DeclareOk"]
        assert names(client.send(1, commands.Exchange.Declare(exchange="tx", durable=False))) == ["DeclareOk"]
        assert names(client.send(1, commands.Queue.Delete(queue="t"))) == ["DeleteOk"]

    run_with_gated_fsync(tmp_path, scenario)


def test_a_failed_fsync_closes_the_connection_instead_of_answering(tmp_path):
    async def main() -> None:
        store = FileDefinitionStore(tmp_path)
        broker = Broker(ServerConfig(), store=store)

        def failing_fsync(fd: int) -> None:
            raise OSError(5, "Input/output error")

        committer = GroupCommitter("always", sync_file=failing_fsync)
        store.sync_with(committer)
        client = opened_client(broker)
        client.send(1, commands.Queue.Declare(queue="kept", durable=True))
        await committer.idle()
        received = methods(client.take())
        assert [type(m).__name__ for m in received] == ["Close"]
        assert received[0].reply_code == 541
        assert "could not write definitions to disk" in received[0].reply_text
        committer.close()

    asyncio.run(main())


def test_the_management_api_answers_a_durable_change_only_after_its_fsync(tmp_path):
    store = FileDefinitionStore(tmp_path)
    broker = Broker(ServerConfig(), store=store)
    api = ManagementClient(broker)
    fsync = GatedFsync()
    committer = GroupCommitter("always", sync_file=fsync)
    store.sync_with(committer)

    async def scenario() -> None:
        headers = {"Content-Type": "application/json",
                   "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}
        put = asyncio.ensure_future(api.client.request("PUT", "/api/queues/%2F/kept", data='{"durable": true}',
                                                       headers=headers))
        await wait_until_async(fsync.started.is_set, "the fsync started", 5.0, every=0.001)
        await asyncio.sleep(0.05)
        assert not put.done(), "answered before the fsync"
        assert "kept" in broker.vhosts["/"].queues, "the queue exists; only the answer waits"
        fsync.gate.set()
        response = await put
        assert response.status == 201
        response.release()
        await committer.idle()

    try:
        api.loop.run_until_complete(scenario())
    finally:
        fsync.gate.set()
        committer.close()
        api.close()
        store.close()
