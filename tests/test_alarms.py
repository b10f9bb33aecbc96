"""Resource alarms block publishing connections (connection.blocked) until they clear.

Driven through the sans-I/O Connection: the alarm is set on `broker.alarms` as the resource
monitor would, and the tests read the frames a client would see and whether the broker still
reads from the socket (`reading_paused`).
"""

from __future__ import annotations

from pamqp import commands

from amqp_server.broker.alarms import DISK, MEMORY, MemoryGauge, ResourceMonitor
from amqp_server.broker.broker import Broker
from amqp_server.config.settings import LimitsConfig, ServerConfig
from tests.frame_driver import CLIENT_CAPABILITIES, FakeClient, bodies, methods, opened_client


def declare(client: FakeClient, queue: str) -> None:
    assert isinstance(client.call(1, commands.Queue.Declare(queue=queue)), commands.Queue.DeclareOk)


def flow_methods(received) -> list[tuple[str, str | None]]:
    """The connection.blocked/unblocked frames among `received`, as (name, reason)."""
    return [
        (method.name, getattr(method, "reason", None))
        for method in methods(received)
        if isinstance(method, (commands.Connection.Blocked, commands.Connection.Unblocked))
    ]


BLOCKED_MEMORY = [("Connection.Blocked", "low on memory")]
UNBLOCKED = [("Connection.Unblocked", None)]


def paused_log(client: FakeClient) -> list[bool]:
    calls: list[bool] = []
    client.connection.on_reading_paused = calls.append
    return calls


def test_publisher_is_blocked_on_its_next_publish_not_when_the_alarm_is_raised():
    broker = Broker()
    client = opened_client(broker)
    declare(client, "q")
    paused = paused_log(client)

    broker.alarms.set(MEMORY, True)
    assert client.take() == []  # nothing is sent until the connection publishes
    assert not client.connection.reading_paused

    received = client.publish(1, b"first", routing_key="q")
    assert flow_methods(received) == BLOCKED_MEMORY
    assert client.connection.reading_paused and paused == [True]
    # As RabbitMQ's reader: blocked at the basic.publish, its content waits for the alarm to clear.
    assert broker.vhosts["/"].queues["q"].message_count == 0
    assert client.connection.input_stopped and client.connection.input_waiting
    broker.alarms.set(MEMORY, False)
    client.connection.resume_input()  # the shell's next turn
    assert broker.vhosts["/"].queues["q"].message_count == 1


def test_clearing_the_alarm_sends_unblocked_and_resumes_reading():
    broker = Broker()
    client = opened_client(broker)
    declare(client, "q")
    paused = paused_log(client)
    broker.alarms.set(MEMORY, True)
    client.publish(1, b"m", routing_key="q")

    broker.alarms.set(MEMORY, False)
    assert flow_methods(client.take()) == UNBLOCKED
    assert not client.connection.reading_paused and paused == [True, False]
    client.connection.resume_input()  # the shell's next turn: the held publish goes through
    # Publishing works again without another block.
    assert client.publish(1, b"n", routing_key="q") == []
    assert broker.vhosts["/"].queues["q"].message_count == 2


def test_consumer_only_connection_is_never_blocked_and_keeps_receiving():
    broker = Broker()
    publisher = opened_client(broker)
    consumer = opened_client(broker)
    declare(consumer, "q")
    consumer.send(1, commands.Basic.Consume(queue="q", consumer_tag="c", no_ack=True))
    broker.alarms.set(DISK, True)

    publisher.publish(1, b"during alarm", routing_key="q")
    assert publisher.connection.reading_paused
    assert bodies(consumer.take()) == []  # held at the publish until the alarm clears
    assert not consumer.connection.reading_paused
    broker.alarms.set(DISK, False)
    publisher.connection.resume_input()
    assert bodies(consumer.take()) == [b"during alarm"]  # and no unblocked: it never got blocked


def test_client_without_the_capability_is_blocked_silently():
    broker = Broker()
    client = FakeClient(broker)
    client.start()
    capabilities = {k: v for k, v in CLIENT_CAPABILITIES.items() if k != "connection.blocked"}
    client.start_ok(capabilities=capabilities)
    client.send(0, commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0))
    client.send(0, commands.Connection.Open(virtual_host="/"))
    client.open_channel(1)
    declare(client, "q")
    broker.alarms.set(MEMORY, True)

    assert client.publish(1, b"m", routing_key="q") == []
    assert client.connection.reading_paused
    broker.alarms.set(MEMORY, False)
    assert client.take() == []
    assert not client.connection.reading_paused


