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
FIXTURE_3_13 = Path(__file__).parent / "fixtures" / "rabbitmq-3.13-shaped-definitions.json"


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
    api.put("/api/vhost-limits/tenant/max-queues", {"value": 3})
    api.put("/api/user-limits/guest/max-channels", {"value": 5})
    api.put("/api/users/capped", {"password": "capped", "tags": ""})
    api.put("/api/permissions/%2F/capped", {"configure": ".*", "write": ".*", "read": ".*"})
    api.put("/api/user-limits/capped/max-connections", {"value": 0})
    broker.kill()
    broker.start()
    assert [p["name"] for p in api.get("/api/policies")] == ["cap"]
    assert [p["name"] for p in api.get("/api/operator-policies")] == ["op"]
    assert api.get("/api/vhost-limits") == [{"vhost": "tenant", "value": {"max-connections": 0, "max-queues": 3}}]
    assert api.get("/api/user-limits") == [{"user": "capped", "value": {"max-connections": 0}},
                                           {"user": "guest", "value": {"max-channels": 5}}]
    with pytest.raises(ProbableAccessDeniedError, match=r"\(530\).*user connection limit \(0\) is reached"):
        pika.BlockingConnection(pika.URLParameters(broker.url("capped", "capped")))
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


def test_a_file_shaped_as_rabbitmq_3_13_exports_loads_at_boot(broker_factory):
    """No RabbitMQ 3.13 runs here to export one: the fixture is hand-made with the fields 3.13
    adds (product_name/product_version, a vhost's default_queue_type top-level and in metadata,
    apply-to classic_queues/quorum_queues, a quorum queue named by its "type" alone)."""
    broker, api = managed(broker_factory, "--definitions", str(FIXTURE_3_13))
    [line] = [line for line in broker.log_text().splitlines() if "definitions import" in line and "not applied" in line]
    assert line.endswith(
        "definitions import: 2 definition(s) not applied: default queue type 'quorum' of vhost 'votes13': a vhost's "
        "default queue type is not supported (a queue declared there without x-queue-type is classic); "
        "global parameter 'cluster_name': global parameters are not supported")
    assert api.get("/api/policies/tenant13") == [
        {"vhost": "tenant13", "name": "dlx", "pattern": "^jobs", "apply-to": "classic_queues",
         "definition": {"dead-letter-exchange": "dead", "queue-version": 2, "max-length": 500}, "priority": 1}]
    assert api.get("/api/vhost-limits/tenant13") == [
        {"vhost": "tenant13", "value": {"max-queues": 10, "max-connections": 5}}]
    assert api.get("/api/user-limits/app13") == [{"user": "app13", "value": {"max-channels": 20}}]
    assert api.get("/api/queues/votes13/votes")["type"] == "quorum"
    jobs = api.get("/api/queues/tenant13/jobs")
    assert (jobs["policy"], jobs["operator_policy"]) == ("dlx", None), "cap applies to quorum queues only"
    connection = pika.BlockingConnection(pika.URLParameters(broker.url("app13", "remote", "tenant13")))
    channel = connection.channel()
    publish_confirmed(connection, "jobs", [b"m%d" % n for n in range(502)])
    assert ready_count(channel, "jobs") == 500
    assert ready_count(channel, "dead-letters") == 2, "trimmed by the policy into its dead-letter exchange"
    connection.close()
    exported = without_config_users_hashes(api.get("/api/definitions"))
    broker.kill()
    broker.start()  # imports the file again, on top of what it restored
    assert without_config_users_hashes(api.get("/api/definitions")) == exported


def without_config_users_hashes(definitions: dict) -> dict:
    """The users of the configuration file (not in the definitions file) are hashed anew, with
    a new salt, at every start."""
    from_file = {user["name"] for user in json.loads(FIXTURE_3_13.read_text())["users"]}
    for user in definitions["users"]:
        if user["name"] not in from_file:
            user.pop("password_hash", None)
    return definitions
