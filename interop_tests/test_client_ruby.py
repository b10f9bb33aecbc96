"""bunny (Debian's ruby-bunny 2.19, Ruby's client) against the broker, its automatic recovery included.

Each scenario is a function of interop_tests/clients/ruby/bunny_scenarios.rb that prints what it
observed as JSON; the assertions live here and, for what every client observes alike, in
client_expectations.py. The alarm, restart and TLS tests use `controlled_broker`, which against
RabbitMQ (INTEROP_BROKER_URL) needs INTEROP_RABBITMQCTL, and INTEROP_BROKER_AMQPS_URL and
INTEROP_BROKER_CA_FILE for TLS (interop_tests/README.md).
"""

from __future__ import annotations

import subprocess

import pytest

from interop_tests.client_expectations import (REDELIVERED_AFTER_RESTART, SERVER_PROPERTY_KEYS,
                                               UNKNOWN_DELIVERY_TAG, drive_memory_alarm, drive_restart,
                                               expect_blocked_then_unblocked, expect_confirms, expect_heartbeats,
                                               expect_large_message, expect_prefetch, expect_reject_requeue,
                                               expect_server_capabilities, not_found)
from interop_tests.scenario_programs import CLIENTS_DIR, ScenarioProgram, require_program

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="session")
def bunny() -> ScenarioProgram:
    """`ruby bunny_scenarios.rb`, with bunny loadable (checked once)."""
    ruby = require_program("ruby", "ruby-bunny")
    if subprocess.run([ruby, "-e", 'require "bunny"'], capture_output=True, timeout=30).returncode != 0:
        pytest.fail("ruby cannot load bunny: install Debian's ruby-bunny (scripts/install-test-system-packages)",
                    pytrace=False)
    return ScenarioProgram("ruby", (ruby, str(CLIENTS_DIR / "ruby" / "bunny_scenarios.rb")))


def test_connect_reads_the_server_capabilities_and_tuning(broker, bunny):
    report = bunny.run("connect", broker.url())
    expect_server_capabilities(report["capabilities"])
    assert SERVER_PROPERTY_KEYS <= set(report["server_properties"])
    # bunny takes the server's channel_max and heartbeat (60 s) and keeps its frame_max 131072.
    assert (report["channel_max"], report["frame_max"], report["heartbeat"]) == (2047, 131072, 60)
    assert report["mechanism"] == "PLAIN"


def test_publisher_confirms_and_the_return_of_an_unroutable_mandatory_publish(broker, bunny):
    report = bunny.run("confirms", broker.url())
    assert report["all_confirmed"] is True
    returned = report["returned"]
    expect_confirms(report["acked"], report["nacked"], (returned["code"], returned["text"], returned["body"]),
                    report["return_before_ack"], report["message_count"])


def test_prefetch_holds_the_consumer_at_its_limit(broker, bunny):
    report = bunny.run("prefetch", broker.url())
    expect_prefetch(report["held_before_ack"], report["bodies"], report["message_count"])
    assert report["redelivered"] == 0


def test_reject_with_requeue_redelivers_the_message_first(broker, bunny):
    report = bunny.run("reject_requeue", broker.url())
    expect_reject_requeue(report["deliveries"], report["message_count"])


def test_channel_errors_raise_or_reach_on_error_and_a_new_channel_carries_on(broker, bunny):
    report = bunny.run("channel_error", broker.url())
    assert report["missing_queue"] == {"class": "Bunny::NotFound", "code": 404, "class_id": 50, "method_id": 10,
                                       "text": not_found("no-such-queue-ruby")}
    # An ack has no reply: bunny hands the channel.close that follows it to the channel's on_error.
    assert report["unknown_tag"] == {"code": 406, "text": UNKNOWN_DELIVERY_TAG, "class_id": 60, "method_id": 80,
                                     "channel_open": False}
    assert (report["after"], report["connection_open"]) == ("still here", True)


def test_heartbeats_keep_an_idle_connection_open(broker, bunny):
    report = bunny.run("heartbeats", broker.url())
    assert set(report) == {"ok", "heartbeat", "open_after_idle", "after"}
    assert report["open_after_idle"] is True
    expect_heartbeats(report["heartbeat"], report["after"])


def test_bodies_larger_than_a_frame_with_frame_max_4096(broker, bunny):
    report = bunny.run("large_message", broker.url())
    expect_large_message(report["frame_max"], report["bodies"])


def test_tls_with_the_peer_verified(controlled_broker, bunny):
    report = bunny.run("tls", controlled_broker.amqps_url(), str(controlled_broker.ca_file))
    assert report["body"] == "over tls"


def test_on_blocked_gets_low_on_memory_and_the_publish_waits_for_on_unblocked(controlled_broker, bunny):
    report = drive_memory_alarm(bunny, controlled_broker)
    expect_blocked_then_unblocked(report["reason"], report["while_blocked"], report["order"], report["body"])
    assert report["confirmed"] is True


def test_automatic_recovery_after_a_broker_restart_consumes_again(controlled_broker, bunny):
    report = drive_restart(bunny, controlled_broker)
    assert report["recovery"] == ["attempt", "completed"]
    # The recovered consumer gets the message it held unacked again, then a new one.
    assert report["deliveries"] == [{"body": "in flight", "redelivered": False}, *REDELIVERED_AFTER_RESTART]
    # A server-named queue is declared again under a new name, bound again, and consumed from again.
    assert report["server_named"] == {"renamed": True, "prefix": "amq.gen-", "received": "fanned out after the restart"}
