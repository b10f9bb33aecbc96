"""CPU per message of the connection's part of the hot path: frames in -> channel -> queue -> frames out.

Run: PYTHONPATH=CHECKOUT python -m bench.connection_microbench   (about 20 s)

One sans-I/O Connection in this process, no sockets: a read holding PER_READ publishes (method,
header and body frames of 100-byte transient messages) is fed to `receive_data`, and what the
connection writes is taken with `take_output`, as the shell does once per event-loop turn.
Measured in process CPU time, best of ROUNDS, so a machine loaded by other work moves it far
less than the end-to-end benchmarks: use it to compare two checkouts of amqp_server/ (run each
a few times, alternating). Three cases: publish into a queue nobody consumes, the same in
confirm mode, and publish to a queue whose consumer on the same connection has auto-ack.
"""

from __future__ import annotations

import time

from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from amqp_server.broker.broker import Broker
from amqp_server.connection.connection import Connection

MESSAGES = 100_000
PER_READ = 100
ROUNDS = 3
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"


def _marshal(channel: int, *values: object) -> bytes:
    return b"".join(frame.marshal(value, channel) for value in values)


def _opened(queue: str) -> Connection:
    connection = Connection(Broker(), "127.0.0.1", 50000)
    response = "\x00guest\x00guest"
    for data in (
        PROTOCOL_HEADER,
        _marshal(0, commands.Connection.StartOk(client_properties={}, mechanism="PLAIN", response=response)),
        _marshal(0, commands.Connection.TuneOk(channel_max=16, frame_max=131072, heartbeat=0)),
        _marshal(0, commands.Connection.Open(virtual_host="/")),
        _marshal(1, commands.Channel.Open()),
        _marshal(1, commands.Queue.Declare(queue=queue)),
    ):
        connection.receive_data(data)
    connection.take_output()
    return connection


def _publishes(queue: str) -> bytes:
    one = _marshal(
        1,
        commands.Basic.Publish(exchange="", routing_key=queue),
        ContentHeader(body_size=100, properties=commands.Basic.Properties()),
        ContentBody(b"x" * 100),
    )
    return one * PER_READ


def _run(connection: Connection, data: bytes) -> float:
    """Nanoseconds of CPU per message for MESSAGES publishes fed in reads of PER_READ."""
    started = time.process_time()
    for _ in range(MESSAGES // PER_READ):
        connection.receive_data(data)
        connection.take_output()
        connection.output_flushed()
    return (time.process_time() - started) * 1e9 / MESSAGES


def publish_only() -> float:
    connection = _opened("q")
    return _run(connection, _publishes("q"))


def confirms() -> float:
    connection = _opened("q")
    connection.receive_data(_marshal(1, commands.Confirm.Select()))
    connection.take_output()
    return _run(connection, _publishes("q"))


def pubsub_auto_ack() -> float:
    connection = _opened("q")
    connection.receive_data(_marshal(1, commands.Basic.Consume(queue="q", consumer_tag="c", no_ack=True)))
    connection.take_output()
    return _run(connection, _publishes("q"))


def main() -> None:
    for name, case in (("publish-only", publish_only), ("confirms", confirms), ("pubsub auto-ack", pubsub_auto_ack)):
        best = min(case() for _ in range(ROUNDS))
        print(f"{name:16} {best:8.0f} ns/message (best of {ROUNDS}, {MESSAGES} messages)")


if __name__ == "__main__":
    main()
