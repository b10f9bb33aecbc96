"""A worker of `--workers N` registers in the cluster before it accepts connections (it joins
first, so clients find the cluster's definitions in place). Its own port, the one the other
nodes' links use, must already take connections then: a link refused in that gap made a queue
of a node shown as running answer 404 "home node ... is down or inaccessible"."""

from __future__ import annotations

import asyncio
import socket

from amqp_server.broker.broker import Broker
from amqp_server.config.settings import ServerConfig
from amqp_server.runtime.server import AMQPServer
from persistence.definitions import FileDefinitionStore


def test_a_workers_own_port_takes_connections_from_bind_and_serves_them_from_start(tmp_path):
    async def scenario() -> bytes:
        broker = Broker(ServerConfig(), FileDefinitionStore(tmp_path))
        server = AMQPServer(broker, "127.0.0.1", 0, shared_ports=True)
        await server.bind()
        loop = asyncio.get_running_loop()
        try:
            link = socket.create_connection(("127.0.0.1", server.node_port), timeout=5)  # not refused
            link.setblocking(False)
            await loop.sock_sendall(link, b"AMQP\x00\x00\x09\x01")
            await server.start()
            # Served once started: the connection.start the link waited for.
            reply = await asyncio.wait_for(loop.sock_recv(link, 7), 5)
            link.close()
            return reply
        finally:
            await server.stop()
            await broker.close()

    reply = asyncio.run(scenario())
    assert reply[:1] == b"\x01" and reply[1:3] == b"\x00\x00"  # a method frame on channel 0
