"""The vhost's side of x-delayed-message exchanges: where their held messages wait, and where
they go when due.

A delayed exchange holds each message with a positive x-delay in its DelayedMessages
(queues/delayed_delivery.py), journaled as the store amq.x-delayed-message.<exchange> when
the exchange is durable. When a message is due it is routed through the exchange's bindings as
they are then; if the exchange was deleted meanwhile, nothing is routed.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from amqp_server import errors
from exchanges.delayed import DelayedMessageExchange
from queues.delayed_delivery import DelayedMessages, store_name
from queues.message import Message

if TYPE_CHECKING:
    from amqp_server.vhost import VirtualHost

log = logging.getLogger(__name__)


def hold_delayed_messages(vhost: "VirtualHost", exchange: DelayedMessageExchange) -> None:
    """Give a new delayed exchange the store its held messages wait in, and recover them."""
    journal = None
    if exchange.durable and vhost.journal_factory is not None:
        journal = vhost.journal_factory(vhost.name, store_name(exchange.name), False)
    pending = DelayedMessages(
        exchange.name, vhost.timers, lambda message: route_released(vhost, exchange, message), journal
    )
    recovered = pending.recover()
    if recovered:
        log.info("recovered %d delayed messages of %s", recovered, errors.resource("exchange", exchange.name, vhost.name))
    exchange.pending = pending


def route_released(vhost: "VirtualHost", exchange: DelayedMessageExchange, message: Message) -> bool:
    """A delayed message is due: route it through the exchange's bindings as they are now.

    Returns whether any queue took it.
    """
    if vhost.exchanges.get(exchange.name) is not exchange:
        return False
    targets = list(vhost.route(exchange, message))
    for target in targets:
        target.publish(message)
    return bool(targets)
