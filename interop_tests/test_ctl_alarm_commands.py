"""`ctl set_vm_memory_high_watermark` and `ctl set_disk_free_limit` against a running broker.

Lowering a watermark below what the broker uses raises the alarm at once: a pika publisher is
blocked with connection.blocked on its next publish, `list_connections` shows it "blocked"
(and a connection that has not published "blocking"), `status` and the health check report the
alarm. Raising the watermark again unblocks the publisher and its message is delivered.
"""

from __future__ import annotations

import io
import json
import os
import re
import urllib.error
import urllib.request
from base64 import b64encode

import pytest

from interop_tests.broker_process import BrokerProcess, free_port
from interop_tests.pika_helpers import connect
from interop_tests.waiting import wait_until
from amqp_server.ctl.main import main as ctl_main

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("INTEROP_BROKER_URL")), reason="ctl talks to this project's management API"
)

WAIT_S = 10.0
CONNECTION_NAME = re.compile(r'\{"connection_name","([^"]*)"\}')


class Ctl:
    def __init__(self, broker: BrokerProcess, port: int) -> None:
        self.broker = broker
        self.port = port

    def __call__(self, *args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        code = ctl_main(["--port", str(self.port), *args], out=out, err=err)
        return code, out.getvalue(), err.getvalue()

    def ok(self, *args: str) -> str:
        code, out, err = self(*args)
        assert code == 0, err
        return out

    def states(self) -> dict[str, str]:
        """connection_name (client property) -> state, from list_connections."""
        rows = [line.split("\t") for line in self.ok("-s", "list_connections", "client_properties", "state").splitlines()]
        return {match.group(1): state for properties, state in rows
                if (match := CONNECTION_NAME.search(properties))}

    def health(self) -> tuple[int, dict]:
        return self.api("/api/health/checks/alarms")

    def limits(self) -> tuple[dict, int]:
        alarms = self.api("/api/amqp-server/alarms")[1]
        return alarms["vm_memory_high_watermark"], alarms["disk_free_limit"]

    def api(self, path: str) -> tuple[int, dict]:
        request = urllib.request.Request(f"http://localhost:{self.port}{path}",
                                         headers={"Authorization": "Basic " + b64encode(b"guest:guest").decode()})
        try:
            with urllib.request.urlopen(request, timeout=WAIT_S) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())


@pytest.fixture
def ctl(broker_factory) -> Ctl:
    port = free_port()
    return Ctl(broker_factory(extra_args=("--management-port", str(port), "--metrics-port", "0")), port)


def test_memory_watermark_blocks_and_unblocks_a_publisher(ctl):
    out = ctl.ok("status")
    assert "Alarms\n\n(none)\n" in out
    assert "Memory high watermark setting: 0.4 of available memory, computed to: " in out

    consumer = connect(ctl.broker, label="consumer")
    consumer_channel = consumer.channel()
    consumer_channel.queue_declare("watermark-q")
    received: list[bytes] = []
    consumer_channel.basic_consume("watermark-q", lambda _ch, _m, _p, body: received.append(body), auto_ack=True)
    publisher = connect(ctl.broker, label="publisher")
    events: list[str] = []
    publisher.add_on_connection_blocked_callback(lambda _c, frame: events.append(frame.method.reason))
    publisher.add_on_connection_unblocked_callback(lambda _c, _frame: events.append("unblocked"))
    publish_channel = publisher.channel()

    node = json.loads(ctl.ok("--formatter", "json", "status"))["node"]["name"]
    assert ctl.ok("set_vm_memory_high_watermark", "absolute", "1") == (
        f"Setting memory threshold on {node} to 1 bytes ...\n")
    # The alarm is in effect as soon as the command returns: nobody has published yet.
    assert ctl.states() == {"consumer": "blocking", "publisher": "blocking"}
    status, body = ctl.health()
    assert (status, body["alarms"]) == (503, [{"node": node, "resource": "memory"}])
    assert f"Memory alarm on node {node}" in ctl.ok("status")

    publish_channel.basic_publish("", "watermark-q", b"held")
    wait_until(lambda: events, "a connection.blocked", WAIT_S, pump=publisher.process_data_events)
    assert events == ["low on memory"]
    assert ctl.states() == {"consumer": "blocking", "publisher": "blocked"}

    assert ctl.ok("set_vm_memory_high_watermark", "0.4") == f"Setting memory threshold on {node} to 0.4 ...\n"
    wait_until(lambda: len(events) == 2, "a connection.unblocked", WAIT_S, pump=publisher.process_data_events)
    assert events == ["low on memory", "unblocked"]
    wait_until(lambda: received, "delivery of the held message", WAIT_S, pump=consumer.process_data_events)
    assert received == [b"held"]
    assert ctl.states() == {"consumer": "running", "publisher": "running"}
    assert ctl.health() == (200, {"status": "ok"})
    publisher.close()
    consumer.close()


def test_disk_free_limit_raises_and_clears_the_disk_alarm(ctl):
    node = json.loads(ctl.ok("--formatter", "json", "status"))["node"]["name"]
    # No disk has this much free space.
    assert ctl.ok("set_disk_free_limit", "1000000000GB") == (
        f"Setting disk free limit on {node} to 1000000000GB bytes ...\n")
    out = ctl.ok("status")
    assert f"Free disk space alarm on node {node}" in out
    assert "Low free disk space watermark: 1000000000.0 gb" in out
    assert ctl.health()[1]["alarms"] == [{"node": node, "resource": "disk"}]

    assert ctl.ok("set_disk_free_limit", "mem_relative", "0.001") == (
        f"Setting disk free limit on {node} to 0.001 times the total RAM ...\n")
    assert ctl.health() == (200, {"status": "ok"})
    ctl.ok("set_disk_free_limit", "50MB")
    assert "Alarms\n\n(none)\n" in (out := ctl.ok("status")) and "Low free disk space watermark: 0.05 gb" in out


@pytest.mark.parametrize("args,message", [
    (("set_vm_memory_high_watermark", "1.5"), "Bad argument: The threshold should be a fraction between 0.0 and 1.0"),
    (("set_vm_memory_high_watermark", "lots"), "Bad argument."),
    (("set_vm_memory_high_watermark", "absolute", "1XB"), "Bad argument: absolute must be a byte count"),
    (("set_disk_free_limit", "-5"), "Bad argument."),
    (("set_disk_free_limit", "mem_relative", "abc"), "Bad argument."),
])
def test_bad_arguments_are_refused_as_rabbitmqctl_refuses_them(ctl, args, message):
    before = ctl.limits()
    code, _out, err = ctl(*args)
    assert code == 65
    assert err.startswith(f"Error (argument validation): {message}")
    assert f"Arguments given:\n\t{' '.join(args)}\n" in err
    assert ctl.limits() == before == ({"relative": 0.4}, 50_000_000)
