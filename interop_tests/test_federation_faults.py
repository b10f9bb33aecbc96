"""Nothing lost through a federation link with ack-mode on-confirm: kill -9 of the downstream,
kill -9 of the upstream, and a cut network between them, while messages flow. Duplicates are
allowed and counted (a message whose ack upstream was lost comes again).

The upstream's publisher publishes numbered persistent messages with confirms (federation_faults.py);
every message it saw confirmed must reach the downstream's durable queue. The same scenario run
against a broken build (interop_tests/broken_federation_broker.py: it acknowledges upstream on
receipt and stores 0.3 s later) must lose messages: the test notices a build that acks before it
stores.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from interop_tests.federation_faults import Publisher, Tally, drain
from interop_tests.federation_helpers import Site, declare, launch_site
from interop_tests.tcp_cut import TcpCut
from interop_tests.waiting import wait_until

TOTAL = 1500


def _federated_pair(tmp_path: Path, module: str = "amqp_server", via_cut: bool = False
                    ) -> tuple[Site, Site, TcpCut | None]:
    up = launch_site(tmp_path / "up")
    down = launch_site(tmp_path / "down", module=module)
    cut = None
    uri = up.amqp_url
    if via_cut:
        cut = TcpCut("127.0.0.1", up.broker.port)
        uri = f"amqp://guest:guest@{cut.address}/%2F?heartbeat=2"
    declare(up, exchange="orders")
    declare(down, exchange="orders", queue="orders-here", binding="#")
    down.set_upstream("up", {"uri": uri, "reconnect-delay": 0.5, "prefetch-count": 50})
    down.set_policy("fed", "^orders$", {"federation-upstream": "up"}, apply_to="exchanges")
    down.wait_running("exchange", "orders")
    return up, down, cut


def _restart(site: Site) -> None:
    site.broker.kill()
    time.sleep(0.3)
    site.broker.start()


def _scenario(up: Site, down: Site, cut: TcpCut | None, faults: list[str]) -> Tally:
    tally = Tally()
    publisher = Publisher(up, "orders", "k", TOTAL, tally)
    publisher.start()
    try:
        for fault in faults:
            wait_until(lambda: len(tally.confirmed) >= 200 * (faults.index(fault) + 1), "publishing under way", 60)
            if fault == "kill downstream":
                _restart(down)
            elif fault == "kill upstream":
                _restart(up)
            elif fault == "cut":
                assert cut is not None
                cut.cut()
                time.sleep(3)  # past two heartbeats: both ends notice
                cut.restore()
            down.wait_running("exchange", "orders", within=60)
        publisher.join(timeout=180)
        assert not publisher.is_alive(), f"the publisher is stuck at {len(tally.confirmed)} confirmed"
    finally:
        publisher.stop()
    drain(down, "orders-here", tally, expect_at_least=TOTAL, within=60)
    return tally


def test_nothing_is_lost_when_either_broker_is_killed_or_the_network_cut(tmp_path):
    up, down, cut = _federated_pair(tmp_path, via_cut=True)
    try:
        tally = _scenario(up, down, cut, ["kill downstream", "kill upstream", "cut"])
        link = down.link("exchange", "orders")
        print(f"confirmed {len(tally.confirmed)}, arrived {len(tally.arrived)}, duplicates {tally.duplicates}, "
              f"reconnects {link and link['reconnects']}")
        assert tally.lost == [], f"{len(tally.lost)} confirmed messages never arrived: {tally.lost[:20]}"
        assert len(tally.confirmed) == TOTAL
        assert link is not None and link["reconnects"] >= 3, "three faults, three reconnects counted"
    finally:
        if cut is not None:
            cut.close()
        down.broker.kill()
        up.broker.kill()


def test_a_build_that_acks_before_it_stores_is_caught(tmp_path):
    up, down, cut = _federated_pair(tmp_path, module="interop_tests.broken_federation_broker")
    try:
        tally = _scenario(up, down, cut, ["kill downstream", "kill downstream"])
        print(f"broken build: confirmed {len(tally.confirmed)}, lost {len(tally.lost)}")
        assert tally.lost, "the broken build lost nothing: the test would not notice a loss"
    finally:
        down.broker.kill()
        up.broker.kill()


def test_nothing_is_lost_from_a_federated_queue_when_the_downstream_is_killed(tmp_path):
    up = launch_site(tmp_path / "up")
    down = launch_site(tmp_path / "down")
    try:
        declare(up, queue="jobs")
        declare(down, queue="jobs")
        down.set_upstream("up", {"uri": up.amqp_url, "reconnect-delay": 0.5, "prefetch-count": 50})
        down.set_policy("fed", "^jobs$", {"federation-upstream": "up"}, apply_to="queues")
        down.wait_running("queue", "jobs")
        tally = Tally()
        publisher = Publisher(up, "", "jobs", 600, tally)
        publisher.start()
        import pika

        def consumer_here() -> tuple[pika.BlockingConnection, list[int]]:
            """A consumer downstream (the demand) that records and acks what it gets."""
            connection = down.connection()
            channel = connection.channel()
            channel.basic_qos(prefetch_count=20)

            def on_message(ch, method, properties, body) -> None:  # type: ignore[no-untyped-def]
                tally.arrived[int(body)] += 1
                ch.basic_ack(method.delivery_tag)

            channel.basic_consume("jobs", on_message)
            return connection, []

        connection, _ = consumer_here()
        pump = lambda seconds: connection.process_data_events(time_limit=seconds)  # noqa: E731
        wait_until(lambda: len(tally.arrived) >= 150, "messages moving downstream", 60, pump=pump)
        _restart(down)
        down.wait_running("queue", "jobs", within=60)
        connection, _ = consumer_here()
        pump = lambda seconds: connection.process_data_events(time_limit=seconds)  # noqa: E731
        publisher.join(timeout=120)
        wait_until(lambda: not [n for n in tally.confirmed if n not in tally.arrived],
                   "every confirmed message consumed downstream", 60, pump=pump)
        connection.close()
        print(f"confirmed {len(tally.confirmed)}, duplicates {tally.duplicates}")
        assert tally.lost == []
    finally:
        down.broker.kill()
        up.broker.kill()
