"""Policies take effect on queues and exchanges that already exist, in place, without losing messages."""

from __future__ import annotations

import struct

from amqp_server.broker.policies import parse_policy
from amqp_server.broker.vhost import VirtualHost
from queues.delays.delayed_retry import FAILED
from queues.message import Message
from queues.timers import Timers
from tests.test_lifecycle_dedup_and_defaults import message as with_properties
from tests.test_queue_expires import Clock


def setup() -> tuple[VirtualHost, Timers, Clock]:
    clock = Clock()
    timers = Timers(clock=clock)
    return VirtualHost("/", timers=timers), timers, clock


def message(body: bytes, published_at: float) -> Message:
    made = Message("", "q", struct.pack(">HHQH", 60, 0, len(body), 0), body)
    made.published_at = published_at
    return made


def policy(name: str, definition: dict, pattern: str = ".*", priority: int = 0, apply_to: str = "all",
           operator: bool = False):
    return parse_policy("/", name, {"pattern": pattern, "definition": definition, "priority": priority,
                                    "apply-to": apply_to}, operator)


def ready_bodies(vhost: VirtualHost, name: str) -> list[bytes]:
    queue = vhost.queues[name]
    return [entry.message.body for entry in queue.ready.peek(len(queue.ready))]


def test_a_lowered_max_length_trims_the_oldest_at_once():
    vhost, _timers, clock = setup()
    queue, _ = vhost.declare_queue("q", connection=None)
    for n in range(5):
        queue.publish(message(b"m%d" % n, clock.now))
    vhost.set_policy(policy("cap", {"max-length": 2}))
    assert ready_bodies(vhost, "q") == [b"m3", b"m4"]
    vhost.clear_policy("cap")
    queue.publish(message(b"m5", clock.now))
    assert len(queue.ready) == 3


def test_a_new_message_ttl_expires_messages_already_past_it_and_dead_letters_them():
    vhost, timers, clock = setup()
    queue, _ = vhost.declare_queue("q", connection=None)
    dead, _ = vhost.declare_queue("dead", connection=None)
    vhost.declare_exchange("dlx", "fanout")
    vhost.bind(vhost.exchanges["dlx"], dead, "", {})
    queue.publish(message(b"old", clock.now - 5))
    queue.publish(message(b"new", clock.now))
    vhost.set_policy(policy("ttl", {"message-ttl": 2000, "dead-letter-exchange": "dlx"}, pattern="^q$"))
    assert ready_bodies(vhost, "q") == [b"new"]
    assert ready_bodies(vhost, "dead") == [b"old"]
    clock.now += 2.5
    timers.run_due(clock.now)
    assert ready_bodies(vhost, "q") == []


def test_clearing_a_message_ttl_keeps_the_messages():
    vhost, timers, clock = setup()
    vhost.set_policy(policy("ttl", {"message-ttl": 1000}))
    queue, _ = vhost.declare_queue("q", connection=None)
    queue.publish(message(b"kept", clock.now))
    vhost.clear_policy("ttl")
    clock.now += 5
    timers.run_due(clock.now)
    assert ready_bodies(vhost, "q") == [b"kept"]


def test_the_queues_own_arguments_win_except_for_limits_where_the_lower_wins():
    vhost, _timers, _clock = setup()
    own, _ = vhost.declare_queue("own", connection=None, arguments={"x-max-length": 10, "x-dead-letter-exchange": "a"})
    vhost.set_policy(policy("p", {"max-length": 3, "dead-letter-exchange": "b", "message-ttl": 60000}))
    assert (own.settings.max_length, own.settings.dead_letter_exchange, own.settings.message_ttl_ms) == (3, "a", 60000)
    vhost.set_policy(policy("p", {"max-length": 30}))
    assert (own.settings.max_length, own.settings.message_ttl_ms) == (10, None)


