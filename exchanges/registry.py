"""Exchange types by name, as exchange.declare names them."""

from __future__ import annotations

from typing import Any

from .delayed import DelayedMessageExchange
from .direct import DirectExchange
from .errors import UnknownExchangeType
from .exchange import Exchange
from .fanout import FanoutExchange
from .federation_upstream import FederationUpstreamExchange
from .headers import HeadersExchange
from .topic import TopicExchange

EXCHANGE_TYPES: dict[str, type[Exchange]] = {
    cls.type_name: cls
    for cls in (DirectExchange, FanoutExchange, TopicExchange, HeadersExchange, DelayedMessageExchange,
                FederationUpstreamExchange)
}


def create_exchange(type_name: str, name: str, **kwargs: Any) -> Exchange:
    """A new exchange of the named type; raises UnknownExchangeType for any other name."""
    try:
        cls = EXCHANGE_TYPES[type_name]
    except KeyError:
        raise UnknownExchangeType(type_name) from None
    return cls(name, **kwargs)
