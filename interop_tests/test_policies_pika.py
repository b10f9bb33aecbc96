"""Policies and operator policies change queues and exchanges that already exist, seen from pika.

Set over the management API while a pika client holds the queues: each key takes effect within
a second, in place (the same queue, its consumers and messages kept). Checked against RabbitMQ
3.10 with INTEROP_BROKER_URL (and INTEROP_MANAGEMENT_URL); tests of this broker's own
behaviour say so and are skipped there (the archive test always starts a broker of its own).
"""

from __future__ import annotations


import pika
import pytest
from pika.exceptions import NackError

from interop_tests.broker_process import free_port
from interop_tests.management_helpers import Management, api, managed  # noqa: F401 (fixtures)
from interop_tests.pika_helpers import drain, publish_confirmed, ready_count
from interop_tests.test_storage_archive import BODY, COUNT, publish_and_drain, segment_bytes
from interop_tests.waiting import poll

LIVE_S = 1.0  # the bound for a policy change to reach an existing queue
# How long /api/queues may take to show it: RabbitMQ's management statistics lag up to about
# 5 s (this broker answers with current values).
SHOWN_S = 10.0


@pytest.fixture
def channel(managed):
    connection = pika.BlockingConnection(pika.URLParameters(managed[0].url()))
    yield connection.channel()
    if connection.is_open:
        connection.close()


def own_broker_only(managed) -> None:
    if managed[0].is_external:
        pytest.skip("this broker's own behaviour")


def test_a_lowered_max_length_trims_an_existing_queue_at_once(api, channel, unique):
    queue = unique("pol-maxlen")
    channel.queue_declare(queue)
    publish_confirmed(channel.connection, queue, [b"m1", b"m2", b"m3", b"m4", b"m5"])
    api.set_policy(queue, f"^{queue}$", {"max-length": 2}, apply_to="queues")
    assert poll(lambda: ready_count(channel, queue) == 2, LIVE_S)
    assert drain(channel, queue) == [b"m4", b"m5"]
    assert poll(lambda: api.queue(queue).get("policy") == queue, SHOWN_S)


def test_max_length_bytes_and_reject_publish_nack_the_next_publish(api, channel, unique):
    queue = unique("pol-bytes")
    channel.queue_declare(queue)
    api.set_policy(queue, f"^{queue}$", {"max-length-bytes": 10, "overflow": "reject-publish"}, apply_to="queues")
    poll(lambda: api.queue(queue).get("policy") == queue, SHOWN_S)
    channel.confirm_delivery()
    channel.basic_publish("", queue, b"0123456789")
    with pytest.raises(NackError):
        channel.basic_publish("", queue, b"x")
    assert ready_count(channel, queue) == 1


def test_a_new_dead_letter_exchange_receives_the_next_dead_letter(api, channel, unique):
    queue, dlx, dead = unique("pol-work"), unique("pol-dlx"), unique("pol-dead")
    channel.exchange_declare(dlx, "fanout", auto_delete=True)
    channel.queue_declare(dead, auto_delete=True)
    channel.queue_bind(dead, dlx)
    channel.queue_declare(queue)
    publish_confirmed(channel.connection, queue, [b"before", b"after"])
    method, _, _ = channel.basic_get(queue)
    channel.basic_reject(method.delivery_tag, requeue=False)  # no dead-letter exchange yet: dropped
    api.set_policy(queue, f"^{queue}$", {"dead-letter-exchange": dlx}, apply_to="queues")
    poll(lambda: api.queue(queue).get("effective_policy_definition"), SHOWN_S)
    method, _, body = channel.basic_get(queue)
    assert body == b"after"
    channel.basic_reject(method.delivery_tag, requeue=False)
    assert poll(lambda: ready_count(channel, dead) == 1, LIVE_S)
    assert drain(channel, dead) == [b"after"]


def test_a_new_expires_deletes_an_existing_idle_queue(api, channel, unique):
    queue = unique("pol-expires")
    channel.queue_declare(queue)
    api.set_policy(queue, f"^{queue}$", {"expires": 300}, apply_to="queues")
    assert poll(lambda: api.request("GET", f"/api/queues/%2F/{queue}").status_code == 404, 3.0)