def test_priority_decides_and_operator_policies_cap():
    vhost, _timers, _clock = setup()
    queue, _ = vhost.declare_queue("jobs", connection=None)
    vhost.set_policy(policy("broad", {"max-length": 100}))
    vhost.set_policy(policy("narrow", {"max-length": 50}, pattern="^jobs$", priority=5))
    assert queue.settings.max_length == 50
    vhost.set_policy(policy("cap", {"max-length": 7}, operator=True), operator=True)
    assert queue.settings.max_length == 7
    vhost.clear_policy("narrow")
    assert queue.settings.max_length == 7
    vhost.clear_policy("cap", operator=True)
    assert queue.settings.max_length == 100


def test_a_new_queue_starts_under_the_policy_in_force():
    vhost, _timers, _clock = setup()
    vhost.set_policy(policy("retry", {"delayed-retry-type": "failed", "delayed-retry-min": 500, "delivery-limit": 4}))
    queue, _ = vhost.declare_queue("work", connection=None)
    assert (queue.settings.retry_type, queue.settings.retry_min_ms, queue.settings.delivery_limit) == ("failed", 500, 4)


def test_a_policy_value_that_cannot_combine_with_the_queues_own_is_left_out():
    vhost, _timers, _clock = setup()
    queue, _ = vhost.declare_queue("q", connection=None, arguments={"x-delayed-retry-min": 5000})
    vhost.set_policy(policy("p", {"delayed-retry-max": 100, "max-length": 3}))
    assert (queue.settings.retry_max_ms, queue.settings.max_length, queue.settings.retry_min_ms) == (None, 3, 5000)


def test_messages_waiting_for_a_delayed_retry_keep_their_schedule():
    vhost, timers, clock = setup()
    vhost.set_policy(policy("retry", {"delayed-retry-type": "failed", "delayed-retry-min": 1000}))
    queue, _ = vhost.declare_queue("q", connection=None)
    queue.publish(message(b"m", clock.now))
    entry = queue.get(no_ack=False)
    queue.after_get(entry)
    queue.requeue([(entry, None)], FAILED)
    assert queue.waiting_count == 1
    vhost.set_policy(policy("retry", {"delayed-retry-type": "failed", "delayed-retry-min": 60000, "max-length": 5}))
    clock.now += 1.1
    timers.run_due(clock.now)
    assert (queue.waiting_count, len(queue.ready)) == (0, 1)


def test_a_policys_alternate_exchange_applies_unless_the_exchange_names_its_own():
    vhost, _timers, _clock = setup()
    plain = vhost.declare_exchange("plain", "direct")
    own = vhost.declare_exchange("own", "direct", arguments={"alternate-exchange": "mine"})
    vhost.set_policy(policy("ae", {"alternate-exchange": "unrouted"}, apply_to="exchanges"))
    assert (plain.alternate_exchange, own.alternate_exchange) == ("unrouted", "mine")
    later = vhost.declare_exchange("later", "fanout")
    assert later.alternate_exchange == "unrouted"
    vhost.clear_policy("ae")
    assert plain.alternate_exchange is None


def test_a_new_x_expires_deletes_an_idle_queue():
    vhost, timers, clock = setup()
    vhost.declare_queue("idle", connection=None)
    vhost.set_policy(policy("expire", {"expires": 1000}))
    clock.now += 1.5
    timers.run_due(clock.now)
    assert "idle" not in vhost.queues


def test_queues_of_another_type_or_name_are_untouched():
    vhost, _timers, _clock = setup()
    classic, _ = vhost.declare_queue("c", connection=None)
    quorum, _ = vhost.declare_queue("qq", connection=None, durable=True, arguments={"x-queue-type": "quorum"})
    vhost.set_policy(policy("quorum-only", {"max-length": 1}, apply_to="quorum_queues"))
    assert (classic.settings.max_length, quorum.settings.max_length) == (None, 1)


