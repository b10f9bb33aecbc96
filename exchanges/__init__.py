"""Message routing: exchange types and their binding indexes. Pure logic, no I/O.

Destinations are opaque hashables chosen by the caller (queues or exchanges).
"""

from .direct import DirectExchange
from .errors import InvalidBindingArguments, UnknownExchangeType
from .exchange import Exchange
from .fanout import FanoutExchange
from .headers import HeadersExchange
from .registry import EXCHANGE_TYPES, create_exchange
from .topic import TopicExchange

__all__ = [
    "EXCHANGE_TYPES",
    "DirectExchange",
    "Exchange",
    "FanoutExchange",
    "HeadersExchange",
    "InvalidBindingArguments",
    "TopicExchange",
    "UnknownExchangeType",
    "create_exchange",
]