def test_both_alarms_name_both_reasons_and_unblock_only_when_both_clear():
    broker = Broker()
    client = opened_client(broker)
    declare(client, "q")
    broker.alarms.set(MEMORY, True)
    broker.alarms.set(DISK, True)
    received = client.publish(1, b"m", routing_key="q")
    assert flow_methods(received) == [("Connection.Blocked", "low on disk & low on memory")]

    broker.alarms.set(MEMORY, False)
    assert client.take() == [] and client.connection.reading_paused
    broker.alarms.set(DISK, False)
    assert flow_methods(client.take()) == UNBLOCKED


def test_connection_opened_during_an_alarm_blocks_on_its_first_publish():
    broker = Broker()
    broker.alarms.set(MEMORY, True)
    client = opened_client(broker)
    declare(client, "q")
    assert flow_methods(client.publish(1, b"m", routing_key="q")) == BLOCKED_MEMORY


def test_alarm_that_clears_before_a_publish_never_blocks():
    broker = Broker()
    client = opened_client(broker)
    declare(client, "q")
    broker.alarms.set(MEMORY, True)
    broker.alarms.set(MEMORY, False)
    assert client.publish(1, b"m", routing_key="q") == []
    assert not client.connection.reading_paused


def test_capability_is_advertised():
    client = FakeClient()
    start = client.start()[0][1]
    assert start.server_properties["capabilities"]["connection.blocked"] is True


# -- the monitor -------------------------------------------------------------------------


class FakeProcess:
    """RSS and free disk under the test's control; `trim` returns `freeable` bytes to the OS."""

    def __init__(self, rss: int, disk_free: int = 10**12) -> None:
        self.rss = rss
        self.disk_free = disk_free
        self.freeable = 0
        self.trims = 0

    def trim(self) -> None:
        self.trims += 1
        self.rss -= self.freeable
        self.freeable = 0


def monitored_broker(process: FakeProcess, trim: bool = True, **limits) -> tuple[Broker, ResourceMonitor]:
    broker = Broker(ServerConfig(limits=LimitsConfig(**limits)))
    gauge = MemoryGauge(read_rss=lambda: process.rss, trim=process.trim if trim else None)
    return broker, ResourceMonitor(broker, gauge=gauge, read_disk_free=lambda: process.disk_free)


def test_monitor_raises_and_clears_the_memory_alarm_from_resident_memory():
    process = FakeProcess(rss=50_000_000)
    broker, monitor = monitored_broker(process, memory_high_watermark_bytes=100_000_000)
    monitor.check()
    assert not broker.alarms.memory_alarm and broker.alarms.memory_used == 50_000_000
    process.rss = 120_000_000
    monitor.check()
    assert broker.alarms.memory_alarm
    # Queues drained and the heap was trimmed: RSS falls below the limit.
    process.freeable = 70_000_000
    monitor.check()
    assert process.trims >= 1 and not broker.alarms.memory_alarm


def test_memory_alarm_clears_after_a_drain_even_when_rss_stays_high():
    """Without trimming, freed message memory is credited back, and re-used before RSS grows."""
    process = FakeProcess(rss=50_000_000)
    broker, monitor = monitored_broker(process, trim=False, memory_high_watermark_bytes=100_000_000)
    client = opened_client(broker)
    declare(client, "q")
    queue = broker.vhosts["/"].queues["q"]
    for _ in range(60):
        client.publish(1, b"x" * 1_000_000, routing_key="q")
    process.rss = 115_000_000
    monitor.check()
    assert broker.alarms.memory_alarm
    monitor.check()  # still full: still over
    assert broker.alarms.memory_alarm

    queue.purge()  # the consumer side drained everything; CPython kept the heap
    monitor.check()
    assert not broker.alarms.memory_alarm
    assert broker.alarms.resident_memory == 115_000_000 and broker.alarms.memory_used < 100_000_000

    # Refilling re-uses the freed memory; the alarm comes back at the level it was raised at.
    for _ in range(60):
        client.publish(1, b"x" * 1_000_000, routing_key="q")
    monitor.check()
    assert broker.alarms.memory_alarm


def test_relative_watermark_is_a_fraction_of_total_memory():
    process = FakeProcess(rss=1)
    broker, _monitor = monitored_broker(process, memory_high_watermark=0.25)
    broker.alarms.total_memory = 8 * 1024**3  # a known machine: 8 GiB
    assert broker.alarms.memory_limit == 2 * 1024**3
    broker.alarms.set_memory_high_watermark(absolute=1234)
    assert broker.alarms.memory_limit == 1234


def test_monitor_raises_and_clears_the_disk_alarm():
    process = FakeProcess(rss=1, disk_free=40_000_000)
    broker, monitor = monitored_broker(process)  # default limit: 50 MB as RabbitMQ
    monitor.check()
    assert broker.alarms.disk_alarm and broker.alarms.blocked_reason == "low on disk"
    process.disk_free = 60_000_000
    monitor.check()
    assert not broker.alarms.disk_alarm and broker.alarms.blocked_reason is None
