"""Nothing lost with on-confirm (issue 25, point 4): a shovel on its own broker process moves
30,000 persistent messages from a source broker to a destination broker, each reached through a
TCP forwarder (interop_tests/tcp_cut.py), and mid-transfer one of them is killed with SIGKILL and
started again, or the network to one end is cut and restored. Every message published to the
source must be in the destination at the end (duplicates are allowed, and counted), and the
source queue empty.

The control: the same run against interop_tests/broken_shovel_broker.py (a shovel that acks its
source once it has published, before the destination confirmed) with the destination killed must
lose messages, or this test could not tell a shovel that loses them from one that does not.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pika
import pytest
import requests

from interop_tests.broker_process import BrokerProcess, free_port, launch
from interop_tests.shovel_helpers import depth, drain_numbered, publish_numbered
from interop_tests.tcp_cut import TcpCut
from interop_tests.waiting import poll

pytestmark = pytest.mark.skipif(bool(os.environ.get("INTEROP_BROKER_URL")), reason="starts its own brokers")

MESSAGES = 30_000
KILL_AT = 6_000  # in the destination when the fault comes
CUT_S = 1.0  # how long the network stays cut (the shovel retries meanwhile, every reconnect-delay)
AUTH = ("guest", "guest")


@dataclass
class Run:
    source: BrokerProcess
    destination: BrokerProcess
    shovel_node: BrokerProcess
    api: str
    to_source: TcpCut
    to_destination: TcpCut

    def stop(self) -> None:
        for proxy in (self.to_source, self.to_destination):
            proxy.close()
        for broker in (self.shovel_node, self.source, self.destination):
            broker.stop()


class _DepthProbe:
    """A queue's depth read again and again on one connection (a connection per reading takes
    longer than a fast shovel needs to move thousands of messages)."""

    def __init__(self, broker: BrokerProcess, queue: str) -> None:
        self._connection = pika.BlockingConnection(pika.URLParameters(broker.url()))
        self._channel = self._connection.channel()
        self._queue = queue

    def __enter__(self) -> "_DepthProbe":
        return self

    def __call__(self) -> int:
        return self._channel.queue_declare(self._queue, durable=True).method.message_count

    def __exit__(self, *exc: object) -> None:
        self._connection.close()


def _until_steady(read, within: float) -> bool:
    """Until two readings a second apart are the same."""
    last: list[object] = [object()]

    def steady() -> bool:
        now = read()
        before, last[0] = last[0], now
        return before == now

    return poll(steady, within, every=1.0)


def _start(tmp_path: Path, shovel_module: str) -> Run:
    source = launch(tmp_path / "source")
    destination = launch(tmp_path / "destination")
    to_source, to_destination = TcpCut("127.0.0.1", source.port), TcpCut("127.0.0.1", destination.port)
    port = free_port()
    shovel_node = launch(tmp_path / "shovel", extra_args=("--management-port", str(port)), module=shovel_module)
    return Run(source, destination, shovel_node, f"http://127.0.0.1:{port}", to_source, to_destination)


def _shovel_value(run: Run) -> dict:
    return {"src-uri": f"amqp://guest:guest@{run.to_source.address}", "src-queue": "work",
            "dest-uri": f"amqp://guest:guest@{run.to_destination.address}", "dest-queue": "work",
            "ack-mode": "on-confirm", "reconnect-delay": 0.2, "src-prefetch-count": 500}


def _fault_run(tmp_path: Path, fault: str, shovel_module: str = "amqp_server") -> tuple[int, int, int]:
    """(lost, duplicates, reconnects) of one run with `fault`."""
    run = _start(tmp_path, shovel_module)
    try:
        publish_numbered(run.source.url(), "work", MESSAGES)
        reply = requests.put(f"{run.api}/api/parameters/shovel/%2F/faults", json={"value": _shovel_value(run)},
                             auth=AUTH, timeout=10)
        assert reply.status_code == 201, reply.text
        with _DepthProbe(run.destination, "work") as destination_depth, _DepthProbe(run.source, "work") as source_depth:
            assert poll(lambda: destination_depth() >= KILL_AT, 60, every=0.005), "the shovel does not move"
            at_fault = source_depth()
        assert at_fault > 0, "the fault came after the shovel had moved everything"
        if fault == "kill source":
            run.source.kill()
            run.source.start()
        elif fault == "kill destination":
            run.destination.kill()
            run.destination.start()
        elif fault == "kill shovel node":
            run.shovel_node.kill()
            run.shovel_node.start()
        elif fault == "cut source":
            run.to_source.cut()
            time.sleep(CUT_S)  # the fault's length, not a wait for anything
            run.to_source.restore()
        elif fault == "cut destination":
            run.to_destination.cut()
            time.sleep(CUT_S)
            run.to_destination.restore()
        # Done once the source is empty and the destination holds everything (a build that
        # loses messages never gets there: then until the source is empty and the destination
        # stops growing).
        finished = poll(lambda: depth(run.source, "work") == 0 and depth(run.destination, "work") >= MESSAGES,
                        90 if shovel_module == "amqp_server" else 20, every=0.2)
        shovels = requests.get(f"{run.api}/api/shovels", auth=AUTH, timeout=10).json()
        reconnects = shovels[0]["reconnects"] if shovels else -1
        if not finished and shovel_module == "amqp_server":
            raise AssertionError(f"not finished after the fault: source {depth(run.source, 'work')}, "
                                 f"destination {depth(run.destination, 'work')}, shovel {shovels}")
        if not finished:
            poll(lambda: depth(run.source, "work") == 0, 30, every=0.2)
            _until_steady(lambda: depth(run.destination, "work"), 30)
        got = Counter(drain_numbered(run.destination, "work"))
        lost = sum(1 for n in range(MESSAGES) if n not in got)
        duplicates = sum(count - 1 for count in got.values())
        print(f"{fault} ({shovel_module}): {at_fault} left in the source at the fault; lost {lost}, "
              f"duplicates {duplicates}, reconnects {reconnects}")
        return lost, duplicates, reconnects
    finally:
        run.stop()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fault", ["kill source", "kill destination", "kill shovel node", "cut source",
                                   "cut destination"])
def test_nothing_is_lost_on_confirm(tmp_path, fault):
    lost, _duplicates, reconnects = _fault_run(tmp_path, fault)
    assert lost == 0
    if fault != "kill shovel node":  # (a restarted node's shovel starts counting afresh)
        assert reconnects >= 1, "the shovel reported no reconnect"


@pytest.mark.timeout(300)
def test_the_fault_test_catches_a_shovel_that_acks_its_source_before_the_confirm(tmp_path):
    lost, _duplicates, _reconnects = _fault_run(tmp_path, "kill destination", "interop_tests.broken_shovel_broker")
    assert lost > 0
