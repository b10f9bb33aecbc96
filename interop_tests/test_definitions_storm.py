"""A client that pipelines thousands of durable declarations no longer holds up everyone else,
and every declaration (or deletion) it was told about survives a crash.

Before, each durable declare, delete, bind or unbind rewrote and fsynced all definitions on
the event loop: a storm of 2,000 declarations stalled another client for 34 s. Now each change
is one log record, fsynced in a worker thread, and the replies wait for that fsync.
"""

from __future__ import annotations

import base64
import json
import threading
import urllib.request

import pytest
from pamqp import commands, frame

from interop_tests.broker_process import BrokerProcess, free_port
from interop_tests.raw_client import RawClient

pytestmark = pytest.mark.timeout(120)

STORM = 10_000
PROBE_ROUND_TRIPS = 20
# Long enough for any loaded machine; a broker that rewrites all definitions per declare
# (10,000 of them) takes many minutes and fails here instead of hanging the suite.
READ_TIMEOUT_S = 60.0


def connected(broker: BrokerProcess) -> RawClient:
    client = RawClient(broker.host, broker.port, timeout=READ_TIMEOUT_S)
    client.handshake()
    client.open_channel(1)
    return client


def pipeline(client: RawClient, methods: list) -> threading.Thread:
    """Send every method on channel 1 without waiting for replies (from a thread, so the
    caller reads replies meanwhile and neither side's socket buffer fills up)."""
    data = b"".join(frame.marshal(method, 1) for method in methods)
    sender = threading.Thread(target=client.send_bytes, args=(data,), daemon=True)
    sender.start()
    return sender


def queue_names(port: int) -> set[str]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/queues/%2F?columns=name",
        headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return {queue["name"] for queue in json.load(response)}


def test_other_clients_are_answered_while_a_storm_of_declarations_is_processed(broker_factory):
    broker = broker_factory()
    storm, probe = connected(broker), connected(broker)
    events: list[str] = []
    lock = threading.Lock()

    def record(event: str) -> None:
        with lock:
            events.append(event)

    sender = pipeline(storm, [commands.Queue.Declare(queue=f"storm-{i}", durable=True) for i in range(STORM)])
    storm_started = threading.Event()

    def read_storm() -> None:
        storm.expect(commands.Queue.DeclareOk)
        storm_started.set()  # the broker is in the middle of the storm
        for _ in range(STORM - 1):
            storm.expect(commands.Queue.DeclareOk)
        record("storm answered")

    reader = threading.Thread(target=read_storm, daemon=True)
    reader.start()
    assert storm_started.wait(READ_TIMEOUT_S)
    for _ in range(PROBE_ROUND_TRIPS):
        probe.send(commands.Basic.Qos(prefetch_count=0), 1)
        probe.expect(commands.Basic.QosOk)
    record("probe answered")
    reader.join(READ_TIMEOUT_S)
    sender.join(READ_TIMEOUT_S)
    assert events == ["probe answered", "storm answered"], (
        "the other client's round trips must not wait for the storm to be processed"
    )


def test_every_acknowledged_declaration_and_deletion_survives_sigkill(broker_factory):
    port = free_port()
    broker = broker_factory(extra_args=("--management-port", str(port)))
    count = 3000
    names = [f"kept-{i}" for i in range(count)]

    client = connected(broker)
    pipeline(client, [commands.Queue.Declare(queue=name, durable=True) for name in names])
    acknowledged = []
    for name in names[: count // 3]:
        _, reply = client.expect(commands.Queue.DeclareOk)
        assert reply.queue == name
        acknowledged.append(name)
    broker.kill()  # SIGKILL while the rest of the storm is still being processed
    client.close()
    broker.start()
    present = queue_names(port)
    missing = [name for name in acknowledged if name not in present]
    assert not missing, f"{len(missing)} acknowledged declarations lost, e.g. {missing[:3]}"

    survivors = [name for name in names if name in present]
    client = connected(broker)
    pipeline(client, [commands.Queue.Delete(queue=name) for name in survivors])
    deleted = []
    for name in survivors[: len(survivors) // 3]:
        client.expect(commands.Queue.DeleteOk)
        deleted.append(name)
    broker.kill()
    client.close()
    broker.start()
    back = set(deleted) & queue_names(port)
    assert not back, f"{len(back)} acknowledged deletions undone, e.g. {sorted(back)[:3]}"
