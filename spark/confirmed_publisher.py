"""Publish a stream of messages over AMQP with publisher confirms, many in flight at once (pika).

``ConfirmedPublisher(url).publish_all(messages)`` opens one connection and channel, puts the
channel in confirm mode and publishes ``(exchange, routing_key, properties, body)`` tuples,
keeping up to ``window`` messages unconfirmed (pika's blocking channel waits for each confirm
in turn, about 20 times slower). It returns once the broker confirmed every message, or raises
``PublishFailed``: a nack, a mandatory message returned (no queue took it), the channel or
connection closed, or no confirm for ``timeout_s`` seconds (a broker blocked by an alarm, for
instance). Messages confirmed before a failure stay published; the caller publishes them again
(under the same message ids, for a broker to deduplicate).
"""

from __future__ import annotations

from typing import Any, Iterator

import pika
from pika.adapters.select_connection import SelectConnection


class PublishFailed(RuntimeError):
    """The broker did not take every message."""


class ConfirmedPublisher:
    """One publishing run; see the module docstring."""

    def __init__(self, url: str, *, window: int = 1000, timeout_s: float = 60.0, mandatory: bool = True) -> None:
        self.parameters = pika.URLParameters(url)
        self.parameters.blocked_connection_timeout = timeout_s
        self.window, self.timeout_s, self.mandatory = window, timeout_s, mandatory
        self._messages: Iterator[tuple[str, str, Any, bytes]] = iter(())
        self._connection: SelectConnection | None = None
        self._channel: Any = None
        self._sent = 0
        self._confirmed = 0
        self._exhausted = False
        self._error: str | None = None
        self._progress_at = 0  # confirms counted at the last timeout check
        self._raised: BaseException | None = None  # by the messages' iterator (Spark's input)

    def publish_all(self, messages: Iterator[tuple[str, str, Any, bytes]]) -> int:
        """Publish every message; how many. Raises ``PublishFailed``."""
        self._messages = iter(messages)
        connection = SelectConnection(self.parameters, on_open_callback=self._opened,
                                      on_open_error_callback=self._open_failed, on_close_callback=self._closed)
        self._connection = connection
        connection.ioloop.call_later(self.timeout_s, self._check_progress)
        connection.ioloop.start()
        if self._raised is not None:
            raise self._raised
        if self._error is not None:
            raise PublishFailed(f"amqp-queue sink: {self._error} ({self._confirmed} of {self._sent} messages "
                                "confirmed)")
        return self._confirmed

    # ---- pika callbacks ----

    def _opened(self, connection: SelectConnection) -> None:
        connection.channel(on_open_callback=self._channel_opened)

    def _open_failed(self, connection: SelectConnection, error: BaseException) -> None:
        self._error = f"cannot connect to {self.parameters.host}:{self.parameters.port}: {error!r}"
        connection.ioloop.stop()

    def _closed(self, connection: SelectConnection, reason: BaseException) -> None:
        if self._error is None and not (self._exhausted and self._confirmed == self._sent):
            self._error = f"the connection closed: {reason!r}"
        connection.ioloop.stop()

    def _channel_opened(self, channel: Any) -> None:
        self._channel = channel
        channel.add_on_close_callback(self._channel_closed)
        channel.add_on_return_callback(self._returned)
        channel.confirm_delivery(ack_nack_callback=self._confirm, callback=lambda _frame: self._fill())

    def _channel_closed(self, channel: Any, reason: BaseException) -> None:
        if self._error is None and not (self._exhausted and self._confirmed == self._sent):
            self._error = f"the channel closed: {reason!r}"
        self._finish()

    def _returned(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        if self._error is None:
            self._error = (f"a message was returned as unroutable: {method.reply_code} {method.reply_text} (exchange "
                           f"{method.exchange!r}, routing key {method.routing_key!r}): no queue is bound for it")

    def _confirm(self, frame: Any) -> None:
        method = frame.method
        if isinstance(method, pika.spec.Basic.Nack):
            self._error = self._error or f"the broker refused (nacked) message {method.delivery_tag}"
            self._finish()
            return
        self._confirmed = method.delivery_tag if method.multiple else max(self._confirmed, method.delivery_tag)
        if self._error is not None:
            self._finish()
            return
        self._fill()

    def _fill(self) -> None:
        channel = self._channel
        while not self._exhausted and self._sent - self._confirmed < self.window:
            try:
                exchange, routing_key, properties, body = next(self._messages)
            except StopIteration:
                self._exhausted = True
                break
            except BaseException as err:  # raised again by publish_all, outside pika's loop
                self._raised = err
                self._error = "the rows to publish could not be read"
                self._finish()
                return
            channel.basic_publish(exchange, routing_key, body, properties, mandatory=self.mandatory)
            self._sent += 1
        if self._exhausted and self._confirmed >= self._sent:
            self._finish()

    def _check_progress(self) -> None:
        connection = self._connection
        assert connection is not None
        if self._confirmed == self._progress_at and not (self._exhausted and self._confirmed >= self._sent):
            self._error = self._error or f"no confirm from the broker for {self.timeout_s:g} s"
            self._finish()
            return
        self._progress_at = self._confirmed
        connection.ioloop.call_later(self.timeout_s, self._check_progress)

    def _finish(self) -> None:
        connection = self._connection
        assert connection is not None
        if connection.is_open:
            connection.close()  # _closed stops the loop
        elif connection.is_closed:
            connection.ioloop.stop()
