"""AMQP errors as RabbitMQ reports them: a reply code, its name, and the text clients grep for.

A soft error (3xx/4xx) closes only the channel it happened on; a hard error (5xx) closes the
whole connection. Client code matches on these exact strings (for example
"NOT_FOUND - no queue 'q' in vhost '/'"), so every text here is copied from RabbitMQ.
"""

from __future__ import annotations

from queues.arguments.equivalence import Inequivalent
from queues.arguments.texts import resource as resource  # (re-exported: errors.resource)

REPLY_SUCCESS = 200
CONTENT_TOO_LARGE = 311
NO_ROUTE = 312
NO_CONSUMERS = 313
CONNECTION_FORCED = 320
INVALID_PATH = 402
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541

REPLY_NAMES = {
    CONTENT_TOO_LARGE: "CONTENT_TOO_LARGE",
    NO_ROUTE: "NO_ROUTE",
    NO_CONSUMERS: "NO_CONSUMERS",
    CONNECTION_FORCED: "CONNECTION_FORCED",
    INVALID_PATH: "INVALID_PATH",
    ACCESS_REFUSED: "ACCESS_REFUSED",
    NOT_FOUND: "NOT_FOUND",
    RESOURCE_LOCKED: "RESOURCE_LOCKED",
    PRECONDITION_FAILED: "PRECONDITION_FAILED",
    FRAME_ERROR: "FRAME_ERROR",
    SYNTAX_ERROR: "SYNTAX_ERROR",
    COMMAND_INVALID: "COMMAND_INVALID",
    CHANNEL_ERROR: "CHANNEL_ERROR",
    UNEXPECTED_FRAME: "UNEXPECTED_FRAME",
    RESOURCE_ERROR: "RESOURCE_ERROR",
    NOT_ALLOWED: "NOT_ALLOWED",
    NOT_IMPLEMENTED: "NOT_IMPLEMENTED",
    INTERNAL_ERROR: "INTERNAL_ERROR",
}

HARD_ERRORS = frozenset(
    {
        CONNECTION_FORCED, INVALID_PATH, FRAME_ERROR, SYNTAX_ERROR, COMMAND_INVALID,
        CHANNEL_ERROR, UNEXPECTED_FRAME, RESOURCE_ERROR, NOT_ALLOWED, NOT_IMPLEMENTED,
        INTERNAL_ERROR,
    }
)


MAX_REPLY_TEXT = 255


class AMQPError(Exception):
    """A protocol error with RabbitMQ's reply code and text.

    `class_id`/`method_id` name the method that caused it (0 when no method did).
    Whether the channel or the connection closes follows from the code.
    """

    def __init__(self, code: int, explanation: str, class_id: int = 0, method_id: int = 0) -> None:
        super().__init__(explanation)
        self.code = code
        self.explanation = explanation
        self.class_id = class_id
        self.method_id = method_id

    def caused_by(self, class_id: int, method_id: int) -> "AMQPError":
        """Name the method that caused it (channel.close carries it); returns the error itself."""
        self.class_id = class_id
        self.method_id = method_id
        return self

    @property
    def reply_text(self) -> str:
        """RabbitMQ's text: longer than a short string allows (255 bytes), it is cut to 252
        bytes and "..." (rabbit_binary_generator:amqp_exception_explanation). With no
        explanation it is the name alone, as RabbitMQ's 541 after a crashed channel."""
        text = f"{REPLY_NAMES[self.code]} - {self.explanation}" if self.explanation else REPLY_NAMES[self.code]
        encoded = text.encode()
        if len(encoded) <= MAX_REPLY_TEXT:
            return text
        return encoded[: MAX_REPLY_TEXT - 3].decode("utf-8", "ignore") + "..."

    @property
    def is_hard(self) -> bool:
        return self.code in HARD_ERRORS

    def __str__(self) -> str:
        return self.reply_text


class HandshakeError(AMQPError):
    """An error of a client that has not logged in and tuned yet (RabbitMQ's starting and tuning
    states): RabbitMQ sends it no connection.close and drops the socket a few seconds later, so an
    untrusted client learns nothing and cannot retry at full speed. The code and text are logged."""


def not_found(kind: str, name: str, vhost: str) -> AMQPError:
    return AMQPError(NOT_FOUND, f"no {resource(kind, name, vhost)}")


def access_refused(kind: str, name: str, vhost: str, user: str) -> AMQPError:
    return AMQPError(ACCESS_REFUSED, f"access to {resource(kind, name, vhost)} refused for user '{user}'")


def resource_locked(queue: str, vhost: str) -> AMQPError:
    return AMQPError(
        RESOURCE_LOCKED,
        f"cannot obtain exclusive access to locked {resource('queue', queue, vhost)}. It could be "
        "originally declared on another connection or the exclusive property value does not match "
        "that of the original declaration.",
    )


def reserved_prefix(kind: str, name: str) -> AMQPError:
    return AMQPError(ACCESS_REFUSED, f"{kind} name '{name}' contains reserved prefix 'amq.*'")


def default_exchange_refused() -> AMQPError:
    return AMQPError(ACCESS_REFUSED, "operation not permitted on the default exchange")


def inequivalent(refusal: Inequivalent) -> AMQPError:
    """406 for a redeclaration that differs from what exists (queues/arguments/equivalence.py)."""
    return AMQPError(PRECONDITION_FAILED, str(refusal))