def test_the_highest_priority_applies_and_arguments_win_or_the_lower_limit_does(api, channel, unique):
    queue, dlx = unique("pol-prec"), unique("pol-own-dlx")
    channel.exchange_declare(dlx, "fanout", auto_delete=True)
    channel.queue_declare(queue, arguments={"x-max-length": 4, "x-dead-letter-exchange": dlx})
    api.set_policy(queue + "-low", f"^{queue}", {"max-length": 1}, priority=0, apply_to="queues")
    api.set_policy(queue + "-high", f"^{queue}$", {"max-length": 3, "dead-letter-exchange": "elsewhere"},
                   priority=5, apply_to="queues")
    assert poll(lambda: api.queue(queue).get("policy") == queue + "-high", SHOWN_S)
    publish_confirmed(channel.connection, queue, [b"m1", b"m2", b"m3", b"m4"])
    assert ready_count(channel, queue) == 3, "the policy's max-length 3 is lower than the argument's 4"
    api.set_policy(queue + "-high", f"^{queue}$", {"max-length": 10}, priority=5, apply_to="queues")
    poll(lambda: api.queue(queue).get("effective_policy_definition") == {"max-length": 10}, SHOWN_S)
    publish_confirmed(channel.connection, queue, [b"m5", b"m6"])
    assert ready_count(channel, queue) == 4, "now the argument's 4 is lower"


def test_an_operator_policy_caps_the_policy_and_the_argument(api, channel, unique):
    queue = unique("pol-op")
    channel.queue_declare(queue, arguments={"x-max-length": 8})
    api.set_policy(queue, f"^{queue}$", {"max-length": 6, "message-ttl": 600000}, apply_to="queues")
    api.set_policy(queue, f"^{queue}$", {"max-length": 2}, apply_to="queues", operator=True)
    shown = poll(lambda: api.queue(queue).get("operator_policy") == queue and api.queue(queue), SHOWN_S)
    assert shown and shown["policy"] == queue
    assert shown["effective_policy_definition"] == {"max-length": 2, "message-ttl": 600000}
    publish_confirmed(channel.connection, queue, [b"m1", b"m2", b"m3"])
    assert drain(channel, queue) == [b"m2", b"m3"]


def test_a_policys_alternate_exchange_takes_unroutable_messages(api, channel, unique):
    exchange, alternate, caught = unique("pol-x"), unique("pol-ae"), unique("pol-caught")
    channel.exchange_declare(exchange, "direct", auto_delete=False)
    channel.exchange_declare(alternate, "fanout")
    channel.queue_declare(caught)
    channel.queue_bind(caught, alternate)
    api.set_policy(exchange, f"^{exchange}$", {"alternate-exchange": alternate}, apply_to="exchanges")
    poll(lambda: api.get(f"/api/exchanges/%2F/{exchange}").get("policy") == exchange, SHOWN_S)
    channel.confirm_delivery()
    channel.basic_publish(exchange, "nobody", b"lost?")
    assert poll(lambda: ready_count(channel, caught) == 1, LIVE_S)
    for name in (exchange, alternate):
        channel.exchange_delete(name)
    channel.queue_delete(caught)


