"""Creating exchanges by the type name given in exchange.declare."""

import pytest

from exchanges import (EXCHANGE_TYPES, DirectExchange, Exchange, FanoutExchange, HeadersExchange,
                       TopicExchange, UnknownExchangeType, create_exchange)
from exchanges.delayed import DelayedMessageExchange
from exchanges.federation_upstream import FederationUpstreamExchange


def test_registry_has_the_four_standard_types_the_delayed_message_type_and_federations():
    assert EXCHANGE_TYPES == {"direct": DirectExchange, "fanout": FanoutExchange,
                              "topic": TopicExchange, "headers": HeadersExchange,
                              "x-delayed-message": DelayedMessageExchange,
                              "x-federation-upstream": FederationUpstreamExchange}


@pytest.mark.parametrize("type_name", ["direct", "fanout", "topic", "headers"])
def test_create_exchange_builds_the_named_type_with_its_flags(type_name):
    exchange = create_exchange(type_name, "x", durable=True, auto_delete=False, internal=True,
                               arguments={"alternate-exchange": "ae"})
    assert isinstance(exchange, Exchange)
    assert exchange.type_name == type_name
    assert (exchange.name, exchange.durable, exchange.internal) == ("x", True, True)
    assert exchange.alternate_exchange == "ae"
    assert exchange.binding_count() == 0


@pytest.mark.parametrize("type_name", ["foo", "x-consistent-hash", "Direct", ""])
def test_unknown_type_raises_with_rabbitmq_text(type_name):
    with pytest.raises(UnknownExchangeType) as caught:
        create_exchange(type_name, "x")
    assert caught.value.type_name == type_name
    assert str(caught.value) == f"invalid exchange type '{type_name}'"  # after "COMMAND_INVALID - "
    assert isinstance(caught.value, ValueError)
