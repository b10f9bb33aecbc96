"""The management API tells the same story as the resource alarms that block publishers.

/api/nodes, the alarm health checks, a connection's state, and this broker's own routes for
changing the watermarks (/api/amqp-server/...) all read `broker.alarms`; the alarm's memory and
disk figures come from a resource monitor with measurements under the test's control.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pamqp import commands

from amqp_server.broker.alarms import DISK, MEMORY, MemoryGauge, ResourceMonitor
from amqp_server.broker.broker import Broker
from tests.frame_driver import opened_client
from tests.test_management_client import ManagementClient, broker_with_users

GIB = 1024**3


class Measured:
    """What the monitor reads: resident memory and free disk, set by the test."""

    def __init__(self, rss: int, disk_free: int) -> None:
        self.rss = rss
        self.disk_free = disk_free


@pytest.fixture
def measured() -> Measured:
    return Measured(rss=30_000_000, disk_free=7_000_000_000)


@pytest.fixture
def monitored(measured: Measured) -> tuple[Broker, ResourceMonitor]:
    broker = broker_with_users()
    gauge = MemoryGauge(read_rss=lambda: measured.rss, trim=None)
    monitor = ResourceMonitor(broker, gauge=gauge, read_disk_free=lambda: measured.disk_free)
    return broker, monitor


@pytest.fixture
def api(monitored) -> Iterator[ManagementClient]:
    # The real process figures (no fixed ProcessStats): what production serves.
    client = ManagementClient(monitored[0], fixed_process_stats=False)
    yield client
    client.close()


def node(api: ManagementClient) -> dict:
    [only] = api.get("/api/nodes")
    return only


def test_nodes_report_the_alarms_measurements_and_limits(monitored, measured, api):
    broker, monitor = monitored
    broker.alarms.set_memory_high_watermark(absolute=100_000_000)
    monitor.check()
    shown = node(api)
    assert (shown["mem_used"], shown["mem_limit"], shown["mem_alarm"]) == (30_000_000, 100_000_000, False)
    assert (shown["disk_free"], shown["disk_free_limit"], shown["disk_free_alarm"]) == (7_000_000_000, 50_000_000, False)

    measured.rss, measured.disk_free = 120_000_000, 10_000_000
    monitor.check()
    shown = node(api)
    assert (shown["mem_used"], shown["mem_alarm"]) == (120_000_000, True)
    assert (shown["disk_free"], shown["disk_free_alarm"]) == (10_000_000, True)
    assert api.get(f"/api/nodes/{broker.node_name}")["mem_alarm"] is True


def test_alarm_health_checks_fail_in_rabbitmqs_shape_while_an_alarm_is_in_effect(monitored, api):
    broker, _monitor = monitored
    assert api.get("/api/health/checks/alarms") == {"status": "ok"}
    broker.alarms.set(MEMORY, True)
    broker.alarms.set(DISK, True)
    reply = api.request("GET", "/api/health/checks/alarms")
    assert reply.status == 503
    assert reply.json() == {
        "status": "failed",
        "reason": "There are alarms in effect in the cluster",
        "alarms": [{"node": broker.node_name, "resource": "disk"}, {"node": broker.node_name, "resource": "memory"}],
    }
    local = api.request("GET", "/api/health/checks/local-alarms")
    assert (local.status, local.json()["reason"]) == (503, "There are alarms in effect on the node")
    broker.alarms.set(MEMORY, False)
    broker.alarms.set(DISK, False)
    assert api.get("/api/health/checks/local-alarms") == {"status": "ok"}


def test_connection_state_is_running_blocking_blocked_and_running_again(monitored, api):
    broker, _monitor = monitored
    client = opened_client(broker)
    client.call(1, commands.Queue.Declare(queue="q"))

    def state() -> str:
        [connection] = api.get("/api/connections")
        return connection["state"]

    assert state() == "running"
    broker.alarms.set(MEMORY, True)
    assert state() == "blocking"  # an alarm is in effect; its next publish will block it
    client.publish(1, b"m", routing_key="q")
    assert state() == "blocked"
    broker.alarms.set(MEMORY, False)
    assert state() == "running"


def test_a_consumer_only_connection_stays_blocking_never_blocked(monitored, api):
    broker, _monitor = monitored
    client = opened_client(broker)
    client.call(1, commands.Queue.Declare(queue="q"))
    client.send(1, commands.Basic.Consume(queue="q", consumer_tag="c"))
    broker.alarms.set(DISK, True)
    client.call(1, commands.Queue.Declare(queue="q2"))  # it keeps working: no publish, no block
    [connection] = api.get("/api/connections")
    assert connection["state"] == "blocking"


def test_alarms_route_shows_settings_measurements_and_alarms(monitored, api):
    broker, monitor = monitored
    broker.alarms.total_memory = 8 * GIB  # a known machine
    monitor.check()
    shown = api.get("/api/amqp-server/alarms")
    assert shown["node"] == broker.node_name
    assert shown["vm_memory_high_watermark"] == {"relative": 0.4}
    assert shown["memory_limit"] == 3_435_973_836  # 0.4 * 8 GiB
    assert (shown["memory_used"], shown["disk_free"], shown["disk_free_limit"]) == (30_000_000, 7_000_000_000,
                                                                                     50_000_000)
    assert shown["alarms"] == [] and shown["memory_alarm"] is False and shown["disk_alarm"] is False
    # Monitoring users may look; only administrators may change.
    assert api.request("GET", "/api/amqp-server/alarms", user="mon", password="mon").status == 200
    assert api.request("GET", "/api/amqp-server/alarms", user="mgmt", password="mgmt").status == 401


def test_setting_the_memory_watermark_takes_effect_at_once(monitored, api):
    broker, _monitor = monitored
    broker.alarms.total_memory = 8 * GIB  # a known machine
    reply = api.request("PUT", "/api/amqp-server/vm-memory-high-watermark", {"absolute": 20_000_000})
    assert reply.status == 204
    # No waiting for the next periodic check: the alarm was re-evaluated before the reply.
    assert broker.alarms.memory_alarm and broker.alarms.memory_limit == 20_000_000
    assert api.request("GET", "/api/health/checks/alarms").status == 503
    assert node(api)["mem_limit"] == 20_000_000

    assert api.request("PUT", "/api/amqp-server/vm-memory-high-watermark", {"absolute": "1GiB"}).status == 204
    assert not broker.alarms.memory_alarm and broker.alarms.memory_limit == GIB
    assert api.get("/api/amqp-server/alarms")["vm_memory_high_watermark"] == {"absolute": GIB}

    assert api.request("PUT", "/api/amqp-server/vm-memory-high-watermark", {"relative": "0.5"}).status == 204
    assert broker.alarms.memory_limit == 4 * GIB
    assert node(api)["mem_limit"] == 4 * GIB
    assert api.get("/api/amqp-server/alarms")["vm_memory_high_watermark"] == {"relative": 0.5}


def test_setting_the_disk_free_limit_takes_effect_at_once(monitored, api):
    broker, _monitor = monitored
    broker.alarms.total_memory = 8 * GIB  # a known machine
    assert api.request("PUT", "/api/amqp-server/disk-free-limit", {"absolute": "8GB"}).status == 204
    assert broker.alarms.disk_free_limit == 8_000_000_000 and broker.alarms.disk_alarm
    assert node(api)["disk_free_alarm"] is True
    assert api.request("PUT", "/api/amqp-server/disk-free-limit", {"absolute": 1_000_000}).status == 204
    assert not broker.alarms.disk_alarm
    assert api.request("PUT", "/api/amqp-server/disk-free-limit", {"relative": 1.5}).status == 204
    assert broker.alarms.disk_free_limit == 12 * GIB
    assert broker.alarms.disk_alarm  # 7 GB free is below 1.5 * 8 GiB


@pytest.mark.parametrize("path,body", [
    ("vm-memory-high-watermark", {"relative": 1.5}),
    ("vm-memory-high-watermark", {"relative": -0.1}),
    ("vm-memory-high-watermark", {"relative": "lots"}),
    ("vm-memory-high-watermark", {"absolute": "1XB"}),
    ("vm-memory-high-watermark", {"absolute": -5}),
    ("vm-memory-high-watermark", {"relative": 0.5, "absolute": 100}),
    ("vm-memory-high-watermark", {}),
    ("disk-free-limit", {"absolute": "much"}),
    ("disk-free-limit", {"relative": -1}),
])
def test_bad_settings_are_refused_and_change_nothing(monitored, api, path, body):
    broker, _monitor = monitored
    before = (broker.alarms.memory_limit, broker.alarms.disk_free_limit)
    reply = api.request("PUT", f"/api/amqp-server/{path}", body)
    assert reply.status == 400 and reply.json()["error"] == "bad_request"
    assert (broker.alarms.memory_limit, broker.alarms.disk_free_limit) == before


def test_only_administrators_change_the_limits(monitored, api):
    broker, _monitor = monitored
    for user in ("mon", "mgmt"):
        reply = api.request("PUT", "/api/amqp-server/disk-free-limit", {"absolute": 1}, user=user, password=user)
        assert reply.status == 401
    assert broker.alarms.disk_free_limit == 50_000_000
