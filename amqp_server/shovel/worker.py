"""One running shovel: its two links, the messages between them, its state.

A `Shovel` connects to the destination, then to the source (the first URI of each list that
answers), sets both up (the destination queue declared if missing, confirm.select for
on-confirm; the source queue declared if missing, or a private queue bound to the source
exchange; basic.qos with the prefetch; basic.consume), and pumps:

- each delivery from the source is published to the destination at once, its content header
  passed on as it came (re-encoded only to add forward or timestamp headers or set
  dest-publish-properties);
- on-confirm: the source tag waits in the link's `ConfirmWindow` (peer_link/confirms.py); a
  confirm (single or multiple) settles the tags it covers, and the source gets one `multiple`
  ack up to the last tag of the settled prefix, so an ack never covers a message the
  destination has not confirmed. A nack from the destination nacks (requeues) that message on
  the source. on-publish: the source is acked once per event-loop turn up to the last tag
  published. no-ack: the consumer acks nothing;
- the destination's buffer passing its high-water mark stops reading from the source until it
  drains (with the prefetch, this bounds what the shovel holds).

Nothing per message but the deque entry of an unconfirmed one: no task, future or closure.

States (one transition table): STARTING (connecting, or waiting `reconnect-delay` after a
failure, with the reconnect count and the last error reported), RUNNING, TERMINATED (a
permanent error such as a refused login, a missing exchange or a refused declaration, or
reconnect-delay 0 and a failure: the error text is the reason; a restart starts it again).
A shovel with src-delete-after ends when it has moved that many messages and tells its owner
(`on_done`), which deletes a dynamic shovel's parameter as RabbitMQ does.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from pamqp import commands
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from amqp_server.peer_link import methods
from amqp_server.peer_link.client import ChannelClosed, EndHandler, LinkError, LocalOpener, PeerConnection
from amqp_server.peer_link.confirms import ConfirmWindow
from amqp_server.peer_link.reconnecting import AddressCycle, Reconnects, connect_first, is_permanent
from amqp_server.shovel.definition import (
    FORWARD_HEADER, PROTOCOL, TIMESTAMP_HEADER, AckMode, DeleteAfter, ShovelDefinition,
)
from amqp_server.wire import errors

log = logging.getLogger(__name__)

TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S"
_PROPERTY_NAMES = {"type": "message_type"}  # RabbitMQ's name -> pamqp's
_PROPERTY_SLOTS = tuple(Basic.Properties.__slots__)  # the basic properties, by pamqp's names


class ShovelState(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    TERMINATED = "terminated"


TRANSITIONS: dict[ShovelState, frozenset[ShovelState]] = {
    ShovelState.STARTING: frozenset((ShovelState.RUNNING, ShovelState.TERMINATED)),
    ShovelState.RUNNING: frozenset((ShovelState.STARTING, ShovelState.TERMINATED)),
    ShovelState.TERMINATED: frozenset((ShovelState.STARTING,)),
}


class _Completed(Exception):
    """The shovel moved what src-delete-after asked for."""


class ShovelCounters:
    """What a shovel moved since it was made (across reconnects)."""

    __slots__ = ("forwarded", "acked", "nacked", "bytes_forwarded")

    def __init__(self) -> None:
        self.forwarded = 0  # published to the destination
        self.acked = 0  # settled on the source (confirmed, published or no-ack)
        self.nacked = 0  # refused by the destination, requeued on the source
        self.bytes_forwarded = 0

    def count_forwarded(self, size: int) -> None:
        self.forwarded += 1
        self.bytes_forwarded += size

    def count_acked(self, count: int) -> None:
        self.acked += count

    def count_nacked(self) -> None:
        self.nacked += 1


class Shovel:
    """A shovel's worker (see the module docstring)."""

    def __init__(self, definition: ShovelDefinition, node: str, cluster_name: str,
                 on_done: Callable[["Shovel"], None], local_opener: LocalOpener | None = None,
                 local_credentials: tuple[str, str] | None = None) -> None:
        self.definition = definition
        self._node = node
        self._cluster_name = cluster_name
        self._on_done = on_done
        self._local_opener = local_opener
        self._local_credentials = local_credentials
        self.state = ShovelState.STARTING
        self.changed_at = time.time()
        self.reason: str | None = None  # why it terminated
        self.reconnects = Reconnects(definition.reconnect_delay_s)
        self.counters = ShovelCounters()
        self._sources = AddressCycle(list(definition.src_uris))
        self._destinations = AddressCycle(list(definition.dest_uris))
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # -- one connection attempt's ---------------------------------------------------------
        self._source: PeerConnection | None = None
        self._destination: PeerConnection | None = None
        self._src_channel = 0
        self._dest_channel = 0
        self._consumer_tag = ""
        self._ended: asyncio.Future[None] | None = None
        self._unconfirmed = ConfirmWindow()
        self._ack_upto = 0  # on-publish: the source tag acked at the end of this turn
        self._acked_tag = 0  # on-publish: the last source tag acked
        self._ack_scheduled = False
        self._left = -1  # messages src-delete-after still lets through (-1: no limit)
        self._consuming = False
        self._header_cache: tuple[bytes, bytes] | None = None  # (raw header in, raw header out)

    def __repr__(self) -> str:
        return f"<Shovel {self.definition.vhost!r}/{self.definition.name!r} {self.state.value}>"

    # -- life cycle ------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is not None and not self._task.done():
            return
        self._loop = asyncio.get_running_loop()
        if self.state is ShovelState.TERMINATED:
            self._enter(ShovelState.STARTING)
            self.reason = None
        self._task = self._loop.create_task(self._run(), name=f"shovel {self.definition.vhost}/{self.definition.name}")

    async def stop(self) -> None:
        """Stop pumping and close both links (what is unconfirmed goes back to the source queue)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._close_links("shovel stopped")

    async def restart(self) -> None:
        await self.stop()
        self.reconnects = Reconnects(self.definition.reconnect_delay_s)
        self.start()

    def _enter(self, state: ShovelState) -> None:
        if state is self.state:
            return
        if state not in TRANSITIONS[self.state]:
            raise RuntimeError(f"shovel {self.definition.name}: {self.state.value} -> {state.value} is not a transition")
        self.state = state
        self.changed_at = time.time()

    async def _run(self) -> None:
        definition = self.definition
        while True:
            try:
                await self._connect_and_pump()
            except _Completed:
                self._close_links("shovel completed")
                log.info("shovel '%s' in vhost '%s' moved what src-delete-after asked for: %d message(s)",
                         definition.name, definition.vhost, self.counters.acked)
                self._terminate("completed")
                self._on_done(self)
                return
            except LinkError as error:
                self._close_links("shovel reconnecting")
                self.reconnects.failed(error)
                if is_permanent(error) or definition.reconnect_delay_s <= 0:
                    log.error("shovel '%s' in vhost '%s' terminated: %s", definition.name, definition.vhost,
                              error.text)
                    self._terminate(error.text)
                    return
                if self.state is ShovelState.RUNNING:
                    self._enter(ShovelState.STARTING)
                log.warning("shovel '%s' in vhost '%s' failed (%s); reconnecting in %g s (reconnect %d)",
                            definition.name, definition.vhost, error.text, definition.reconnect_delay_s,
                            self.reconnects.count + 1)
                await asyncio.sleep(definition.reconnect_delay_s)
                self.reconnects.retrying()
            except Exception as error:  # a bug must cost this shovel, never the broker
                log.exception("shovel '%s' in vhost '%s' failed", definition.name, definition.vhost)
                self._close_links("shovel failed")
                self._terminate(f"internal error: {error!r}")
                return

    def _terminate(self, reason: str) -> None:
        self.reason = reason
        self._enter(ShovelState.TERMINATED)

    # -- connecting and setting up -------------------------------------------------------------

    async def _connect_and_pump(self) -> None:
        definition = self.definition
        loop = asyncio.get_running_loop()
        self._ended = loop.create_future()
        self._reset_flow()
        name = f"Shovel {definition.name}"
        self._destination = await connect_first(self._destinations, EndHandler(self, source=False), name,
                                                self._local_opener, self._local_credentials)
        self._source = await connect_first(self._sources, EndHandler(self, source=True), name,
                                           self._local_opener, self._local_credentials)
        await self._set_up_destination(self._destination)
        await self._set_up_source(self._source)
        self._enter(ShovelState.RUNNING)
        log.info("shovel '%s' in vhost '%s' running: %s -> %s", definition.name, definition.vhost,
                 self._sources.current.redacted, self._destinations.current.redacted)
        await self._ended

    async def _set_up_destination(self, link: PeerConnection) -> None:
        definition = self.definition
        self._dest_channel = await link.open_channel()
        if definition.dest_queue is not None:
            await self._ensure_queue(link, definition.dest_queue, definition.dest_queue_args)
        if definition.ack_mode is AckMode.ON_CONFIRM:
            await link.call(self._dest_channel, commands.Confirm.Select(), commands.Confirm.SelectOk)

    async def _set_up_source(self, link: PeerConnection) -> None:
        definition = self.definition
        channel = self._src_channel = await link.open_channel()
        if definition.src_queue is not None:
            queue = definition.src_queue
            count = await self._ensure_queue(link, queue, definition.src_queue_args)
            channel = self._src_channel  # (a new one if the passive declare's 404 closed the first)
        else:
            declared = await link.call(channel, methods.queue_declare(exclusive=True), commands.Queue.DeclareOk)
            queue, count = declared.queue, 0
            await link.call(channel, methods.queue_bind(queue=queue, exchange=definition.src_exchange or "",
                                                         routing_key=definition.src_exchange_key),
                            commands.Queue.BindOk)
        if definition.delete_after is DeleteAfter.QUEUE_LENGTH:
            self._left = count
        elif definition.delete_after is DeleteAfter.COUNT:
            self._left = max(definition.delete_after_count - self.counters.acked, 0)
        if self._left == 0:  # nothing to move (an empty queue and queue-length): done
            self._complete()
            return
        no_ack = definition.ack_mode is AckMode.NO_ACK
        if not no_ack:
            prefetch = definition.prefetch if self._left < 0 else min(definition.prefetch, self._left)
            await link.call(channel, commands.Basic.Qos(prefetch_count=prefetch), commands.Basic.QosOk)
        # Deliveries may follow consume-ok in the same read, before this coroutine resumes: the
        # shovel consumes (and may cancel, src-delete-after) from the moment it asks.
        self._consuming = True
        self._consumer_tag = f"amq.ctag-shovel-{os.urandom(8).hex()}"
        await link.call(channel, methods.basic_consume(
            queue=queue, consumer_tag=self._consumer_tag, no_ack=no_ack,
            arguments=definition.src_consumer_args or None), commands.Basic.ConsumeOk)

    async def _ensure_queue(self, link: PeerConnection, queue: str, arguments: dict[str, Any]) -> int:
        """The queue's message count: declared passively, or declared durable with `arguments`
        when it does not exist (as RabbitMQ's shovel). The channel a 404 closes is reopened."""
        try:
            reply = await link.call(self._channel_of(link), methods.queue_declare(queue=queue, passive=True),
                                    commands.Queue.DeclareOk)
        except ChannelClosed as closed:
            if closed.code != errors.NOT_FOUND:
                raise
            channel = await link.open_channel()
            self._set_channel_of(link, channel)
            reply = await link.call(channel, methods.queue_declare(queue=queue, durable=True,
                                                                   arguments=arguments or None),
                                    commands.Queue.DeclareOk)
        return int(reply.message_count)

    def _channel_of(self, link: PeerConnection) -> int:
        return self._src_channel if link is self._source else self._dest_channel

    def _set_channel_of(self, link: PeerConnection, channel: int) -> None:
        if link is self._source:
            self._src_channel = channel
        else:
            self._dest_channel = channel

    def _reset_flow(self) -> None:
        self._unconfirmed.clear()
        self._ack_upto = 0
        self._acked_tag = 0
        self._left = -1
        self._consuming = False

    def _close_links(self, reason: str) -> None:
        for link in (self._source, self._destination):
            if link is not None:
                link.close(reason)
        self._source = self._destination = None

    # -- pumping (the per-message path) ----------------------------------------------------------

    def delivered(self, tag: int, redelivered: bool, exchange: str, routing_key: str, raw_header: bytes,
                  body: bytes) -> None:
        """A delivery from the source: published to the destination at once."""
        source, destination = self._source, self._destination
        if source is None or destination is None:
            return
        definition = self.definition
        if not self._consuming:  # past src-delete-after: back to the source queue
            if definition.ack_mode is not AckMode.NO_ACK:
                source.nack(self._src_channel, tag, requeue=True)
            return
        if definition.rewrites_properties:
            raw_header = self._rewritten(raw_header)
        target_exchange, target_key = definition.routing(exchange, routing_key)
        destination.publish(self._dest_channel, target_exchange, target_key, raw_header, body)
        self.counters.count_forwarded(len(body))
        mode = definition.ack_mode
        if mode is AckMode.ON_CONFIRM:
            self._unconfirmed.published(tag)
        elif mode is AckMode.ON_PUBLISH:
            self._ack_upto = tag
            if not self._ack_scheduled:
                self._ack_scheduled = True
                asyncio.get_running_loop().call_soon(self._ack_published)
        else:
            self.counters.count_acked(1)
        if self._left > 0:
            self._left -= 1
            if self._left == 0:
                self._stop_consuming()

    def _ack_published(self) -> None:
        """on-publish: one multiple ack per turn for what was published in it."""
        self._ack_scheduled = False
        source = self._source
        if source is None or not self._ack_upto:
            return
        source.ack(self._src_channel, self._ack_upto, multiple=True)
        self.counters.count_acked(self._ack_upto - self._acked_tag)
        self._acked_tag = self._ack_upto
        self._ack_upto = 0
        if not self._consuming:
            self._complete()

    def confirmed(self, seq: int, multiple: bool, ack: bool) -> None:
        """A confirm from the destination (see the module docstring for what it settles)."""
        source = self._source
        if source is None or not self._unconfirmed:
            return
        last_tag, settled = self._unconfirmed.settle(seq, multiple, ack, self)
        if last_tag:
            # Every source tag up to last_tag was confirmed (or refused and nacked already).
            source.ack(self._src_channel, last_tag, multiple=True)
            self.counters.count_acked(settled)
        if not self._consuming and not self._unconfirmed and self._left == 0:
            self._complete()

    def refused(self, tag: int) -> None:
        """The destination nacked the message with source tag `tag`: back to the source queue."""
        source = self._source
        if source is None:
            return
        source.nack(self._src_channel, tag, multiple=False, requeue=True)
        self.counters.count_nacked()
        if self._left >= 0:
            self._left += 1  # it comes again (once the consumer is back), and counts then

    def _stop_consuming(self) -> None:
        """src-delete-after reached: no more deliveries (those already sent go back)."""
        self._consuming = False
        source = self._source
        if source is not None and self._consumer_tag:
            source.send(self._src_channel, methods.basic_cancel(consumer_tag=self._consumer_tag, nowait=True))
        if self.definition.ack_mode is AckMode.NO_ACK:
            self._complete()
        elif self.definition.ack_mode is AckMode.ON_CONFIRM and not self._unconfirmed:
            self._complete()

    def _complete(self) -> None:
        ended = self._ended
        if ended is not None and not ended.done():
            ended.set_exception(_Completed())

    def destination_paused(self, paused: bool) -> None:
        source = self._source
        if source is not None:
            if paused:
                source.pause_reading()
            else:
                source.resume_reading()

    def cancelled(self, source: bool, consumer_tag: str) -> None:
        if source:
            self.link_failed(LinkError("the source cancelled the shovel's consumer (its queue was deleted)"))

    def link_failed(self, error: LinkError) -> None:
        ended = self._ended
        if ended is not None and not ended.done():
            ended.set_exception(error)

    # -- properties ----------------------------------------------------------------------------

    def _rewritten(self, raw_header: bytes) -> bytes:
        """The content header with the forward and timestamp headers and dest-publish-properties."""
        definition = self.definition
        header = ContentHeader()
        header.unmarshal(raw_header)
        given = header.properties
        values = {name: getattr(given, name) for name in _PROPERTY_SLOTS}
        for key, value in definition.publish_properties.items():
            if key == "timestamp":
                value = datetime.fromtimestamp(value, timezone.utc)
            values[_PROPERTY_NAMES.get(key, key)] = value
        if definition.forward_headers or definition.timestamp_header:
            headers = dict(values["headers"] or {})
            if definition.forward_headers:
                earlier = headers.get(FORWARD_HEADER)
                headers[FORWARD_HEADER] = [self._forward_record(), *(earlier if isinstance(earlier, list) else [])]
            if definition.timestamp_header:
                headers[TIMESTAMP_HEADER] = int(time.time())
            values["headers"] = headers
        return ContentHeader(header.weight, header.body_size, Basic.Properties(**values)).marshal()

    def _forward_record(self) -> dict[str, Any]:
        """The table x-shovelled gets for this shovel, as RabbitMQ writes it."""
        definition = self.definition
        record: dict[str, Any] = {
            "shovelled-by": self._cluster_name, "shovel-type": definition.kind, "shovel-name": definition.name,
            "shovel-vhost": definition.vhost, "src-uri": self._sources.current.redacted,
            "dest-uri": self._destinations.current.redacted,
        }
        record.update({key.replace("_", "-"): value for key, value in definition.source_description().items()})
        record.update({key.replace("_", "-"): value for key, value in definition.destination_description().items()})
        return record

    # -- status --------------------------------------------------------------------------------

    @property
    def unconfirmed_count(self) -> int:
        """Messages published and not confirmed yet (on-confirm)."""
        return len(self._unconfirmed)

    def status(self) -> dict[str, Any]:
        """The shovel as GET /api/shovels shows it (RabbitMQ's fields, then the reconnects)."""
        definition = self.definition
        status: dict[str, Any] = {
            "node": self._node,
            "timestamp": time.strftime(TIMESTAMP_FORMAT, time.localtime(self.changed_at)),
            "name": definition.name, "vhost": definition.vhost, "type": definition.kind, "state": self.state.value,
        }
        if self.state is ShovelState.RUNNING:
            status.update({"src_uri": self._sources.current.redacted, "src_protocol": PROTOCOL,
                           "dest_protocol": PROTOCOL, "dest_uri": self._destinations.current.redacted})
            status.update(definition.source_description())
            status.update(definition.destination_description())
        elif self.state is ShovelState.TERMINATED:
            status["reason"] = self.reason
        status.update(self.reconnects.as_json())
        status.update({"messages_forwarded": self.counters.forwarded, "messages_acked": self.counters.acked,
                       "messages_nacked": self.counters.nacked, "messages_unconfirmed": self.unconfirmed_count})
        return status
