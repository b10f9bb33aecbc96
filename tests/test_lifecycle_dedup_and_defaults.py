"""Deduplication cache rules, and [[queue_defaults]] from the configuration file."""

from __future__ import annotations

import pytest
from pamqp import commands

from amqp_server.config.settings import ConfigError, load_config
from amqp_server.broker.vhost import VirtualHost
from queues.arguments.queue_defaults import defaults_for
from queues.deduplication import DeduplicationCache
from queues.message import Message, content_header
from queues.publish_outcome import DUPLICATE, ENQUEUED, REJECTED
from queues.queue import Queue


def message(body: bytes = b"m", **properties) -> Message:
    return Message("", "q", content_header(len(body), commands.Basic.Properties(**properties).marshal()), body)


def dedup_queue(**arguments) -> Queue:
    return Queue("q", "/", arguments={"x-message-deduplication": True, **arguments})


def test_a_repeated_message_id_is_not_enqueued_again():
    queue = dedup_queue()
    assert queue.publish(message(message_id="a")) == ENQUEUED
    assert queue.publish(message(message_id="a")) == DUPLICATE
    assert queue.publish(message(message_id="b")) == ENQUEUED
    assert queue.message_count == 2


def test_messages_without_an_id_are_never_duplicates():
    queue = dedup_queue()
    assert [queue.publish(message()) for _ in range(2)] == [ENQUEUED, ENQUEUED]


def test_the_plugins_header_comes_before_message_id():
    queue = dedup_queue()
    queue.publish(message(message_id="x", headers={"x-deduplication-header": "k1"}))
    assert queue.publish(message(message_id="y", headers={"x-deduplication-header": "k1"})) == DUPLICATE


def test_a_named_header_is_the_only_key_when_the_queue_names_one():
    queue = dedup_queue(**{"x-deduplication-header": "order"})
    queue.publish(message(message_id="same", headers={"order": 1}))
    assert queue.publish(message(message_id="same", headers={"order": 2})) == ENQUEUED
    assert queue.publish(message(headers={"order": 1})) == DUPLICATE


def test_ids_are_forgotten_after_the_cache_ttl():
    queue = dedup_queue(**{"x-cache-ttl": 1000})
    first = message(message_id="a")
    queue.publish(first)
    again = message(message_id="a")
    again.published_at = first.published_at + 0.5
    assert queue.publish(again) == DUPLICATE
    later = message(message_id="a")
    later.published_at = first.published_at + 1.5
    assert queue.publish(later) == ENQUEUED


def test_the_oldest_id_is_evicted_when_the_cache_is_full():
    cache = DeduplicationCache(size=2)
    for key in ("a", "b", "c"):
        cache.remember(key, message(), 0.0)
    assert (cache.is_duplicate("a", 0.0), cache.is_duplicate("c", 0.0), len(cache)) == (False, True, 2)


def test_a_message_rejected_by_a_full_queue_is_not_remembered():
    queue = dedup_queue(**{"x-max-length": 1, "x-overflow": "reject-publish"})
    queue.publish(message(message_id="a"))
    assert queue.publish(message(message_id="b")) == REJECTED
    queue.purge()
    assert queue.publish(message(message_id="b")) == ENQUEUED


# -- [[queue_defaults]] -------------------------------------------------------------------


def config_with(tmp_path, text: str):
    path = tmp_path / "broker.toml"
    path.write_text(text)
    return load_config(["--config", str(path)], environ={})


def test_queue_defaults_apply_by_vhost_and_pattern_later_entries_winning(tmp_path):
    config = config_with(tmp_path, """
[[queue_defaults]]
consumer_timeout = 1800000

[[queue_defaults]]
vhost = "/"
pattern = "^jobs\\\\."
delayed_retry_type = "failed"
delayed_retry_min = 500
delayed_retry_max = 8000
delayed_retry_backoff = "exponential"
delivery_limit = 4
""")
    entries = config.queue_defaults
    assert defaults_for(entries, "/", "jobs.email") == {
        "x-consumer-timeout": 1800000, "x-delayed-retry-type": "failed", "x-delayed-retry-min": 500,
        "x-delayed-retry-max": 8000, "x-delayed-retry-backoff": "exponential", "x-delivery-limit": 4,
    }
    assert defaults_for(entries, "other", "jobs.email") == {"x-consumer-timeout": 1800000}
    assert defaults_for(entries, "/", "events") == {"x-consumer-timeout": 1800000}


def test_a_queues_own_arguments_win_over_the_defaults(tmp_path):
    config = config_with(tmp_path, '[[queue_defaults]]\ndelivery_limit = 4\ndelayed_retry_type = "all"\n')
    vhost = VirtualHost("/")
    vhost.queue_defaults = config.queue_defaults
    queue, _ = vhost.declare_queue("q", connection=None, arguments={"x-delivery-limit": 9})
    assert (queue.settings.delivery_limit, queue.settings.retry_type) == (9, "all")
    assert queue.arguments == {"x-delivery-limit": 9}  # defaults are not written into its definition


@pytest.mark.parametrize(("text", "message"), [
    ('[[queue_defaults]]\nretry = 1\n', "queue_defaults[0] has unknown key 'retry'"),
    ('[[queue_defaults]]\ndelayed_retry_type = "sometimes"\n', "queue_defaults[0] delayed_retry_type is invalid"),
    ('[[queue_defaults]]\npattern = "("\n', "queue_defaults[0] pattern is not a valid regular expression"),
    ('[[queue_defaults]]\ndelivery_limit = -1\n', "queue_defaults[0] delivery_limit is invalid"),
])
def test_invalid_queue_defaults_stop_the_broker_with_a_message_naming_the_key(tmp_path, text, message):
    with pytest.raises(ConfigError) as caught:
        config_with(tmp_path, text)
    assert message in str(caught.value)
