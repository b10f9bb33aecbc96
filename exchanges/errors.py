"""Errors raised by the routing layer.

Their messages are the text RabbitMQ puts after the reply-code name, so the
caller can send ``f"PRECONDITION_FAILED - {err}"`` or ``f"COMMAND_INVALID - {err}"``.
"""


class InvalidBindingArguments(ValueError):
    """A binding's arguments are not acceptable to the exchange type (406 PRECONDITION_FAILED)."""


class UnknownExchangeType(ValueError):
    """exchange.declare named a type no exchange class implements (503 COMMAND_INVALID)."""

    def __init__(self, type_name: str) -> None:
        super().__init__(f"invalid exchange type '{type_name}'")
        self.type_name = type_name
