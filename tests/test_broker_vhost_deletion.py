"""Deleting a vhost removes everything it kept on disk, delayed exchanges' stores included."""

from __future__ import annotations

import asyncio

from amqp_server.broker.broker import Broker
from amqp_server.config.settings import ServerConfig


def test_deleting_a_vhost_removes_its_queue_and_delayed_exchange_files(tmp_path):
    async def main() -> None:
        broker = Broker(ServerConfig(), message_dir=tmp_path)
        vhost = broker.add_vhost("temporary")
        vhost.declare_queue("orders", connection=None, durable=True)
        vhost.declare_exchange("later", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
        queue_dirs = tmp_path / "queues"
        assert [d for d in queue_dirs.rglob("queue.json")] == [], "a queue's directory comes with its first record"
        for journal in vhost.journals():
            journal.store.append_message(1, 0, "", "rk", b"\x00\x00", b"x")
        assert len([d for d in queue_dirs.rglob("queue.json")]) == 2  # the queue and the exchange's store

        broker.delete_vhost("temporary")

        assert [d for d in queue_dirs.rglob("queue.json")] == []
        assert "temporary" not in broker.vhosts
        await broker.close()

    asyncio.run(main())