def test_a_policy_minimum_above_the_queues_own_maximum_is_left_out():
    vhost, _timers, _clock = setup()
    queue, _ = vhost.declare_queue("q", connection=None, arguments={"x-delayed-retry-max": 2000})
    vhost.set_policy(policy("p", {"delayed-retry-min": 5000, "max-length": 3}))
    assert (queue.settings.retry_min_ms, queue.settings.retry_max_ms, queue.settings.max_length) == (1000, 2000, 3)


def test_deduplication_and_consumer_timeout_come_and_go_with_a_policy():
    vhost, _timers, clock = setup()
    queue, _ = vhost.declare_queue("q", connection=None)
    vhost.set_policy(policy("dedup", {"message-deduplication": True, "consumer-timeout": 5000}))
    assert queue.settings.consumer_timeout_ms == 5000
    first, again = with_properties(b"a", message_id="id-1"), with_properties(b"a", message_id="id-1")
    queue.publish(first)
    queue.publish(again)
    assert len(queue.ready) == 1, "the second copy was a duplicate"
    vhost.clear_policy("dedup")
    queue.publish(again)
    assert len(queue.ready) == 2 and queue.settings.consumer_timeout_ms is None


def test_a_policys_archive_switches_the_queues_segment_archive(tmp_path):
    from amqp_server.broker.broker import Broker
    from amqp_server.config.settings import ServerConfig

    broker = Broker(ServerConfig(), message_dir=tmp_path)
    vhost = broker.vhosts["/"]
    queue, _ = vhost.declare_queue("kept", connection=None, durable=True)
    assert not queue.journal.store.archive
    vhost.set_policy(policy("archive", {"archive": True}))
    assert queue.journal.store.archive
    vhost.clear_policy("archive")
    assert not queue.journal.store.archive


def test_a_policy_with_a_key_the_queue_type_does_not_take_is_passed_by():
    vhost, _timers, _clock = setup()
    classic, _ = vhost.declare_queue("c", connection=None)
    quorum, _ = vhost.declare_queue("qq", connection=None, durable=True, arguments={"x-queue-type": "quorum"})
    vhost.set_policy(policy("fallback", {"max-length": 3}))
    vhost.set_policy(policy("lazy", {"queue-mode": "lazy", "max-length": 1}, priority=5))
    assert (classic.settings.max_length, quorum.settings.max_length) == (1, 3)
    vhost.set_policy(policy("lazy", {"dead-letter-strategy": "at-least-once", "max-length": 1}, priority=5))
    assert (classic.settings.max_length, quorum.settings.max_length) == (3, 1)


def test_a_quorum_queue_takes_the_policys_overflow_a_classic_queue_keeps_its_own():
    vhost, _timers, _clock = setup()
    own = {"x-overflow": "reject-publish"}
    classic, _ = vhost.declare_queue("c", connection=None, durable=True, arguments=own)
    quorum, _ = vhost.declare_queue("qq", connection=None, durable=True, arguments={**own, "x-queue-type": "quorum"})
    vhost.set_policy(policy("ovf", {"overflow": "drop-head", "max-length": 1}))
    assert (classic.settings.overflow, quorum.settings.overflow) == ("reject-publish", "drop-head")


def test_a_policys_delayed_retry_backoff_and_maximum_reach_the_queue():
    vhost, _timers, _clock = setup()
    queue, _ = vhost.declare_queue("q", connection=None)
    vhost.set_policy(policy("retry", {"delayed-retry-type": "all", "delayed-retry-min": 100,
                                      "delayed-retry-max": 800, "delayed-retry-backoff": "exponential"}))
    assert (queue.settings.retry_type, queue.settings.retry_min_ms, queue.settings.retry_max_ms,
            queue.settings.retry_backoff) == ("all", 100, 800, "exponential")
    vhost.clear_policy("retry")
    assert (queue.settings.retry_max_ms, queue.settings.retry_backoff) == (None, "linear")
