"""rabbitmq-c (Debian's librabbitmq4 0.11) against the broker: a C program on the library
(interop_tests/clients/c/scenarios.c, compiled once per session), and the amqp-tools commands.

Each scenario of the program prints what it observed as JSON; the assertions live here and, for
what every client observes alike, in client_expectations.py. The alarm, restart and TLS tests
use `controlled_broker`, which against RabbitMQ (INTEROP_BROKER_URL) needs INTEROP_RABBITMQCTL,
and INTEROP_BROKER_AMQPS_URL and INTEROP_BROKER_CA_FILE for TLS (interop_tests/README.md).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from interop_tests.client_expectations import (REDELIVERED_AFTER_RESTART, SERVER_PROPERTY_KEYS, SHUTDOWN_TEXT,
                                               UNKNOWN_DELIVERY_TAG, drive_memory_alarm, drive_restart,
                                               expect_blocked_then_unblocked, expect_confirms, expect_heartbeats,
                                               expect_large_message, expect_prefetch, expect_reject_requeue,
                                               expect_server_capabilities, not_found)
from interop_tests.scenario_programs import CLIENTS_DIR, ScenarioProgram, build, require_files, require_program

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="session")
def c_client(tmp_path_factory: pytest.TempPathFactory) -> ScenarioProgram:
    """scenarios.c compiled against librabbitmq-dev, once per test session."""
    require_files("the C client's tests (Debian: librabbitmq-dev)", Path("/usr/include/amqp.h"))
    binary = tmp_path_factory.mktemp("c-client") / "scenarios"
    build("gcc", [require_program("gcc", "gcc"), "-O1", "-Wall", "-o", str(binary), "scenarios.c", "-lrabbitmq"],
          cwd=CLIENTS_DIR / "c", timeout=120)
    return ScenarioProgram("c", (str(binary),))


def test_connect_reads_the_server_capabilities_and_tuning(broker, c_client):
    report = c_client.run("connect", broker.url())
    expect_server_capabilities(report["capabilities"])
    assert SERVER_PROPERTY_KEYS <= set(report["server_properties"])
    # rabbitmq-c asks for channel_max 0 (the server's) and frame_max 131072, no heartbeat.
    assert (report["channel_max"], report["frame_max"], report["heartbeat"]) == (2047, 131072, 0)


def test_publisher_confirms_ack_every_publish_and_the_return_comes_before_its_ack(broker, c_client):
    report = c_client.run("confirms", broker.url())
    returned = report["returned"]
    expect_confirms(report["acked"], report["nacked"], (returned["code"], returned["text"], returned["body"]),
                    report["return_before_ack"], report["message_count"])


def test_prefetch_holds_the_consumer_at_its_limit(broker, c_client):
    report = c_client.run("prefetch", broker.url())
    expect_prefetch(report["held_before_ack"], report["bodies"], report["message_count"])
    assert report["redelivered"] == 0


def test_reject_with_requeue_redelivers_the_message_first(broker, c_client):
    report = c_client.run("reject_requeue", broker.url())
    expect_reject_requeue(report["deliveries"], report["message_count"])


def test_channel_errors_close_the_channel_and_the_connection_carries_on(broker, c_client):
    report = c_client.run("channel_error", broker.url())
    assert report["missing_queue"] == {"code": 404, "text": not_found("no-such-queue-c"), "class_id": 50,
                                       "method_id": 10}
    assert report["unknown_tag"] == {"code": 406, "text": UNKNOWN_DELIVERY_TAG, "class_id": 60, "method_id": 80}
    assert report["after"] == "still here"


def test_heartbeats_keep_an_idle_connection_open(broker, c_client):
    report = c_client.run("heartbeats", broker.url())
    # Three seconds without a message: a plain timeout, not a missed heartbeat, on both sides.
    assert report["idle"] == "timeout"
    expect_heartbeats(report["heartbeat"], report["after"])


def test_bodies_larger_than_a_frame_with_frame_max_4096(broker, c_client):
    report = c_client.run("large_message", broker.url())
    expect_large_message(report["frame_max"], report["bodies"])


def test_tls_with_the_peer_and_host_name_verified(controlled_broker, c_client):
    report = c_client.run("tls", controlled_broker.amqps_url(), str(controlled_broker.ca_file))
    assert report["body"] == "over tls"


def test_connection_blocked_when_announced_holds_the_publish_until_unblocked(controlled_broker, c_client):
    report = drive_memory_alarm(c_client, controlled_broker)
    expect_blocked_then_unblocked(report["reason"], report["while_blocked"], report["order"], report["body"])


def test_publish_is_held_silently_when_the_client_did_not_announce_connection_blocked(controlled_broker, c_client):
    report = drive_memory_alarm(c_client, controlled_broker, "blocked_unannounced")
    # rabbitmq-c's default: no connection.blocked, and no ack while the alarm lasts.
    assert report["while_blocked"] == []
    assert (report["reason"], report["order"], report["body"]) == ("", "ack", "held")


def test_after_a_broker_restart_the_application_reconnects_and_gets_its_unacked_message(controlled_broker, c_client):
    report = drive_restart(c_client, controlled_broker)
    assert report["seen"] == "connection.close"
    assert report["closed"] == {"code": 320, "text": SHUTDOWN_TEXT, "class_id": 0, "method_id": 0}
    assert report["deliveries"] == REDELIVERED_AFTER_RESTART


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
