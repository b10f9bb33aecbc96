"""PHP's two clients against the broker: php-amqplib (Debian's php-amqplib 3.5, pure PHP) and
the php-amqp extension (Debian's php-amqp 1.11, AMQPConnection on rabbitmq-c).

Each scenario is a function of interop_tests/clients/php/amqplib_scenarios.php or
ext_scenarios.php that prints what it observed as JSON; the assertions live here. The restart,
memory-alarm and TLS scenarios use `controlled_broker` (client_programs.py), which against
RabbitMQ needs INTEROP_RABBITMQCTL (and INTEROP_BROKER_AMQPS_URL and INTEROP_BROKER_CA_FILE for TLS).
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

import pytest

from interop_tests.client_programs import (CLIENTS_DIR, SERVER_CAPABILITIES,
                                           SERVER_PROPERTY_KEYS, SHUTDOWN_TEXT, Running, require_program, run)
from interop_tests.client_programs import controlled_broker  # noqa: F401  (a fixture)

pytestmark = pytest.mark.timeout(60)

SCRIPTS = {"amqplib": CLIENTS_DIR / "php" / "amqplib_scenarios.php", "ext": CLIENTS_DIR / "php" / "ext_scenarios.php"}


@functools.cache
def php() -> str:
    """`php`, with php-amqplib and the amqp extension there (checked once)."""
    binary = require_program("php", "php-cli")
    if not Path("/usr/share/php/PhpAmqpLib/autoload.php").exists():
        pytest.fail("php-amqplib not found in /usr/share/php: install Debian's php-amqplib "
                    "(scripts/install-test-system-packages)", pytrace=False)
    modules = subprocess.run([binary, "-m"], capture_output=True, text=True, timeout=30).stdout.split()
    if "amqp" not in modules:
        pytest.fail("php has no amqp extension: install Debian's php-amqp (scripts/install-test-system-packages)",
                    pytrace=False)
    return binary


def command(client: str, name: str, url: str, *extra: str) -> list[str]:
    return [php(), str(SCRIPTS[client]), name, url, *extra]


def scenario(client: str, name: str, url: str, *extra: str) -> dict:
    return run(command(client, name, url, *extra))


both_clients = pytest.mark.parametrize("client", ["amqplib", "ext"])


def test_amqplib_connects_with_amqplain_and_plain_and_reads_the_capabilities(broker):
    report = scenario("amqplib", "connect", broker.url())
    # php-amqplib logs in with AMQPLAIN unless told otherwise.
    assert report["logins"] == {"AMQPLAIN": True, "PLAIN": True}
    assert report["capabilities"] == SERVER_CAPABILITIES
    assert SERVER_PROPERTY_KEYS <= set(report["server_properties"])


def test_ext_connects_with_its_own_channel_max(broker):
    report = scenario("ext", "connect", broker.url())
    # The extension asks for 256 channels at most (PHP_AMQP_MAX_CHANNELS) and takes the frame_max offered.
    assert report == {"ok": True, "channel_max": 256, "frame_max": 131072, "heartbeat": 0, "connected": True}


@both_clients
def test_publisher_confirms_and_the_return_of_an_unroutable_mandatory_publish(broker, client):
    report = scenario(client, "confirms", broker.url())
    assert report["acked"] == (21 if client == "amqplib" else list(range(1, 22)))
    assert report["nacked"] == 0
    assert report["returned"] == {"code": 312, "text": "NO_ROUTE", "body": "unroutable"}
    assert report["return_before_ack"] is True
    assert report["message_count"] == 20


@both_clients
def test_prefetch_holds_the_consumer_at_three_unacked_messages(broker, client):
    report = scenario(client, "prefetch", broker.url())
    assert report["held_before_ack"] == 3
    assert report["bodies"] == [str(i) for i in range(10)]
    assert report["redelivered"] == 0 and report["message_count"] == 0


@both_clients
def test_reject_with_requeue_redelivers_and_without_drops(broker, client):
    report = scenario(client, "reject", broker.url())
    assert report["deliveries"] == [
        {"body": "first", "redelivered": False, "action": "requeued"},
        {"body": "first", "redelivered": True, "action": "acked"},
        {"body": "second", "redelivered": False, "action": "dropped"},
    ]
    assert report["message_count"] == 0


def test_amqplib_channel_errors_raise_with_code_and_text_and_a_new_channel_carries_on(broker):
    report = scenario("amqplib", "channel_error", broker.url())
    assert report["missing_queue"] == {"code": 404, "text": "NOT_FOUND - no queue 'no-such-queue-php' in vhost '/'",
                                       "class_id": 50, "method_id": 10}
    assert report["unknown_tag"] == {"code": 406, "text": "PRECONDITION_FAILED - unknown delivery tag 99",
                                     "class_id": 60, "method_id": 80}
    assert (report["after"], report["connection_open"]) == ("still here", True)


def test_ext_channel_errors_raise_amqp_queue_exception_and_a_new_channel_carries_on(broker):
    report = scenario("ext", "channel_error", broker.url())
    assert report["missing_queue"] == {
        "code": 404, "channel_open": False,
        "message": "Server channel error: 404, message: NOT_FOUND - no queue 'no-such-queue-php-ext' in vhost '/'"}
    assert report["unknown_tag"] == {
        "code": 406, "channel_open": False,
        "message": "Server channel error: 406, message: PRECONDITION_FAILED - unknown delivery tag 99"}
    assert (report["after"], report["connection_open"]) == ("still here", True)


@both_clients
def test_heartbeats_keep_an_idle_connection_open(broker, client):
    report = scenario(client, "heartbeat", broker.url())
    assert report["heartbeat"] == 1
    # Three seconds without a message end in the client's plain timeout, not a missed heartbeat.
    assert report["idle"] == ("timeout" if client == "amqplib" else "Consumer timeout exceed")
    assert report["after"] == "after the idle time"


@both_clients
def test_bodies_larger_than_a_frame(broker, client):
    report = scenario(client, "large", broker.url())
    # php-amqplib takes the broker's frame_max (131072); the extension asks for 4096 here.
    frame_max = 131072 if client == "amqplib" else 4096
    assert report.get("frame_max", frame_max) == frame_max
    assert report["bodies"] == [{"size": frame_max - 8, "intact": True}, {"size": frame_max - 7, "intact": True},
                                {"size": 1048577, "intact": True}]


@both_clients
def test_tls_with_the_peer_and_host_name_verified(controlled_broker, client):
    report = scenario(client, "tls", controlled_broker.amqps_url(), str(controlled_broker.ca_file))
    assert report["body"] == "over tls"


def test_amqplib_block_handler_gets_low_on_memory_and_the_publish_waits_for_the_unblock(controlled_broker):
    controlled_broker.set_memory_alarm()
    try:
        with Running(command("amqplib", "blocked", controlled_broker.url())) as client:
            client.wait_for("blocked")
            during_alarm = client.events_for(0.5)
            controlled_broker.clear_memory_alarm()
            report = client.result()
    finally:
        controlled_broker.clear_memory_alarm()
    assert report["reason"] == "low on memory"
    assert during_alarm == []  # no ack while the alarm lasts
    assert report["order"] == "blocked,unblocked,ack"
    assert report["body"] == "held"


def test_ext_publish_is_held_without_notice_while_the_memory_alarm_lasts(controlled_broker):
    controlled_broker.set_memory_alarm()
    try:
        with Running(command("ext", "blocked", controlled_broker.url())) as client:
            client.wait_for("held")
            controlled_broker.clear_memory_alarm()
            report = client.result()
    finally:
        controlled_broker.clear_memory_alarm()
    # The extension does not announce connection.blocked: no notice, just a confirm that waits.
    assert report["while_alarmed"] == "Wait timeout exceed"
    assert (report["acked"], report["body"]) == (True, "held")


RESTART_DELIVERIES = [{"body": "in flight", "redelivered": True}, {"body": "after the restart", "redelivered": False}]


def test_amqplib_reconnect_after_a_broker_restart_gets_the_unacked_message_again(controlled_broker):
    with Running(command("amqplib", "restart", controlled_broker.url())) as client:
        client.wait_for("consuming")
        controlled_broker.restart()
        report = client.result()
    # php-amqplib answers the broker's connection.close with close-ok, then raises the close; if
    # the broker has closed the socket by then (RabbitMQ does so at once), the write fails first.
    assert report["closed"] in (
        {"class": "AMQPConnectionClosedException", "code": 320, "message": f"{SHUTDOWN_TEXT}(0, 0)"},
        {"class": "AMQPConnectionClosedException", "code": 32, "message": "Broken pipe or closed connection"})
    assert report["deliveries"] == RESTART_DELIVERIES


def test_ext_reconnect_after_a_broker_restart_gets_the_unacked_message_again(controlled_broker):
    with Running(command("ext", "restart", controlled_broker.url())) as client:
        client.wait_for("consuming")
        controlled_broker.restart()
        report = client.result()
    # consume() meets the broker's connection.close on channel 0 and says so in its own words.
    assert report["closed"] == {"class": "AMQPException", "code": 0, "message": "Library error: channel mismatch"}
    assert report["deliveries"] == RESTART_DELIVERIES