def test_refused_policies_answer_rabbitmqs_validation_texts(api, unique):
    name = unique("pol-bad")
    # RabbitMQ 3.10 escapes < and > in a refused policy's reason, not in an operator policy's.
    cases = [
        ("policies", {"max-priority": 10}, '[{&lt;&lt;"max-priority"&gt;&gt;,10}] are not recognised policy settings'),
        ("policies", {"message-ttl": -1}, "-1 is not a valid message TTL"),
        ("policies", {"overflow": "sideways"}, '&lt;&lt;"sideways"&gt;&gt; is not a valid overflow value'),
        ("policies", {"queue-version": 3}, "3 is not a valid queue-version value"),
        ("policies", {"queue-mode": "eager"}, '&lt;&lt;"eager"&gt;&gt; is not a valid queue-mode value'),
        ("policies", {"foo": 1, "bar": "x"},
         '[{&lt;&lt;"bar"&gt;&gt;,&lt;&lt;"x"&gt;&gt;},{&lt;&lt;"foo"&gt;&gt;,1}] are not recognised policy settings'),
        ("operator-policies", {"dead-letter-exchange": "x"},
         '[{<<"dead-letter-exchange">>,<<"x">>}] are not recognised policy settings'),
        ("policies", {}, "no policy provided"),
    ]
    for kind, definition, text in cases:
        reply = api.request("PUT", f"/api/{kind}/%2F/{name}", {"pattern": ".*", "definition": definition})
        assert (reply.status_code, reply.json()) == (400, {"error": "bad_request",
                                                           "reason": f"Validation failed\n\n{text}\n"})
    reply = api.request("PUT", f"/api/policies/%2F/{name}", {"pattern": ".*", "definition": {"max-length": 1},
                                                             "priority": "high"})
    assert reply.json()["reason"] == (
        'Validation failed\n\npriority should be a number, actually was &lt;&lt;"high"&gt;&gt;\n')
    reply = api.request("PUT", f"/api/policies/%2F/{name}", {"pattern": ".*", "definition": {"max-length": 1},
                                                             "priority": "7"})
    assert reply.json()["reason"] == 'Validation failed\n\npriority should be a number, actually was &lt;&lt;"7"&gt;&gt;\n'
    api.set_policy(name, "^nothing-matches-this$", {"max-length": 1}, priority=1.5)  # any number will do
    assert api.get(f"/api/policies/%2F/{name}")["priority"] == 1.5
    reply = api.request("PUT", f"/api/policies/%2F/{name}", {"definition": {"max-length": 1}})
    assert (reply.status_code, reply.json()["reason"]) == (400, "[{key_missing,pattern}]")
    for kind in ("policies", "operator-policies"):
        reply = api.request("PUT", f"/api/{kind}/{unique('no-vhost')}/{name}",
                            {"pattern": ".*", "definition": {"max-length": 1}})
        assert (reply.status_code, reply.json()) == (404, {"error": "not_found", "reason": "vhost_not_found"})


def test_clearing_a_policy_restores_the_queue(api, channel, unique):
    queue = unique("pol-clear")
    channel.queue_declare(queue)
    api.set_policy(queue, f"^{queue}$", {"max-length": 1}, apply_to="queues")
    poll(lambda: api.queue(queue).get("policy") == queue, SHOWN_S)
    api.clear_policy(queue)
    assert poll(lambda: api.queue(queue).get("policy") is None, SHOWN_S)
    publish_confirmed(channel.connection, queue, [b"m1", b"m2"])
    assert ready_count(channel, queue) == 2


def test_a_lowered_max_length_bytes_trims_an_existing_queue_at_once(api, channel, unique):
    queue = unique("pol-bytes-trim")
    channel.queue_declare(queue)
    publish_confirmed(channel.connection, queue, [b"0123456789", b"abcdefghij", b"ABCDEFGHIJ"])
    api.set_policy(queue, f"^{queue}$", {"max-length-bytes": 25}, apply_to="queues")
    assert poll(lambda: ready_count(channel, queue) == 2, LIVE_S), "the oldest 10 bytes were dropped"
    assert drain(channel, queue) == [b"abcdefghij", b"ABCDEFGHIJ"]


def test_a_changed_dead_letter_routing_key_routes_the_next_dead_letter(api, channel, unique):
    queue, dlx, first, second = unique("pol-dlrk"), unique("pol-dlrk-x"), unique("pol-dlrk-a"), unique("pol-dlrk-b")
    channel.exchange_declare(dlx, "direct", auto_delete=True)
    for name, key in ((first, "a"), (second, "b")):
        channel.queue_declare(name, auto_delete=True)
        channel.queue_bind(name, dlx, key)
    channel.queue_declare(queue)
    api.set_policy(queue, f"^{queue}$", {"dead-letter-exchange": dlx, "dead-letter-routing-key": "a"},
                   apply_to="queues")
    poll(lambda: api.queue(queue).get("policy") == queue, SHOWN_S)
    publish_confirmed(channel.connection, queue, [b"one", b"two"])
    method, _, _ = channel.basic_get(queue)
    channel.basic_reject(method.delivery_tag, requeue=False)
    assert poll(lambda: ready_count(channel, first) == 1, LIVE_S)
    api.set_policy(queue, f"^{queue}$", {"dead-letter-exchange": dlx, "dead-letter-routing-key": "b"},
                   apply_to="queues")
    poll(lambda: api.queue(queue).get("effective_policy_definition", {}).get("dead-letter-routing-key") == "b",
         SHOWN_S)
    method, _, _ = channel.basic_get(queue)
    channel.basic_reject(method.delivery_tag, requeue=False)
    assert poll(lambda: ready_count(channel, second) == 1, LIVE_S)
    assert (drain(channel, first), drain(channel, second)) == ([b"one"], [b"two"])


