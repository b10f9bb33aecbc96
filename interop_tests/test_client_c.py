"""rabbitmq-c (Debian's librabbitmq4 0.11) against the broker: a C program on the library
(interop_tests/clients/c/scenarios.c, compiled once per session), and the amqp-tools commands.

Each scenario of the program prints what it observed as JSON; the assertions live here. The
restart, memory-alarm and TLS scenarios use `controlled_broker` (client_programs.py), which
against RabbitMQ needs INTEROP_RABBITMQCTL (and INTEROP_BROKER_AMQPS_URL and
INTEROP_BROKER_CA_FILE for TLS).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from interop_tests.client_programs import (CLIENTS_DIR, SERVER_CAPABILITIES,
                                           SERVER_PROPERTY_KEYS, SHUTDOWN_TEXT, Running, require_program, run)
from interop_tests.client_programs import controlled_broker  # noqa: F401  (a fixture)

pytestmark = pytest.mark.timeout(60)

SOURCE = CLIENTS_DIR / "c" / "scenarios.c"


@pytest.fixture(scope="session")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scenarios.c compiled against librabbitmq-dev, once per test session."""
    gcc = require_program("gcc", "gcc")
    if not Path("/usr/include/amqp.h").exists():
        pytest.fail("amqp.h not found: the C client tests need Debian's librabbitmq-dev "
                    "(scripts/install-test-system-packages installs it)", pytrace=False)
    binary = tmp_path_factory.mktemp("c-client") / "scenarios"
    result = subprocess.run([gcc, "-O1", "-Wall", "-o", str(binary), str(SOURCE), "-lrabbitmq"],
                            capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        pytest.fail(f"compiling {SOURCE.name} failed:\n{result.stderr}", pytrace=False)
    return binary


def scenario(program: Path, name: str, url: str, *extra: str) -> dict:
    return run([str(program), name, url, *extra])


def test_connect_reads_the_server_capabilities_and_tuning(broker, program):
    report = scenario(program, "connect", broker.url())
    assert report["capabilities"] == SERVER_CAPABILITIES
    assert SERVER_PROPERTY_KEYS <= set(report["server_properties"])
    # rabbitmq-c asks for channel_max 0 (the server's) and frame_max 131072, no heartbeat.
    assert (report["channel_max"], report["frame_max"], report["heartbeat"]) == (2047, 131072, 0)


def test_publisher_confirms_ack_every_publish_and_the_return_comes_before_its_ack(broker, program):
    report = scenario(program, "confirms", broker.url())
    assert report["acked"] == list(range(1, 22)) and report["nacked"] == 0
    assert report["returned"] == {"code": 312, "text": "NO_ROUTE", "body": "unroutable"}
    assert report["return_before_ack"] is True
    assert report["message_count"] == 20


def test_prefetch_holds_the_consumer_at_three_unacked_messages(broker, program):
    report = scenario(program, "prefetch", broker.url())
    assert report["held_before_ack"] == 3
    assert report["bodies"] == [str(i) for i in range(10)]
    assert report["redelivered"] == 0 and report["message_count"] == 0


def test_reject_with_requeue_redelivers_and_without_drops(broker, program):
    report = scenario(program, "reject", broker.url())
    assert report["deliveries"] == [
        {"body": "first", "redelivered": False, "action": "requeued"},
        {"body": "first", "redelivered": True, "action": "acked"},
        {"body": "second", "redelivered": False, "action": "dropped"},
    ]
    assert report["message_count"] == 0


def test_channel_errors_close_the_channel_and_the_connection_carries_on(broker, program):
    report = scenario(program, "channel_error", broker.url())
    assert report["missing_queue"] == {"code": 404, "text": "NOT_FOUND - no queue 'no-such-queue-c' in vhost '/'",
                                       "class_id": 50, "method_id": 10}
    assert report["unknown_tag"] == {"code": 406, "text": "PRECONDITION_FAILED - unknown delivery tag 99",
                                     "class_id": 60, "method_id": 80}
    assert report["after"] == "still here"


def test_heartbeats_keep_an_idle_connection_open(broker, program):
    report = scenario(program, "heartbeat", broker.url())
    assert report["heartbeat"] == 1
    # Three seconds without a message: a plain timeout, not a missed heartbeat, on both sides.
    assert report["idle"] == "timeout"
    assert report["after"] == "after the idle time"


def test_bodies_larger_than_a_frame_with_frame_max_4096(broker, program):
    report = scenario(program, "large", broker.url())
    assert report["frame_max"] == 4096
    assert report["bodies"] == [{"size": 4088, "intact": True}, {"size": 4089, "intact": True},
                                {"size": 1048577, "intact": True}]


def test_tls_with_the_peer_and_host_name_verified(controlled_broker, program):
    report = scenario(program, "tls", controlled_broker.amqps_url(), str(controlled_broker.ca_file))
    assert report["body"] == "over tls"


def test_connection_blocked_when_announced_holds_the_publish_until_unblocked(controlled_broker, program):
    controlled_broker.set_memory_alarm()
    try:
        with Running([str(program), "blocked", controlled_broker.url()]) as client:
            client.wait_for("blocked")
            during_alarm = client.events_for(0.5)
            controlled_broker.clear_memory_alarm()
            report = client.result()
    finally:
        controlled_broker.clear_memory_alarm()
    assert report["reason"] == "low on memory"
    assert during_alarm == []  # the publish that met the alarm waits: no ack while it lasts
    # connection.unblocked first, then the broker reads the publish it held and acks it.
    assert report["order"] == "blocked,unblocked,ack"
    assert report["body"] == "held"


def test_publish_is_held_silently_when_the_client_did_not_announce_connection_blocked(controlled_broker, program):
    controlled_broker.set_memory_alarm()
    try:
        with Running([str(program), "blocked_unannounced", controlled_broker.url()]) as client:
            client.wait_for("published")
            during_alarm = client.events_for(0.5)
            controlled_broker.clear_memory_alarm()
            report = client.result()
    finally:
        controlled_broker.clear_memory_alarm()
    assert during_alarm == []  # rabbitmq-c's default: no connection.blocked, and no ack while the alarm lasts
    assert (report["reason"], report["order"], report["body"]) == ("", "ack", "held")


def test_after_a_broker_restart_the_application_reconnects_and_gets_its_unacked_message(controlled_broker, program):
    with Running([str(program), "restart", controlled_broker.url()]) as client:
        client.wait_for("consuming")
        controlled_broker.restart()
        report = client.result()
    assert report["seen"] == "connection.close"
    assert report["closed"] == {"code": 320, "text": SHUTDOWN_TEXT, "class_id": 0, "method_id": 0}
    assert report["deliveries"] == [{"body": "in flight", "redelivered": True},
                                    {"body": "after the restart", "redelivered": False}]


# ---- amqp-tools: rabbitmq-c's command-line tools --------------------------------------------

def tool(name: str, url: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    command = [require_program(name, "amqp-tools"), "-u", url, *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if check:
        assert result.returncode == 0, f"{' '.join(command)}: exit {result.returncode}\n{result.stderr}"
    return result


def test_amqp_tools_declare_publish_get_and_consume(broker, unique):
    url, queue = broker.url(), unique("c-tools")
    assert tool("amqp-declare-queue", url, "-q", queue).stdout == f"{queue}\n"
    try:
        for body in ("one", "two", "three"):
            tool("amqp-publish", url, "-r", queue, "-C", "text/plain", "-H", "x-from: amqp-tools", "-p", "-b", body)
        assert tool("amqp-get", url, "-q", queue).stdout == "one"
        # Two messages, one at a time (prefetch 1), each acked once `cat` has written it.
        assert tool("amqp-consume", url, "-q", queue, "-c", "2", "-p", "1", "cat").stdout == "twothree"
        empty = tool("amqp-get", url, "-q", queue, check=False)
        assert (empty.returncode, empty.stdout) == (2, "")  # amqp-get's "queue is empty"
    finally:
        assert tool("amqp-delete-queue", url, "-q", queue).stdout == "0\n"  # messages it still held


def test_amqp_tools_report_the_channel_error_text(broker, unique):
    queue = unique("c-tools-missing")
    result = tool("amqp-get", broker.url(), "-q", queue, check=False)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"basic.get: server channel error 404, message: NOT_FOUND - no queue '{queue}' in vhost '/'")


def test_amqp_tools_over_tls(controlled_broker, unique):
    url, queue, ca_file = controlled_broker.amqps_url(), unique("c-tools-tls"), str(controlled_broker.ca_file)
    tool("amqp-declare-queue", url, "--cacert", ca_file, "-q", queue)
    try:
        tool("amqp-publish", url, "--cacert", ca_file, "-r", queue, "-b", "over tls")
        assert tool("amqp-get", url, "--cacert", ca_file, "-q", queue).stdout == "over tls"
    finally:
        tool("amqp-delete-queue", url, "--cacert", ca_file, "-q", queue)


def test_amqp_tools_consumer_with_heartbeats_waits_out_an_idle_time(broker, unique):
    url, queue = broker.url(), unique("c-tools-idle")
    tool("amqp-declare-queue", url, "-q", queue)
    try:
        consumer = subprocess.Popen([require_program("amqp-consume", "amqp-tools"), "-u", url, "--heartbeat=1",
                                     "-q", queue, "-c", "1", "cat"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(3)  # three heartbeat intervals with nothing to deliver
            assert consumer.poll() is None, consumer.communicate()
            tool("amqp-publish", url, "-r", queue, "-b", "after the idle time")
            out, err = consumer.communicate(timeout=10)
        finally:
            if consumer.poll() is None:
                consumer.kill()
                consumer.wait()
        assert (consumer.returncode, out) == (0, "after the idle time"), err
    finally:
        tool("amqp-delete-queue", url, "-q", queue)
