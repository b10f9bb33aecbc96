"""Federation upstream parameters: RabbitMQ 3.10.8's checks and texts, and which upstreams a
policy gives an exchange or a queue (the texts were read from 3.10.8 running beside)."""

from __future__ import annotations

import pytest

from amqp_server.federation.upstreams import (
    DEFAULT_MAX_HOPS,
    DEFAULT_PREFETCH,
    Upstream,
    safe_uri,
    upstream_problems,
    upstream_set_problems,
    upstreams_for,
)
from queues.arguments.policy_keys import PolicyError, check_definition


def test_a_complete_upstream_is_taken():
    value = {"uri": ["amqp://a", "amqps://u:p@b:5671/v"], "prefetch-count": 10, "reconnect-delay": 1.5,
             "ack-mode": "on-publish", "max-hops": 2, "expires": 1000, "message-ttl": 5, "exchange": "x",
             "queue": "q", "trust-user-id": False}
    assert upstream_problems("u1", value) == []


@pytest.mark.parametrize("value, lines", [
    ({"max-hops": 1}, ['Key "uri" not found in u1']),
    ({"uri": "amqp://x", "bogus": 1}, ['Unrecognised terms [{<<"bogus">>,1}] in u1']),
    ({"uri": "amqp://x", "max-hops": "a"}, ['max-hops should be a number, actually was <<"a">>']),
    ({"uri": "amqp://x", "ack-mode": "bad"},
     ['ack-mode should be one of [<<"no-ack">>,<<"on-publish">>,<<"on-confirm">>], actually was <<"bad">>']),
    ({"uri": ["amqp://x", 3]}, ["uri should be list, actually was [<<\"amqp://x\">>,3]"]),
    ({"uri": "amqp://x", "trust-user-id": "x"}, ['trust-user-id should be boolean, actually was <<"x">>']),
    ({"uri": "amqp://x", "exchange": 5}, ["exchange should be binary, actually was 5"]),
    ({"uri": "nope://x"}, ['"nope://x" not a valid URI: {{unexpected_uri_scheme,"nope"},"nope://x"}']),
    # every refusal, the last key's first and the unknown keys before them
    ({"uri": "amqp://x", "prefetch-count": "a", "max-hops": "b", "bogus": 1},
     ['Unrecognised terms [{<<"bogus">>,1}] in u1', 'max-hops should be a number, actually was <<"b">>',
      'prefetch-count should be a number, actually was <<"a">>']),
    ({"prefetch-count": "a"}, ['prefetch-count should be a number, actually was <<"a">>', 'Key "uri" not found in u1']),
])
def test_refusals_are_rabbitmqs_lines_in_its_order(value, lines):
    assert upstream_problems("u1", value) == lines


def test_a_value_that_is_no_object_is_refused_not_a_crash():
    assert upstream_problems("u1", "str") == ['u1 should be a JSON object, actually was <<"str">>']
    assert upstream_set_problems("s1", {"upstream": "a"}) == [
        's1 should be list, actually was #{<<"upstream">> => <<"a">>}']


def test_upstream_sets_need_a_name_and_take_no_uri():
    assert upstream_set_problems("s1", [{"upstream": "a", "max-hops": 2}]) == []
    assert upstream_set_problems("s1", [{"max-hops": 1}]) == ['Key "upstream" not found in s1']
    assert upstream_set_problems("s1", [{"upstream": "a", "uri": "amqp://x"}]) == [
        'Unrecognised terms [{<<"uri">>,<<"amqp://x">>}] in s1']
    assert upstream_set_problems("s1", [{"upstream": 5}]) == ["upstream should be binary, actually was 5"]


UPSTREAMS = {"u1": {"uri": "amqp://one", "max-hops": 3}, "u2": {"uri": ["amqp://two", "amqp://deux"]},
             "other": {"uri": "amqp://three", "exchange": "elsewhere"}}
SETS = {"pair": [{"upstream": "u1", "prefetch-count": 7}, {"upstream": "missing"}, {"upstream": "u2"}]}


def test_one_upstream_has_rabbitmqs_defaults():
    [upstream] = upstreams_for({"federation-upstream": "u2"}, UPSTREAMS, SETS, "fed.x")
    assert upstream == Upstream(name="u2", uris=("amqp://two", "amqp://deux"), exchange="fed.x", queue="fed.x",
                                consumer_tag="federation-link-u2")
    assert (upstream.prefetch_count, upstream.max_hops, upstream.ack_mode) == (DEFAULT_PREFETCH, DEFAULT_MAX_HOPS,
                                                                               "on-confirm")
    assert upstream.reconnect_delay_s == 5


def test_a_set_overrides_its_upstreams_and_skips_names_that_are_not_upstreams():
    found = upstreams_for({"federation-upstream-set": "pair"}, UPSTREAMS, SETS, "fed.x")
    assert [(u.name, u.prefetch_count, u.max_hops) for u in found] == [("u1", 7, 3), ("u2", DEFAULT_PREFETCH, 1)]


def test_the_set_all_and_a_pattern_take_every_matching_upstream():
    assert [u.name for u in upstreams_for({"federation-upstream-set": "all"}, UPSTREAMS, SETS, "x")] == [
        "other", "u1", "u2"]
    assert [u.name for u in upstreams_for({"federation-upstream-pattern": "^u"}, UPSTREAMS, SETS, "x")] == [
        "u1", "u2"]
    assert upstreams_for({"federation-upstream": "nosuch"}, UPSTREAMS, SETS, "x") == []
    assert upstreams_for({"max-length": 1}, UPSTREAMS, SETS, "x") == []
    [other] = upstreams_for({"federation-upstream": "other"}, UPSTREAMS, SETS, "x")
    assert other.exchange == "elsewhere"


@pytest.mark.parametrize("definition, text", [
    ({"federation-upstream": "a", "federation-upstream-set": "b"},
     "cannot specify federation-upstream, federation-upstream-set or federation-upstream-pattern together"),
    ({"federation-upstream": 5}, "5 is not a valid federation upstream name"),
    ({"federation-upstream-set": 5}, "5 is not a valid federation upstream set name"),
    ({"federation-upstream-pattern": 5}, "5 is not a valid federation upstream pattern name"),
])
def test_federation_policy_keys_are_checked_as_rabbitmq_does(definition, text):
    with pytest.raises(PolicyError) as refused:
        check_definition(definition)
    assert str(refused.value) == text


def test_a_federation_policy_is_taken_with_other_keys():
    assert check_definition({"federation-upstream": "nosuch", "max-length": 3}) == {
        "federation-upstream": "nosuch", "max-length": 3}
    with pytest.raises(PolicyError) as refused:
        check_definition({"federation-upstream-pattern": "("})
    assert str(refused.value).startswith("could not compile pattern ( to a regular expression. Error: {")
    with pytest.raises(PolicyError):  # an operator policy cannot federate
        check_definition({"federation-upstream": "u"}, operator=True)


def test_shown_uris_carry_no_credentials():
    assert safe_uri("amqp://guest:secret@127.0.0.1:5771/v") == "amqp://127.0.0.1:5771/v"
    assert safe_uri("amqps://host") == "amqps://host"
