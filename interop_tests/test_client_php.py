"""PHP's two clients against the broker: php-amqplib (Debian's php-amqplib 3.5, pure PHP) and
the php-amqp extension (Debian's php-amqp 1.11, AMQPConnection on rabbitmq-c).

Each scenario is a function of interop_tests/clients/php/amqplib_scenarios.php or
ext_scenarios.php that prints what it observed as JSON; the assertions live here and, for what
every client observes alike, in client_expectations.py. The alarm, restart and TLS tests use
`controlled_broker`, which against RabbitMQ (INTEROP_BROKER_URL) needs INTEROP_RABBITMQCTL, and
INTEROP_BROKER_AMQPS_URL and INTEROP_BROKER_CA_FILE for TLS (interop_tests/README.md).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from interop_tests.client_expectations import (REDELIVERED_AFTER_RESTART, SERVER_PROPERTY_KEYS, SHUTDOWN_TEXT,
                                               UNKNOWN_DELIVERY_TAG, drive_memory_alarm, drive_restart,
                                               expect_blocked_then_unblocked, expect_confirms, expect_heartbeats,
                                               expect_large_message, expect_prefetch, expect_reject_requeue,
                                               expect_server_capabilities, not_found)
from interop_tests.scenario_programs import CLIENTS_DIR, ScenarioProgram, require_files, require_program

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="session")
def php() -> str:
    """`php`, with php-amqplib and the amqp extension there (checked once)."""
    binary = require_program("php", "php-cli")
    require_files("the PHP client's tests (Debian: php-amqplib)", Path("/usr/share/php/PhpAmqpLib/autoload.php"))
    modules = subprocess.run([binary, "-m"], capture_output=True, text=True, timeout=30).stdout.split()
    if "amqp" not in modules:
        pytest.fail("php has no amqp extension: install Debian's php-amqp (scripts/install-test-system-packages)",
                    pytrace=False)
    return binary


@pytest.fixture(scope="session")
def amqplib(php: str) -> ScenarioProgram:
    return ScenarioProgram("php-amqplib", (php, str(CLIENTS_DIR / "php" / "amqplib_scenarios.php")))


@pytest.fixture(scope="session")
def ext(php: str) -> ScenarioProgram:
    return ScenarioProgram("php-amqp", (php, str(CLIENTS_DIR / "php" / "ext_scenarios.php")))


@pytest.fixture(params=["amqplib", "ext"])
def client(request: pytest.FixtureRequest) -> ScenarioProgram:
    """Each of the two clients in turn (`client.label` says which)."""
    return request.getfixturevalue(request.param)


def test_amqplib_connects_with_amqplain_and_plain_and_reads_the_capabilities(broker, amqplib):
    report = amqplib.run("connect", broker.url())
    # php-amqplib logs in with AMQPLAIN unless told otherwise.
    assert report["logins"] == {"AMQPLAIN": True, "PLAIN": True}
    expect_server_capabilities(report["capabilities"])
    assert SERVER_PROPERTY_KEYS <= set(report["server_properties"])


def test_ext_connects_with_its_own_channel_max(broker, ext):
    report = ext.run("connect", broker.url())
    # The extension asks for 256 channels at most (PHP_AMQP_MAX_CHANNELS) and takes the frame_max offered.
    assert report == {"ok": True, "channel_max": 256, "frame_max": 131072, "heartbeat": 0, "connected": True}


def test_publisher_confirms_and_the_return_of_an_unroutable_mandatory_publish(broker, client):
    report = client.run("confirms", broker.url())
    returned = report["returned"]
    expect_confirms(report["acked"], report["nacked"], (returned["code"], returned["text"], returned["body"]),
                    report["return_before_ack"], report["message_count"])


def test_prefetch_holds_the_consumer_at_its_limit(broker, client):
    report = client.run("prefetch", broker.url())
    expect_prefetch(report["held_before_ack"], report["bodies"], report["message_count"])
    assert report["redelivered"] == 0


def test_reject_with_requeue_redelivers_the_message_first(broker, client):
    report = client.run("reject_requeue", broker.url())
    expect_reject_requeue(report["deliveries"], report["message_count"])


def test_amqplib_channel_errors_raise_with_code_and_text_and_a_new_channel_carries_on(broker, amqplib):
    report = amqplib.run("channel_error", broker.url())
    assert report["missing_queue"] == {"code": 404, "text": not_found("no-such-queue-php"), "class_id": 50,
                                       "method_id": 10}
    assert report["unknown_tag"] == {"code": 406, "text": UNKNOWN_DELIVERY_TAG, "class_id": 60, "method_id": 80}
    assert (report["after"], report["connection_open"]) == ("still here", True)


def test_ext_channel_errors_raise_amqp_queue_exception_and_a_new_channel_carries_on(broker, ext):
    report = ext.run("channel_error", broker.url())
    assert report["missing_queue"] == {
        "code": 404, "channel_open": False,
        "message": f"Server channel error: 404, message: {not_found('no-such-queue-php-ext')}"}
    assert report["unknown_tag"] == {
        "code": 406, "channel_open": False, "message": f"Server channel error: 406, message: {UNKNOWN_DELIVERY_TAG}"}
    assert (report["after"], report["connection_open"]) == ("still here", True)


def test_heartbeats_keep_an_idle_connection_open(broker, client):
    report = client.run("heartbeats", broker.url())
    # Three seconds without a message end in the client's plain timeout, not a missed heartbeat.
    assert report["idle"] == ("timeout" if client.label == "php-amqplib" else "Consumer timeout exceed")
    expect_heartbeats(report["heartbeat"], report["after"])


def test_amqplib_bodies_larger_than_a_frame(broker, amqplib):
    report = amqplib.run("large_message", broker.url())
    # php-amqplib cannot ask for a frame_max: it takes the broker's, 131072.
    expect_large_message(report["frame_max"], report["bodies"], asked=131072)


def test_ext_bodies_larger_than_a_frame_with_frame_max_4096(broker, ext):
    report = ext.run("large_message", broker.url())
    expect_large_message(report["frame_max"], report["bodies"])


def test_tls_with_the_peer_and_host_name_verified(controlled_broker, client):
    report = client.run("tls", controlled_broker.amqps_url(), str(controlled_broker.ca_file))
    assert report["body"] == "over tls"


def test_amqplib_block_handler_gets_low_on_memory_and_the_publish_waits_for_the_unblock(controlled_broker, amqplib):
    report = drive_memory_alarm(amqplib, controlled_broker)
    expect_blocked_then_unblocked(report["reason"], report["while_blocked"], report["order"], report["body"])


def test_ext_publish_is_held_without_notice_while_the_memory_alarm_lasts(controlled_broker, ext):
    report = drive_memory_alarm(ext, controlled_broker)
    # The extension does not announce connection.blocked: no notice, just a confirm that waits.
    assert report["while_alarmed"] == "Wait timeout exceed"
    assert (report["acked"], report["body"]) == (True, "held")


def test_amqplib_reconnect_after_a_broker_restart_gets_the_unacked_message_again(controlled_broker, amqplib):
    report = drive_restart(amqplib, controlled_broker)
    # php-amqplib answers the broker's connection.close with close-ok, then raises the close; if
    # the broker has closed the socket by then (RabbitMQ does so at once), the write fails first.
    assert report["closed"] in (
        {"class": "AMQPConnectionClosedException", "code": 320, "message": f"{SHUTDOWN_TEXT}(0, 0)"},
        {"class": "AMQPConnectionClosedException", "code": 32, "message": "Broken pipe or closed connection"})
    assert report["deliveries"] == REDELIVERED_AFTER_RESTART


def test_ext_reconnect_after_a_broker_restart_gets_the_unacked_message_again(controlled_broker, ext):
    report = drive_restart(ext, controlled_broker)
    # consume() meets the broker's connection.close on channel 0 and says so in its own words.
    assert report["closed"] == {"class": "AMQPException", "code": 0, "message": "Library error: channel mismatch"}
    assert report["deliveries"] == REDELIVERED_AFTER_RESTART
