"""CPU per message of the whole broker, bytes in to bytes out, no sockets: the `python -m bench`
scenarios with the network taken away.

    PYTHONPATH=CHECKOUT python -m bench.broker_microbench [--messages 100000] [--rounds 5] [SCENARIO ...]
    PYTHONPATH=CHECKOUT python -m bench.broker_microbench --profile pubsub-auto   # cProfile's top entries

Each scenario feeds pre-built client frames to `Connection.receive_data` 64 publishes at a
time (as bench/lean_client.py writes them), takes each connection's output as the shell would
(`take_output`, `output_flushed`), and a consumer acks once per output with `multiple`, as the
lean client does. The figure is the process's CPU time per message, best of ROUNDS: what the
broker's Python costs per message, which a machine loaded by other work moves far less than the
end-to-end rates of `python -m bench` (use it to compare two checkouts, alternating runs).

Scenarios: publish-only (one queue, no consumer), pubsub-auto, pubsub-manual (prefetch 100),
pubsub-backlog (manual ack, prefetch 100, behind a backlog of 1,500 ready messages),
confirms (confirm mode, transient messages: the confirm bookkeeping without disk), persistent
(persistent messages to a durable queue with confirms, 256 in flight, fsync "never": the store's
records without the fsync wait; runs an event loop), stream-publish (the same into a stream:
x-queue-type stream), fanout (10 queues, manual-ack consumers
on one connection) and topic (bench/topic_bindings.py's 1,000 bindings over 10 queues).
stream-read and stream-read-10: one consumer, or ten on a connection each, read a stream
(x-queue-type stream, fsync "never") from `first` with prefetch 1000, acking what each output
delivered with `multiple`; the figure is per delivery, the filling left out (a stream of at
least STREAM_FILL records, so that runs of different lengths fill the same and their
difference is reading alone: bench.bytecode_profile, bench.instruction_counts).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pamqp import commands, frame
from pamqp.header import ContentHeader

from amqp_server.broker.broker import Broker
from amqp_server.config.settings import ServerConfig
from amqp_server.connection.connection import Connection
from bench.topic_bindings import make_bindings, make_keys

BATCH = 64
BACKLOG = 1500  # pubsub-backlog's ready messages: between the queue's FLOW_LOW and FLOW_HIGH
BODY = b"x" * 100
_DELIVER = b"\x00\x3c\x00\x3c"  # basic.deliver's class and method ids, as they start its payload
_ACK = b"\x01\x00\x01\x00\x00\x00\x0d\x00\x3c\x00\x50"  # method frame, channel 1, basic.ack
STREAM_FILL = 12_000  # stream-read: records in the stream at least (bench.instruction_counts' larger run)
STREAM_PREFETCH = 1000


def _marshal(channel: int, *methods: object) -> bytes:
    return b"".join(frame.marshal(method, channel) for method in methods)


def _publish(routing_key: str, exchange: str = "", persistent: bool = False) -> bytes:
    properties = commands.Basic.Properties(delivery_mode=2 if persistent else None)
    return _marshal(
        1,
        commands.Basic.Publish(exchange=exchange, routing_key=routing_key),
        ContentHeader(body_size=len(BODY), properties=properties),
    ) + struct.pack(">BHI", 3, 1, len(BODY)) + BODY + b"\xce"


class _Client:
    """One broker connection past connection.open, channel 1 open."""

    def __init__(self, broker: Broker) -> None:
        self.connection = Connection(broker, peer_host="127.0.0.1", peer_port=50000)
        self.connection.receive_data(b"AMQP\x00\x00\x09\x01")
        self.send(
            0,
            commands.Connection.StartOk(
                client_properties={"capabilities": {"publisher_confirms": True}},
                mechanism="PLAIN",
                response="\x00guest\x00guest",
            ),
            commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0),
            commands.Connection.Open(virtual_host="/"),
        )
        self.send(1, commands.Channel.Open())
        self.take()

    def send(self, channel: int, *methods: object) -> None:
        self.connection.receive_data(_marshal(channel, *methods))

    def take(self) -> bytes:
        data = self.connection.take_output()
        if data:
            self.connection.output_flushed()
        return data


class _Consumer(_Client):
    """A consumer that acks what each output delivered with one `multiple` ack, as the lean client does."""

    def __init__(self, broker: Broker, queues: list[str], no_ack: bool, prefetch: int = 100) -> None:
        super().__init__(broker)
        if not no_ack:
            self.send(1, commands.Basic.Qos(prefetch_count=prefetch))
        for index, queue in enumerate(queues):
            self.send(1, commands.Basic.Consume(queue=queue, consumer_tag=f"c{index}", no_ack=no_ack))
        self.no_ack = no_ack
        self.delivered = self.take().count(_DELIVER)  # a queue with messages delivers at once
        self.acked = 0

    def drain(self) -> None:
        while True:
            data = self.take()
            count = data.count(_DELIVER)
            if not count:
                return
            self.delivered += count
            if not self.no_ack:
                self.connection.receive_data(_ACK + struct.pack(">QB", self.delivered, 1) + b"\xce")

    def ack_oldest(self) -> None:
        """Ack the BATCH oldest unacked deliveries with one `multiple` ack, then count what that
        delivered."""
        self.acked = min(self.acked + BATCH, self.delivered)
        self.connection.receive_data(_ACK + struct.pack(">QB", self.acked, 1) + b"\xce")
        self.delivered += self.take().count(_DELIVER)


def _broker(message_dir: Path | None = None) -> Broker:
    config = ServerConfig()
    config.storage.fsync = "never"
    return Broker(config, message_dir=message_dir)


def _flood(publisher: _Client, batches: list[bytes], after_batch: Callable[[], None]) -> None:
    receive = publisher.connection.receive_data
    for data in batches:
        receive(data)
        publisher.take()
        after_batch()


def _batches(frames: list[bytes], messages: int) -> list[bytes]:
    """`messages` publishes, BATCH to a read, cycling through `frames`."""
    out = []
    for start in range(0, messages, BATCH):
        out.append(b"".join(frames[(start + i) % len(frames)] for i in range(min(BATCH, messages - start))))
    return out


def publish_only(messages: int) -> float:
    broker = _broker()
    publisher = _Client(broker)
    publisher.send(1, commands.Queue.Declare(queue="q"))
    publisher.take()
    batches = _batches([_publish("q")], messages)
    return _timed(lambda: _flood(publisher, batches, lambda: None), messages)


def _pubsub(messages: int, no_ack: bool) -> float:
    broker = _broker()
    publisher = _Client(broker)
    publisher.send(1, commands.Queue.Declare(queue="q"))
    publisher.take()
    consumer = _Consumer(broker, ["q"], no_ack)
    batches = _batches([_publish("q")], messages)
    cost = _timed(lambda: _flood(publisher, batches, consumer.drain), messages)
    assert consumer.delivered == messages, (consumer.delivered, messages)
    return cost


def pubsub_auto(messages: int) -> float:
    return _pubsub(messages, no_ack=True)


def pubsub_manual(messages: int) -> float:
    return _pubsub(messages, no_ack=False)


def pubsub_backlog(messages: int) -> float:
    """Manual ack (prefetch 100) behind BACKLOG ready messages, as the bench's manual-ack pub/sub
    runs once its consumer falls behind: each publish joins the ready list, and each round the
    consumer acks its BATCH oldest deliveries, which takes as many out of the ready list."""
    broker = _broker()
    publisher = _Client(broker)
    publisher.send(1, commands.Queue.Declare(queue="q"))
    publisher.take()
    for data in _batches([_publish("q")], BACKLOG):
        publisher.connection.receive_data(data)
        publisher.take()
    consumer = _Consumer(broker, ["q"], no_ack=False)
    batches = _batches([_publish("q")], messages)
    cost = _timed(lambda: _flood(publisher, batches, consumer.ack_oldest), messages)
    # Each ack took as many messages out of the ready list as were published meanwhile.
    ready = broker.vhosts["/"].queues["q"].ready.count
    assert consumer.acked >= messages and ready >= BACKLOG - 100 - BATCH, (consumer.acked, ready)
    return cost


def confirms(messages: int) -> float:
    broker = _broker()
    publisher = _Client(broker)
    publisher.send(1, commands.Queue.Declare(queue="q"), commands.Confirm.Select())
    publisher.take()
    consumer = _Consumer(broker, ["q"], no_ack=False)
    batches = _batches([_publish("q")], messages)
    return _timed(lambda: _flood(publisher, batches, consumer.drain), messages)


def _fanout_like(messages: int, exchange: str, kind: str, bindings: list[tuple[str, str]], keys: list[str]) -> float:
    broker = _broker()
    setup = _Client(broker)
    queues = sorted({queue for queue, _key in bindings})
    setup.send(1, commands.Exchange.Declare(exchange=exchange, exchange_type=kind))
    for queue in queues:
        setup.send(1, commands.Queue.Declare(queue=queue))
    for queue, key in bindings:
        setup.send(1, commands.Queue.Bind(queue=queue, exchange=exchange, routing_key=key))
    setup.take()
    consumer = _Consumer(broker, queues, no_ack=False, prefetch=100)
    publisher = _Client(broker)
    batches = _batches([_publish(key, exchange) for key in keys], messages)
    return _timed(lambda: _flood(publisher, batches, consumer.drain), messages)


def fanout(messages: int) -> float:
    bindings = [(f"f{i}", "") for i in range(10)]
    return _fanout_like(messages // 10, "fan", "fanout", bindings, [""]) / 10  # per delivery


def topic(messages: int) -> float:
    made = make_bindings(1000, 10)
    bindings = [(f"t{queue}", pattern) for queue, pattern in made]
    return _fanout_like(messages, "top", "topic", bindings, make_keys(made))


def persistent(messages: int) -> float:
    return _confirmed(messages, {})


def stream_publish(messages: int) -> float:
    return _confirmed(messages, {"x-queue-type": "stream"})


def _confirmed(messages: int, arguments: dict[str, str]) -> float:
    """Persistent publishes with confirms, 256 in flight, into a durable queue declared with
    `arguments`: CPU per confirmed message."""
    async def run() -> float:
        with tempfile.TemporaryDirectory(prefix="broker-microbench-") as data_dir:
            broker = _broker(Path(data_dir))
            publisher = _Client(broker)
            publisher.send(1, commands.Queue.Declare(queue="q", durable=True, arguments=arguments),
                           commands.Confirm.Select())
            publisher.take()
            frames = _publish("q", persistent=True)
            window = 256
            confirmed = 0
            sent = 0
            started = time.process_time()
            while confirmed < messages:
                if sent - confirmed < window and sent < messages:
                    count = min(BATCH, messages - sent, window - (sent - confirmed))
                    publisher.connection.receive_data(frames * count)
                    sent += count
                data = publisher.take()
                if data:
                    confirmed = _highest_confirm(data, confirmed)
                else:
                    await asyncio.sleep(0)
            cost = (time.process_time() - started) / messages * 1e9
            broker.committer.close()
            return cost

    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(run())
    finally:
        loop.close()


def _stream_read(messages: int, consumers: int) -> float:
    """`consumers` consumers each read `messages` records of a stream from `first`: CPU per delivery."""
    async def run() -> float:
        with tempfile.TemporaryDirectory(prefix="broker-microbench-") as data_dir:
            broker = _broker(Path(data_dir))
            publisher = _Client(broker)
            publisher.send(1, commands.Queue.Declare(queue="s", durable=True, arguments={"x-queue-type": "stream"}),
                           commands.Confirm.Select())
            publisher.take()
            fill = max(messages, STREAM_FILL)
            frames = _publish("s", persistent=True)
            confirmed = sent = 0
            while confirmed < fill:  # 256 in flight, as the persistent scenario
                if sent - confirmed < 256 and sent < fill:
                    count = min(BATCH, fill - sent, 256 - (sent - confirmed))
                    publisher.connection.receive_data(frames * count)
                    sent += count
                data = publisher.take()
                if data:
                    confirmed = _highest_confirm(data, confirmed)
                else:
                    await asyncio.sleep(0)
            readers = [_Client(broker) for _ in range(consumers)]
            started = time.process_time()
            first = {"x-stream-offset": "first"}
            for reader in readers:
                reader.send(1, commands.Basic.Qos(prefetch_count=STREAM_PREFETCH),
                            commands.Basic.Consume(queue="s", consumer_tag="r", arguments=first))
            delivered = [0] * consumers
            while min(delivered) < messages:
                for i, reader in enumerate(readers):
                    count = reader.take().count(_DELIVER)
                    if count and delivered[i] < messages:
                        delivered[i] += count
                        reader.connection.receive_data(_ACK + struct.pack(">QB", delivered[i], 1) + b"\xce")
            cost = (time.process_time() - started) / (messages * consumers) * 1e9
            broker.committer.close()
            return cost

    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(run())
    finally:
        loop.close()


def stream_read(messages: int) -> float:
    return _stream_read(messages, 1)


def stream_read_10(messages: int) -> float:
    return _stream_read(messages, 10)


def _highest_confirm(data: bytes, confirmed: int) -> int:
    """The highest delivery tag basic.ack frames in `data` confirm (tags only grow)."""
    at = data.rfind(b"\x00\x3c\x00\x50")
    if at < 0:
        return confirmed
    return max(confirmed, struct.unpack_from(">Q", data, at + 4)[0])


def _timed(run: Callable[[], None], messages: int) -> float:
    started = time.process_time()
    run()
    return (time.process_time() - started) / messages * 1e9


SCENARIOS: dict[str, Callable[[int], float]] = {
    "publish-only": publish_only,
    "pubsub-auto": pubsub_auto,
    "pubsub-manual": pubsub_manual,
    "pubsub-backlog": pubsub_backlog,
    "confirms": confirms,
    "persistent": persistent,
    "stream-publish": stream_publish,
    "fanout": fanout,
    "topic": topic,
    "stream-read": stream_read,
    "stream-read-10": stream_read_10,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", default=list(SCENARIOS))
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", metavar="SCENARIO", choices=list(SCENARIOS), help="cProfile one round of it")
    parser.add_argument("--top", type=int, default=25, help="entries of the profile to print")
    args = parser.parse_args()
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        SCENARIOS[args.profile](args.messages)
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.top)
        print(out.getvalue())
        return
    for name in args.scenarios:
        costs = [SCENARIOS[name](args.messages) for _ in range(args.rounds)]
        unit = "delivery" if name in ("fanout", "stream-read", "stream-read-10") else "message"
        print(f"{name:<14} {min(costs):>7,.0f} ns CPU per {unit} (best of {args.rounds}; median {sorted(costs)[len(costs) // 2]:,.0f})")


if __name__ == "__main__":
    main()
