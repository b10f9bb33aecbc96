"""Policies as RabbitMQ checks, matches and combines them (rabbit_policy.erl, rabbit_policies.erl)."""

from __future__ import annotations

import pytest

from amqp_server.broker.policies import ApplyTo, PolicySet, parse_policy
from queues.arguments.policy_keys import PolicyError, combine_with_arguments, merge_definitions, queue_arguments_of


def refusal(body: dict, operator: bool = False) -> str:
    with pytest.raises(PolicyError) as raised:
        parse_policy("/", "p", body, operator)
    return str(raised.value)


def test_values_are_refused_with_rabbitmqs_texts():
    assert refusal({"pattern": ".*", "definition": {"message-ttl": -1}}) == "-1 is not a valid message TTL"
    assert refusal({"pattern": ".*", "definition": {"expires": 0}}) == "0 is not a valid queue expiry"
    assert refusal({"pattern": ".*", "definition": {"max-length": "ten"}}) == '<<"ten">> is not a valid maximum length'
    assert refusal({"pattern": ".*", "definition": {"overflow": "drop-tail"}}) == (
        '<<"drop-tail">> is not a valid overflow value')
    assert refusal({"pattern": ".*", "definition": {"dead-letter-exchange": 5}}) == (
        "5 is not a valid dead letter exchange name")


def test_unknown_keys_and_max_priority_are_not_recognised_policy_settings():
    assert refusal({"pattern": ".*", "definition": {"max-priority": 10}}) == (
        '[{<<"max-priority">>,10}] are not recognised policy settings')
    assert refusal({"pattern": ".*", "definition": {"ha-mode": "all", "message-ttl": 5}}) == (
        '[{<<"ha-mode">>,<<"all">>}] are not recognised policy settings')
    assert refusal({"pattern": ".*", "definition": {"foo": 1, "bar": "x"}}) == (
        '[{<<"bar">>,<<"x">>},{<<"foo">>,1}] are not recognised policy settings')


def test_an_operator_policy_takes_only_the_limits():
    assert refusal({"pattern": ".*", "definition": {"dead-letter-exchange": "dlx"}}, operator=True) == (
        '[{<<"dead-letter-exchange">>,<<"dlx">>}] are not recognised policy settings')
    policy = parse_policy("/", "cap", {"pattern": ".*", "definition": {"max-length": 5}}, operator=True)
    assert policy.definition == {"max-length": 5}


def test_shape_errors():
    assert refusal({"pattern": ".*", "definition": {}}) == "no policy provided"
    assert refusal({"definition": {"max-length": 1}}) == "[{key_missing,pattern}]"
    assert refusal({"pattern": ".*", "definition": {"max-length": 1}, "apply-to": "topics"}) == (
        "apply-to 'topics' unrecognised; should be one of: 'queues', 'classic_queues',  'quorum_queues', "
        "'streams', 'exchanges', or 'all'")
    assert refusal({"pattern": ".*", "definition": {"max-length": 1}, "priority": "high"}) == (
        'priority should be a number, actually was <<"high">>')
    assert refusal({"pattern": "(", "definition": {"max-length": 1}}).startswith(
        "pattern should be regular expression but is invalid: {")


def test_defaults_and_a_priority_that_is_any_number_but_not_text():
    policy = parse_policy("/", "p", {"pattern": "^a", "definition": {"max-length": 1}})
    assert (policy.apply_to, policy.priority) == (ApplyTo.ALL, 0)
    assert parse_policy("/", "p", {"pattern": "^a", "definition": {"max-length": 1}, "priority": 1.5}).as_json() == {
        "vhost": "/", "name": "p", "pattern": "^a", "apply-to": "all", "definition": {"max-length": 1}, "priority": 1.5}
    assert refusal({"pattern": ".*", "definition": {"max-length": 1}, "priority": "3"}) == (
        'priority should be a number, actually was <<"3">>')


def test_the_highest_priority_wins_and_ties_go_to_the_first_name():
    policies = PolicySet()
    for name, priority in (("b", 1), ("a", 1), ("low", 0)):
        policies.put(parse_policy("/", name, {"pattern": "^q", "definition": {"max-length": 1}, "priority": priority}))
    assert policies.for_queue("q1", "classic").name == "a"
    policies.put(parse_policy("/", "top", {"pattern": "1$", "definition": {"max-length": 1}, "priority": 9}))
    assert policies.for_queue("q1", "classic").name == "top"
    assert policies.for_queue("q2", "classic").name == "a"
    assert policies.for_queue("x", "classic") is None


def test_apply_to_chooses_queues_of_a_type_or_exchanges():
    def make(apply_to: str):
        return parse_policy("/", apply_to, {"pattern": ".*", "definition": {"max-length": 1}, "apply-to": apply_to})

    assert make("classic_queues").matches_queue("q", "classic")
    assert not make("classic_queues").matches_queue("q", "quorum")
    assert make("quorum_queues").matches_queue("q", "quorum")
    assert not make("exchanges").matches_queue("q", "classic")
    assert make("exchanges").matches_exchange("x") and make("all").matches_exchange("x")
    assert not make("queues").matches_exchange("x")
    assert not make("streams").matches_queue("q", "classic")


def test_operator_values_cap_the_policys_and_the_lower_of_policy_and_argument_wins_for_limits():
    merged = merge_definitions({"max-length": 10, "dead-letter-exchange": "dlx"}, {"max-length": 3, "expires": 50})
    assert merged == {"max-length": 3, "dead-letter-exchange": "dlx", "expires": 50}
    from_policy = queue_arguments_of(merged)
    assert from_policy == {"x-max-length": 3, "x-dead-letter-exchange": "dlx", "x-expires": 50}
    combined = combine_with_arguments(from_policy, {"x-max-length": 1, "x-expires": 90, "x-dead-letter-exchange": "own"})
    assert combined == {"x-max-length": 1, "x-expires": 50, "x-dead-letter-exchange": "own"}


def test_keys_without_effect_here_give_no_argument():
    definition = {"queue-mode": "lazy", "queue-version": 2, "alternate-exchange": "ae", "max-length": 4}
    parse_policy("/", "p", {"pattern": ".*", "definition": definition})
    assert queue_arguments_of(definition) == {"x-max-length": 4}