def test_a_delivery_limit_dead_letters_from_an_existing_quorum_queue(api, channel, unique):
    queue, dead = unique("pol-qq"), unique("pol-qq-dead")
    channel.queue_declare(dead, auto_delete=True)
    channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    publish_confirmed(channel.connection, queue, [b"poison"])
    api.set_policy(queue, f"^{queue}$", {"delivery-limit": 1, "dead-letter-exchange": "",
                                         "dead-letter-routing-key": dead}, apply_to="queues")
    poll(lambda: api.queue(queue).get("policy") == queue, SHOWN_S)
    method, _, _ = channel.basic_get(queue)
    channel.basic_nack(method.delivery_tag, requeue=True)
    assert poll(lambda: ready_count(channel, queue) == 1, LIVE_S), "within the limit: requeued"
    method, properties, _ = channel.basic_get(queue)
    assert properties.headers["x-delivery-count"] == 1
    channel.basic_nack(method.delivery_tag, requeue=True)
    assert poll(lambda: ready_count(channel, dead) == 1, LIVE_S), "past the limit: dead-lettered"
    assert ready_count(channel, queue) == 0
    channel.queue_delete(queue)


def test_queue_mode_and_queue_version_are_accepted_and_lose_nothing(api, channel, unique):
    queue = unique("pol-mode")
    channel.queue_declare(queue, durable=True)
    publish_confirmed(channel.connection, queue, [b"m1", b"m2", b"m3"])
    api.set_policy(queue, f"^{queue}$", {"queue-mode": "lazy", "queue-version": 2}, apply_to="queues")
    assert poll(lambda: api.queue(queue).get("policy") == queue, SHOWN_S)
    publish_confirmed(channel.connection, queue, [b"m4"])
    assert drain(channel, queue) == [b"m1", b"m2", b"m3", b"m4"]
    channel.queue_delete(queue)


