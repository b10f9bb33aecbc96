"""Policies and limits outlive a SIGKILL; a RabbitMQ definitions file loads at boot, twice alike.

Each test starts its own broker (this project's) with a management port.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pika
import pytest
from pika.exceptions import ProbableAccessDeniedError

from interop_tests.broker_process import free_port
from interop_tests.management_helpers import Management
from interop_tests.pika_helpers import publish_confirmed, ready_count

FIXTURE = Path(__file__).parent / "fixtures" / "rabbitmq-3.10-definitions.json"


def managed(broker_factory, *extra: str) -> tuple[object, Management]:
    port = free_port()
    broker = broker_factory(extra_args=("--management-port", str(port), *extra))
    return broker, Management(f"http://127.0.0.1:{port}")


def test_policies_and_limits_are_in_force_after_a_sigkill(broker_factory):
    broker, api = managed(broker_factory)
    connection = pika.BlockingConnection(pika.URLParameters(broker.url()))
    channel = connection.channel()
    channel.queue_declare("orders", durable=True)
    connection.close()
    api.set_policy("cap", "^orders$", {"max-length": 2}, apply_to="queues")
    api.set_policy("op", ".*", {"message-ttl": 600000}, operator=True)
    api.add_vhost("tenant")
    api.put("/api/vhost-limits/tenant/max-connections", {"value": 0})
    api.put("/api/user-limits/guest/max-channels", {"value": 5})
    broker.kill()
    broker.start()
    assert [p["name"] for p in api.get("/api/policies")] == ["cap"]
    assert [p["name"] for p in api.get("/api/operator-policies")] == ["op"]
    assert api.get("/api/user-limits") == [{"user": "guest", "value": {"max-channels": 5}}]
    connection = pika.BlockingConnection(pika.URLParameters(broker.url()))
    channel = connection.channel()
    publish_confirmed(connection, "orders", [b"m1", b"m2", b"m3"])
    assert ready_count(channel, "orders") == 2, "the restored queue is under its restored policy"
    assert api.queue("orders")["effective_policy_definition"] == {"max-length": 2, "message-ttl": 600000}
    connection.close()
    with pytest.raises(ProbableAccessDeniedError, match=r"\(530\).*connection limit \(0\) is reached"):
        pika.BlockingConnection(pika.URLParameters(broker.url(vhost="tenant")))


def test_a_rabbitmq_export_loads_at_boot_and_loading_it_again_changes_nothing(broker_factory):
    broker, api = managed(broker_factory, "--definitions", str(FIXTURE))
    exported = api.get("/api/definitions")
    assert {p["name"] for p in exported["policies"]} >= {"ttl-jobs"}
    assert "jobs" in {q["name"] for q in exported["queues"]}
    log = broker.log_text()
    [line] = [line for line in log.splitlines() if "not applied" in line and "definitions import" in line]
    assert "queue 'events-stream' in vhost '/': stream queues are not supported" in line
    broker.kill()
    broker.start()
    assert api.get("/api/definitions") == exported


def test_a_definitions_file_the_broker_refuses_stops_it_from_starting(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"queues": [{"name": "q", "vhost": "/", "arguments": {"x-max-length": -1}}]}))
    result = subprocess.run(
        [sys.executable, "-m", "amqp_server", "--port", str(free_port()), "--data-dir", str(tmp_path / "data"),
         "--management-port", "0", "--metrics-port", "0", "--definitions", str(bad)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert result.returncode == 1
    assert (f"definitions file {bad} was refused: invalid arg 'x-max-length' for queue 'q' in vhost '/': "
            "{value_negative,-1}") in result.stderr + result.stdout
