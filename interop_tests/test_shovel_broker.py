"""Shovels in a running broker process: a static shovel from the configuration file, a dynamic
one that survives a restart (its parameter is durable), `ctl shovel_status` and `ctl
delete_shovel` in rabbitmqctl's shape, and definitions export and import carrying shovels."""

from __future__ import annotations

import os

import pytest
import requests

from interop_tests.broker_process import TEST_CONFIG, free_port, launch
from interop_tests.shovel_helpers import depth, publish_numbered
from interop_tests.test_ctl_commands import Ctl
from interop_tests.waiting import poll

pytestmark = pytest.mark.skipif(bool(os.environ.get("INTEROP_BROKER_URL")), reason="starts its own brokers")

STATIC = TEST_CONFIG + '''
[[shovels]]
name = "static-move"
src-uri = "amqp://"
src-queue = "static-in"
dest-uri = "amqp://"
dest-queue = "static-out"
ack-mode = "on-confirm"
'''


def test_static_and_dynamic_shovels_ctl_and_a_restart(tmp_path):
    port = free_port()
    broker = launch(tmp_path / "broker", config_text=STATIC, extra_args=("--management-port", str(port)))
    api = f"http://127.0.0.1:{port}"
    auth = ("guest", "guest")
    ctl = Ctl(broker, port)
    try:
        publish_numbered(broker.url(), "static-in", 100)
        assert poll(lambda: depth(broker, "static-out") == 100, 20, every=0.1)
        value = {"src-uri": "amqp://", "src-queue": "dyn-in", "dest-uri": "amqp://", "dest-queue": "dyn-out"}
        assert requests.put(f"{api}/api/parameters/shovel/%2F/dyn", json={"value": value}, auth=auth,
                            timeout=10).status_code == 201
        assert poll(lambda: len([s for s in requests.get(f"{api}/api/shovels", auth=auth, timeout=10).json()
                                 if s["state"] == "running"]) == 2, 20, every=0.1)
        code, out, err = ctl("shovel_status")
        assert code == 0, err
        lines = out.splitlines()
        assert lines[0].startswith("Shovel status on node ")
        assert lines[1].split("\t") == ["destination", "destination_protocol", "destination_queue", "last_changed",
                                        "name", "source", "source_protocol", "source_queue", "state",
                                        "termination_reason", "type", "vhost", "reconnects", "last_error"]
        rows = {row[4]: row for row in (line.split("\t") for line in lines[2:])}
        assert rows["dyn"][:3] == ["amqp://", "amqp091", "dyn-out"] and rows["dyn"][8:12] == [
            "running", "", "dynamic", "/"]
        assert rows["static-move"][10] == "static"
        # Definitions carry the dynamic shovel (a static one is the configuration file's).
        exported = requests.get(f"{api}/api/definitions", auth=auth, timeout=10).json()
        assert [p for p in exported["parameters"] if p["component"] == "shovel"] == [
            {"value": value, "vhost": "/", "component": "shovel", "name": "dyn"}]
        # The dynamic shovel is durable: after a restart it runs again.
        broker.restart()
        publish_numbered(broker.url(), "dyn-in", 50)
        assert poll(lambda: depth(broker, "dyn-out") == 50, 20, every=0.1)
        code, out, err = ctl("delete_shovel", "dyn")
        assert (code, out) == (0, "Deleting shovel dyn in vhost /\n"), err
        code, out, err = ctl("delete_shovel", "dyn")
        assert code == 69 and err.startswith("Error:\nShovel with the given name was not found on the target node")
        assert requests.get(f"{api}/api/parameters/shovel", auth=auth, timeout=10).json() == []
        # ... and an import brings it back.
        reply = requests.post(f"{api}/api/definitions", json={"parameters": exported["parameters"]}, auth=auth,
                              timeout=10)
        assert reply.status_code in (200, 204), reply.text
        assert poll(lambda: any(s["name"] == "dyn" and s["state"] == "running" for s in
                                requests.get(f"{api}/api/shovels", auth=auth, timeout=10).json()), 20, every=0.1)
    finally:
        broker.stop()


def test_a_bad_static_shovel_stops_the_broker_with_rabbitmqs_text(tmp_path):
    bad = TEST_CONFIG + '\n[[shovels]]\nname = "bad"\nsrc-uri = "foo://x"\nsrc-queue = "a"\ndest-uri = "amqp://"\n'
    with pytest.raises(RuntimeError) as refused:
        launch(tmp_path / "broker", config_text=bad)
    assert ("static shovel 'bad' in vhost '/': \"foo://x\" not a valid URI: "
            "{{unexpected_uri_scheme,\"foo\"},\"foo://x\"}") in str(refused.value)
