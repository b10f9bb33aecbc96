"""Content assembly: one basic.publish as its frames arrive (method, content header, bodies).

AMQP sends a message as a basic.publish method frame, one content header frame with the body
size and properties, then body frames until that size is reached (spec 4.2.6). A channel
starts a ContentAssembly at the method (Channel.handle_method) and hands it every frame
after; anything else in between is refused with RabbitMQ's 505 texts, and so is a header of
another class or a body larger than declared. The header is checked before the body is read
(codec.header_body_size, the broker's door for properties), so a message consumers could not
decode is refused without holding its body.

A publish whose three frames came in one read with its whole body in one frame, the usual
case, needs no assembly: Channel.handle_publish checks its header with the same
codec.header_body_size and makes the message at once. So this file holds only what a publish
needs while its frames are apart, and a body that takes several frames.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from amqp_server.wire import errors
from amqp_server.wire.codec import header_body_size
from amqp_server.wire.errors import AMQPError

if TYPE_CHECKING:
    from exchanges import Exchange


class ContentAssembly:
    """A basic.publish whose content header and body are still arriving."""

    __slots__ = (
        "exchange", "routing_key", "mandatory", "routing_raw", "raw_header", "body_size", "parts", "received", "in_flight"
    )

    def __init__(self, exchange: "Exchange", routing_key: str, mandatory: bool, routing_raw: bytes) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.mandatory = mandatory
        self.routing_raw = routing_raw
        self.raw_header: bytes | None = None
        self.body_size = 0
        # The body frames so far, made only once a body comes in more than one frame: most
        # messages' body is one frame, and this runs for every publish.
        self.parts: list[bytes] | None = None
        self.received = 0
        # Counted in the connection's content_in_flight: a first body frame left it incomplete.
        self.in_flight = False

    def counted_in_flight(self) -> None:
        """Its connection counts it in content_in_flight from now on (Channel._content_in_flight):
        the count goes down when it completes or its channel goes."""
        self.in_flight = True

    def method_refused(self) -> AMQPError:
        """The error for a method frame that arrives before this content is complete."""
        if self.raw_header is None:
            text = "expected content header for class 60, got non content header frame instead"
        else:
            text = "expected content body, got non content body frame instead"
        return AMQPError(errors.UNEXPECTED_FRAME, text, 60, 40)

    def take_header(self, payload: bytes, max_size: int) -> bool:
        """The content header frame; True if the content is complete (an empty body). Raises
        AMQPError for a header out of turn, and what `header_body_size` raises."""
        if self.raw_header is not None:
            raise AMQPError(errors.UNEXPECTED_FRAME, "expected content body, got non content body frame instead")
        body_size = header_body_size(payload, max_size)
        self.raw_header = payload
        self.body_size = body_size
        return body_size == 0

    def take_body(self, payload: bytes) -> bytes | None:
        """One body frame (the header came: the channel checks `raw_header` first); the whole
        body once complete, else None. FRAME_ERROR if the bodies exceed the declared size."""
        received = self.received + len(payload)
        parts = self.parts
        if parts is None:
            if received == self.body_size:
                return payload  # the usual case: the whole body in one frame
            parts = self.parts = []
        parts.append(payload)
        self.received = received
        if received < self.body_size:
            return None
        if received > self.body_size:
            raise AMQPError(errors.FRAME_ERROR, f"content body larger than declared: {received} > {self.body_size}")
        return parts[0] if len(parts) == 1 else b"".join(parts)