def test_no_confirmed_message_is_lost_while_policies_change_under_a_consumer(api, channel, unique):
    """A consumer acks while a publisher's confirmed messages flow and the queue's policy keeps
    changing (set, changed, cleared; none of the definitions drops a message): every confirmed
    message arrives, once."""
    queue, dlx = unique("pol-churn"), unique("pol-churn-dlx")
    channel.exchange_declare(dlx, "fanout", auto_delete=True)
    channel.queue_declare(queue)
    definitions = [
        {"max-length": 100000, "message-ttl": 600000},
        {"dead-letter-exchange": dlx, "delivery-limit": 50, "queue-version": 2},
        {"max-length-bytes": 10_000_000, "overflow": "reject-publish", "expires": 600000},
        None,  # cleared
        {"queue-mode": "lazy", "dead-letter-routing-key": "x", "dead-letter-exchange": dlx},
    ]
    received: list[bytes] = []

    def on_message(ch, method, _properties, body):
        received.append(body)
        ch.basic_ack(method.delivery_tag)

    consumer = channel.connection.channel()
    consumer.basic_qos(prefetch_count=20)
    consumer.basic_consume(queue, on_message)
    publisher = channel.connection.channel()
    publisher.confirm_delivery()
    sent = [b"m%d" % number for number in range(600)]
    for number, body in enumerate(sent):
        if number % 40 == 0:
            definition = definitions[(number // 40) % len(definitions)]
            if definition is None:
                api.clear_policy(queue)
            else:
                api.set_policy(queue, f"^{queue}$", definition, apply_to="queues")
        publisher.basic_publish("", queue, body)  # returns once confirmed (raises on a nack)
    assert poll(lambda: len(received) >= len(sent), 10.0, pump=channel.connection.process_data_events), \
        f"{len(received)} arrived"
    channel.connection.process_data_events(time_limit=0.2)
    assert sorted(received) == sorted(sent), "each confirmed message arrived exactly once"
    consumer.close()
    publisher.close()
    channel.queue_delete(queue)


def test_a_policy_with_a_key_a_queue_type_does_not_take_passes_that_queue_by(api, channel, unique):
    """RabbitMQ skips, for a queue, a policy holding a key the queue's type does not take
    (queue-mode for a quorum queue; queue-leader-locator for a classic one): the next policy
    that matches applies instead."""
    classic, quorum = unique("pol-type-c"), unique("pol-type-q")
    channel.queue_declare(classic, durable=True)
    channel.queue_declare(quorum, durable=True, arguments={"x-queue-type": "quorum"})
    prefix, both = unique("pol-type"), f"^({classic}|{quorum})$"
    api.set_policy(prefix + "-fallback", both, {"max-length": 3}, priority=0, apply_to="queues")
    api.set_policy(prefix + "-lazy", both, {"queue-mode": "lazy", "max-length": 1}, priority=5,
                   apply_to="queues")
    assert poll(lambda: api.queue(classic).get("policy") == prefix + "-lazy", SHOWN_S)
    assert poll(lambda: api.queue(quorum).get("policy") == prefix + "-fallback", SHOWN_S)
    api.set_policy(prefix + "-lazy", both, {"queue-leader-locator": "random", "max-length": 1}, priority=5,
                   apply_to="queues")
    assert poll(lambda: api.queue(classic).get("policy") == prefix + "-fallback", SHOWN_S)
    assert poll(lambda: api.queue(quorum).get("policy") == prefix + "-lazy", SHOWN_S)
    publish_confirmed(channel.connection, classic, [b"m1", b"m2", b"m3", b"m4"])
    publish_confirmed(channel.connection, quorum, [b"m1", b"m2"])
    assert (ready_count(channel, classic), ready_count(channel, quorum)) == (3, 1)
    channel.queue_delete(classic)
    channel.queue_delete(quorum)


def test_a_quorum_queue_takes_a_policys_overflow_over_its_own_a_classic_queue_keeps_its_own(api, channel, unique):
    classic, quorum = unique("pol-ovf-c"), unique("pol-ovf-q")
    own = {"x-overflow": "reject-publish"}
    channel.queue_declare(classic, durable=True, arguments=own)
    channel.queue_declare(quorum, durable=True, arguments={**own, "x-queue-type": "quorum"})
    name = unique("pol-ovf")
    api.set_policy(name, f"^({classic}|{quorum})$", {"overflow": "drop-head", "max-length": 1}, apply_to="queues")
    for queue in (classic, quorum):
        assert poll(lambda: api.queue(queue).get("policy") == name, SHOWN_S)
    channel.confirm_delivery()
    channel.basic_publish("", quorum, b"q1")
    channel.basic_publish("", quorum, b"q2")  # the policy's drop-head: confirmed, q1 dropped
    channel.basic_publish("", classic, b"c1")
    with pytest.raises(NackError):
        channel.basic_publish("", classic, b"c2")  # its own reject-publish
    assert (drain(channel, quorum), drain(channel, classic)) == ([b"q2"], [b"c1"])
    channel.queue_delete(classic)
    channel.queue_delete(quorum)


def test_a_new_message_ttl_expires_the_next_messages_into_the_dead_letter_exchange(api, channel, unique):
    queue, dead = unique("pol-ttl-next"), unique("pol-ttl-dead")
    channel.queue_declare(dead, auto_delete=True)
    channel.queue_declare(queue)
    api.set_policy(queue, f"^{queue}$", {"message-ttl": 100, "dead-letter-exchange": "",
                                         "dead-letter-routing-key": dead}, apply_to="queues")
    assert poll(lambda: api.queue(queue).get("policy") == queue, SHOWN_S)
    publish_confirmed(channel.connection, queue, [b"short-lived"])
    assert poll(lambda: ready_count(channel, dead) == 1, LIVE_S), "expired into the dead-letter queue"
    assert ready_count(channel, queue) == 0
    method, properties, body = channel.basic_get(dead, auto_ack=True)
    assert (body, properties.headers["x-death"][0]["reason"]) == (b"short-lived", "expired")


def test_reject_publish_dlx_from_a_policy_nacks_and_dead_letters_the_overflow(api, channel, unique):
    queue, dead = unique("pol-rpdlx"), unique("pol-rpdlx-dead")
    channel.queue_declare(dead, auto_delete=True)
    channel.queue_declare(queue)
    api.set_policy(queue, f"^{queue}$", {"max-length": 1, "overflow": "reject-publish-dlx",
                                         "dead-letter-exchange": "", "dead-letter-routing-key": dead},
                   apply_to="queues")
    assert poll(lambda: api.queue(queue).get("policy") == queue, SHOWN_S)
    channel.confirm_delivery()
    channel.basic_publish("", queue, b"kept")
    with pytest.raises(NackError):
        channel.basic_publish("", queue, b"refused")
    assert poll(lambda: ready_count(channel, dead) == 1, LIVE_S)
    method, properties, body = channel.basic_get(dead, auto_ack=True)
    assert (body, properties.headers["x-death"][0]["reason"]) == (b"refused", "maxlen")
    assert drain(channel, queue) == [b"kept"]


def test_policies_are_listed_by_ascending_priority(api, unique):
    names = {unique("pol-list-x"): 0, unique("pol-list-y"): 9, unique("pol-list-w"): 3}
    for name, priority in names.items():
        api.set_policy(name, "^nothing-matches-this$", {"max-length": 1}, priority=priority)
        api.set_policy(name, "^nothing-matches-this$", {"max-length": 1}, priority=priority, operator=True)
    expected = sorted(names, key=names.get)
    for path in ("/api/policies", "/api/policies/%2F", "/api/operator-policies", "/api/operator-policies/%2F"):
        assert [p["name"] for p in api.get(path) if p["name"] in names] == expected, path


# -- this broker's own behaviour ---------------------------------------------------------


def test_a_new_message_ttl_expires_messages_already_past_it(api, channel, managed, unique):
    own_broker_only(managed)
    queue = unique("pol-ttl")
    channel.queue_declare(queue)
    publish_confirmed(channel.connection, queue, [b"old"])
    channel.connection.sleep(0.3)
    publish_confirmed(channel.connection, queue, [b"new"])
    api.set_policy(queue, f"^{queue}$", {"message-ttl": 200}, apply_to="queues")
    assert poll(lambda: ready_count(channel, queue) == 1, LIVE_S)
    assert drain(channel, queue) == [b"new"]


def test_delivery_limit_and_delayed_retry_reach_an_existing_classic_queue(api, channel, managed, unique):
    own_broker_only(managed)
    queue, dead = unique("pol-retry"), unique("pol-retry-dead")
    channel.queue_declare(dead)
    channel.queue_declare(queue)
    publish_confirmed(channel.connection, queue, [b"poison"])
    api.set_policy(queue, f"^{queue}$", {"delivery-limit": 1, "delayed-retry-type": "failed",
                                         "delayed-retry-min": 100, "dead-letter-exchange": "",
                                         "dead-letter-routing-key": dead}, apply_to="queues")
    poll(lambda: api.queue(queue).get("policy") == queue, LIVE_S)
    method, _, _ = channel.basic_get(queue)
    channel.basic_nack(method.delivery_tag, requeue=True)
    assert ready_count(channel, queue) == 0, "it waits for its delayed retry"
    assert poll(lambda: ready_count(channel, queue) == 1, 2.0)
    method, properties, _ = channel.basic_get(queue)
    assert properties.headers["x-delivery-count"] == 1
    channel.basic_nack(method.delivery_tag, requeue=True)
    assert poll(lambda: ready_count(channel, dead) == 1, LIVE_S), "past its delivery limit: dead-lettered"


def test_at_equal_priority_the_policy_whose_name_sorts_first_applies(api, channel, managed, unique):
    own_broker_only(managed)  # RabbitMQ leaves the choice undefined
    queue = unique("pol-tie")
    channel.queue_declare(queue)
    api.set_policy(queue + "-b", f"^{queue}$", {"max-length": 2}, priority=3, apply_to="queues")
    api.set_policy(queue + "-a", f"^{queue}", {"max-length": 1}, priority=3, apply_to="queues")
    assert poll(lambda: api.queue(queue).get("policy") == queue + "-a", LIVE_S)
    publish_confirmed(channel.connection, queue, [b"m1", b"m2"])
    assert drain(channel, queue) == [b"m2"]


def test_a_consumer_timeout_policy_cancels_a_consumer_that_holds_a_delivery_too_long(api, channel, managed, unique):
    own_broker_only(managed)  # RabbitMQ 3.10 has no consumer-timeout policy key (3.12 has)
    queue = unique("pol-timeout")
    channel.queue_declare(queue)
    api.set_policy(queue, f"^{queue}$", {"consumer-timeout": 400}, apply_to="queues")
    assert poll(lambda: api.queue(queue).get("policy") == queue, LIVE_S)
    cancelled, held = [], []
    channel.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = channel.basic_consume(queue, lambda ch, method, properties, body: held.append(body))
    publish_confirmed(channel.connection, queue, [b"slow"])
    assert poll(lambda: cancelled == [tag], 5.0, pump=channel.connection.process_data_events), \
        "the held delivery timed out"
    assert held == [b"slow"]
    assert ready_count(channel, queue) == 1, "the delivery went back to the queue"


def test_messages_waiting_for_a_delayed_retry_keep_their_schedule_across_a_policy_change(
        api, channel, managed, unique):
    own_broker_only(managed)
    queue = unique("pol-schedule")
    channel.queue_declare(queue)
    api.set_policy(queue, f"^{queue}$", {"delayed-retry-type": "failed", "delayed-retry-min": 800}, apply_to="queues")
    assert poll(lambda: api.queue(queue).get("policy") == queue, LIVE_S)
    publish_confirmed(channel.connection, queue, [b"retry me"])
    method, _, _ = channel.basic_get(queue)
    channel.basic_nack(method.delivery_tag, requeue=True)
    api.set_policy(queue, f"^{queue}$", {"delayed-retry-type": "failed", "delayed-retry-min": 600000,
                                         "max-length": 5, "message-ttl": 600000}, apply_to="queues")
    assert ready_count(channel, queue) == 0, "still waiting"
    assert poll(lambda: ready_count(channel, queue) == 1, 3.0), "back after its 800 ms, not the new 10 minutes"
    method, properties, body = channel.basic_get(queue, auto_ack=True)
    assert (body, method.redelivered) == (b"retry me", True)


def test_an_archive_policy_keeps_an_existing_queues_acked_segments(broker_factory, unique):
    port = free_port()  # a broker of its own, whose data directory the test reads
    broker = broker_factory(extra_args=("--management-port", str(port)))
    api = Management(f"http://127.0.0.1:{port}")
    queue = unique("pol-archive")
    connection = pika.BlockingConnection(pika.URLParameters(broker.url()))
    connection.channel().queue_declare(queue, durable=True)
    connection.close()
    api.set_policy(queue, f"^{queue}$", {"archive": True}, apply_to="queues")
    assert poll(lambda: api.queue(queue).get("policy") == queue, LIVE_S)
    # Positive control: the messages were in the queue's segments before the drain.
    assert publish_and_drain(broker.url(), queue, {}, broker.data_dir) > COUNT * len(BODY) // 2
    assert segment_bytes(broker.data_dir / "archive") > COUNT * len(BODY) // 2


def test_deduplication_from_a_policy_enqueues_a_repeated_publish_once(api, channel, managed, unique):
    own_broker_only(managed)  # RabbitMQ has deduplication only as a plugin, with x-arguments
    queue = unique("pol-dedup")
    channel.queue_declare(queue)
    api.set_policy(queue, f"^{queue}$", {"message-deduplication": True, "deduplication-header": "order-id"},
                   apply_to="queues")
    assert poll(lambda: api.queue(queue).get("policy") == queue, LIVE_S)
    channel.confirm_delivery()
    for order in ("o-1", "o-1", "o-2", "o-1"):
        channel.basic_publish("", queue, order.encode(), pika.BasicProperties(headers={"order-id": order}))
    assert drain(channel, queue) == [b"o-1", b"o-2"]
    api.clear_policy(queue)
    assert poll(lambda: api.queue(queue).get("policy") is None, LIVE_S)
    for order in ("o-1", "o-1"):
        channel.basic_publish("", queue, order.encode(), pika.BasicProperties(headers={"order-id": order}))
    assert drain(channel, queue) == [b"o-1", b"o-1"], "without the policy, no deduplication"
