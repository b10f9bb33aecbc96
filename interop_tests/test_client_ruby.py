"""bunny (Debian's ruby-bunny 2.19, Ruby's client) against the broker, its automatic recovery included.

Each scenario is a function of interop_tests/clients/ruby/bunny_scenarios.rb that prints what it
observed as JSON; the assertions live here. The restart, memory-alarm and TLS scenarios use
`controlled_broker` (client_programs.py), which against RabbitMQ needs INTEROP_RABBITMQCTL (and
INTEROP_BROKER_AMQPS_URL and INTEROP_BROKER_CA_FILE for TLS).
"""

from __future__ import annotations

import functools
import subprocess

import pytest

from interop_tests.client_programs import (CLIENTS_DIR, SERVER_CAPABILITIES,
                                           SERVER_PROPERTY_KEYS, Running, require_program, run)
from interop_tests.client_programs import controlled_broker  # noqa: F401  (a fixture)

pytestmark = pytest.mark.timeout(60)

SCRIPT = CLIENTS_DIR / "ruby" / "bunny_scenarios.rb"


@functools.cache
def ruby() -> str:
    """`ruby`, with bunny loadable (checked once)."""
    binary = require_program("ruby", "ruby-bunny")
    if subprocess.run([binary, "-e", 'require "bunny"'], capture_output=True, timeout=30).returncode != 0:
        pytest.fail("ruby cannot load bunny: install Debian's ruby-bunny (scripts/install-test-system-packages)",
                    pytrace=False)
    return binary


def command(name: str, url: str, *extra: str) -> list[str]:
    return [ruby(), str(SCRIPT), name, url, *extra]


def scenario(name: str, url: str, *extra: str) -> dict:
    return run(command(name, url, *extra))


def test_connect_reads_the_server_capabilities_and_tuning(broker):
    report = scenario("connect", broker.url())
    assert report["capabilities"] == SERVER_CAPABILITIES
    assert SERVER_PROPERTY_KEYS <= set(report["server_properties"])
    # bunny takes the server's channel_max and heartbeat (60 s) and keeps its frame_max 131072.
    assert (report["channel_max"], report["frame_max"], report["heartbeat"]) == (2047, 131072, 60)
    assert report["mechanism"] == "PLAIN"


def test_publisher_confirms_and_the_return_of_an_unroutable_mandatory_publish(broker):
    report = scenario("confirms", broker.url())
    assert report["acked"] == list(range(1, 22)) and report["nacked"] == 0
    assert report["all_confirmed"] is True
    assert report["returned"] == {"code": 312, "text": "NO_ROUTE", "body": "unroutable"}
    assert report["return_before_ack"] is True
    assert report["message_count"] == 20


def test_prefetch_holds_the_consumer_at_three_unacked_messages(broker):
    report = scenario("prefetch", broker.url())
    assert report["held_before_ack"] == 3
    assert report["bodies"] == [str(i) for i in range(10)]
    assert report["redelivered"] == 0 and report["message_count"] == 0


def test_reject_with_requeue_redelivers_and_without_drops(broker):
    report = scenario("reject", broker.url())
    assert report["deliveries"] == [
        {"body": "first", "redelivered": False, "action": "requeued"},
        {"body": "first", "redelivered": True, "action": "acked"},
        {"body": "second", "redelivered": False, "action": "dropped"},
    ]
    assert report["message_count"] == 0


def test_channel_errors_raise_or_reach_on_error_and_a_new_channel_carries_on(broker):
    report = scenario("channel_error", broker.url())
    assert report["missing_queue"] == {"class": "Bunny::NotFound", "code": 404, "class_id": 50, "method_id": 10,
                                       "text": "NOT_FOUND - no queue 'no-such-queue-ruby' in vhost '/'"}
    # An ack has no reply: bunny hands the channel.close that follows it to the channel's on_error.
    assert report["unknown_tag"] == {"code": 406, "text": "PRECONDITION_FAILED - unknown delivery tag 99",
                                     "class_id": 60, "method_id": 80, "channel_open": False}
    assert (report["after"], report["connection_open"]) == ("still here", True)


def test_heartbeats_keep_an_idle_connection_open(broker):
    report = scenario("heartbeat", broker.url())
    assert report == {"ok": True, "heartbeat": 1, "open_after_idle": True, "after": "after the idle time"}


def test_bodies_larger_than_a_frame_with_frame_max_4096(broker):
    report = scenario("large", broker.url())
    assert report["frame_max"] == 4096
    assert report["bodies"] == [{"size": 4088, "intact": True}, {"size": 4089, "intact": True},
                                {"size": 1048577, "intact": True}]


def test_tls_with_the_peer_verified(controlled_broker):
    report = scenario("tls", controlled_broker.amqps_url(), str(controlled_broker.ca_file))
    assert report["body"] == "over tls"


def test_on_blocked_gets_low_on_memory_and_the_publish_waits_for_on_unblocked(controlled_broker):
    controlled_broker.set_memory_alarm()
    try:
        with Running(command("blocked", controlled_broker.url())) as client:
            client.wait_for("blocked")
            during_alarm = client.events_for(0.5)
            controlled_broker.clear_memory_alarm()
            report = client.result()
    finally:
        controlled_broker.clear_memory_alarm()
    assert report["reason"] == "low on memory"
    assert during_alarm == []  # no ack while the alarm lasts
    assert report["order"] == "blocked,unblocked,ack"
    assert (report["confirmed"], report["body"]) == (True, "held")


def test_automatic_recovery_after_a_broker_restart_consumes_again(controlled_broker):
    with Running(command("restart", controlled_broker.url())) as client:
        client.wait_for("consuming")
        controlled_broker.restart()
        report = client.result()
    assert report["recovery"] == ["attempt", "completed"]
    # The recovered consumer gets the message it held unacked again, then a new one.
    assert report["deliveries"] == [{"body": "in flight", "redelivered": False},
                                    {"body": "in flight", "redelivered": True},
                                    {"body": "after the restart", "redelivered": False}]
    # A server-named queue is declared again under a new name, bound again, and consumed from again.
    assert report["server_named"] == {"renamed": True, "prefix": "amq.gen-", "received": "fanned out after the restart"}
