"""Federation links: one federated exchange or queue here, one upstream, two connections.

A link connects to its upstream (a `PeerConnection` over the upstream's URIs, tried in turn) and
to this broker's vhost in-process (the downstream end), and moves messages from the first to the
second. With ack-mode `on-confirm` (the default) a message is acknowledged upstream only once
this broker confirmed it (stored as durably as its queues promise), so a killed broker, on
either side, or a cut network loses nothing: what was not acknowledged upstream is delivered
again (a duplicate when it had reached here: counted in `messages_redelivered`). `on-publish`
acknowledges once it is published here, `no-ack` consumes without acknowledgements.

- `ExchangeLink` (rabbit_federation_exchange_link): declares on the upstream the queue and the
  x-federation-upstream exchange bindings.py names, binds the upstream exchange to it with the
  federated exchange's bindings (and follows their changes), consumes the queue, and publishes
  what comes to the federated exchange here, with x-received-from (message_headers.py).
- `QueueLink` (rabbit_federation_queue_link): consumes the upstream queue, with priority -1,
  only while the queue here has demand (demand.py), and publishes what comes to the queue here.

A link that fails (refused, lost, a refused login, an upstream resource missing) reports the
error in its status and starts again after the upstream's reconnect-delay, counting reconnects;
it never gives up and never stops silently. The upstream's resources are deleted when the link
ends for good (its policy, upstream or exchange went), unless resource-cleanup-mode is `never`,
and kept when the broker stops or the link restarts, so nothing published meanwhile is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Protocol

from pamqp import commands

from amqp_server.federation import bindings as names
from amqp_server.federation.bindings import BIND, BindingMirror, UpstreamBinding
from amqp_server.federation.demand import DemandWatch
from amqp_server.federation.loops import FEDERATION_PURPOSE, INTERNAL_PURPOSE_ARGUMENT
from amqp_server.federation.message_headers import UnreadableHeader, exchange_forward, queue_forward
from amqp_server.federation.status import EXCHANGE, QUEUE, LinkKey, LinkStatus
from amqp_server.federation.upstreams import NO_ACK, ON_CONFIRM, ON_PUBLISH, Upstream, safe_uri
from amqp_server.peer_link import methods
from amqp_server.peer_link.client import (
    ChannelClosed, EndHandler, LinkError, LocalOpener, PeerConnection, SilentHandler,
)
from amqp_server.peer_link.confirms import ConfirmWindow
from amqp_server.peer_link.reconnecting import AddressCycle, connect_first
from amqp_server.peer_link.uri import PeerAddress, parse_uri
from exchanges.federation_upstream import DOWNSTREAM_NAME_ARGUMENT, DOWNSTREAM_VHOST_ARGUMENT, MAX_HOPS_ARGUMENT

if TYPE_CHECKING:
    from amqp_server.broker.vhost import VirtualHost

log = logging.getLogger(__name__)

# A reconnect-delay of 0 still waits this long: a refused connection fails at once, and retrying
# it in a loop would take the event loop.
MIN_RECONNECT_DELAY_S = 0.2
CONNECTION_NOT_FOUND = 404
COMMAND_INVALID = 503


def upstream_address(uri: str, local_vhost: str) -> PeerAddress:
    """The address of one of an upstream's URIs; a URI that names no vhost means the federated
    exchange's or queue's own vhost (amqp_uri:parse(URI, vhost(XorQ)))."""
    return parse_uri(uri, local_vhost)


def local_address(vhost: str) -> PeerAddress:
    """This broker's vhost, reached in-process."""
    return parse_uri("amqp://", vhost)


def connection_name(upstream: str, policy: str | None) -> str:
    """RabbitMQ's name for a link's connections."""
    if policy is None:
        return "Federation link"
    return f"Federation link (upstream: {upstream}, policy: {policy})"


class LinkHost(Protocol):
    """What a link needs of the federation component that runs it."""

    @property
    def cluster_name(self) -> str: ...

    @property
    def local_opener(self) -> LocalOpener | None: ...

    @property
    def local_credentials(self) -> tuple[str, str] | None: ...

    def vhost(self, name: str) -> "VirtualHost | None": ...


class _Link:
    """What both kinds of link share: the connections, the run loop, the confirms."""

    kind = ""

    def __init__(self, host: LinkHost, vhost: str, name: str, upstream: Upstream, policy: str | None) -> None:
        self.host = host
        self.vhost_name = vhost
        self.name = name  # the exchange or queue here
        self.upstream = upstream
        self.policy = policy
        self.addresses = AddressCycle([upstream_address(uri, vhost) for uri in upstream.uris])
        upstream_name = upstream.exchange if self.kind == EXCHANGE else upstream.queue
        self.key = LinkKey(vhost, self.kind, name, upstream.name, upstream_name)
        self.status = LinkStatus(self.key, safe_uri(upstream.uris[0]),
                                 consumer_tag=upstream.consumer_tag if self.kind == QUEUE else None)
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._cleanup_on_stop = False
        self._up: PeerConnection | None = None
        self._down: PeerConnection | None = None
        self._up_channel = 0
        self._down_channel = 0
        self._ended: asyncio.Future[LinkError] | None = None
        # on-confirm: the upstream delivery tags of what is published here and not confirmed
        self._unconfirmed = ConfirmWindow()
        # on-publish: the upstream tag one multiple ack covers at the end of this turn (0: none)
        self._ack_upto = 0
        self._ack_scheduled = False
        self.upstream_cluster: str | None = None
        self.upstream_vhost = ""

    # -- running ----------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"federation link {self.key}")

    async def stop(self, cleanup: bool) -> None:
        """End the link; `cleanup`: it ends for good, so its resources on the upstream go too
        (unless resource-cleanup-mode is never)."""
        self._stopping = True
        self._cleanup_on_stop = cleanup and self.upstream.resource_cleanup
        if self._ended is not None and not self._ended.done():
            self._ended.set_result(LinkError("link stopped", 200))
        task = self._task
        if task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout=10)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                task.cancel()
            except Exception:  # noqa: BLE001 - logged by _run
                pass

    @property
    def unconfirmed_count(self) -> int:
        """Messages published here and not confirmed yet (on-confirm)."""
        return len(self._unconfirmed)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _run(self) -> None:
        while not self._stopping:
            self.status.connecting(safe_uri(self.addresses.current.uri))
            loop = asyncio.get_running_loop()
            self._ended = loop.create_future()
            try:
                await self._start_session()
                if self._ended.done():
                    raise self._ended.result()
                self.status.connected(self.local_connection_name)
                log.info("federation link %s: running, consuming from %s", self.describe(),
                         self.addresses.current.redacted)
                error = await self._ended
                if self._stopping:
                    break
                raise error
            except LinkError as error:
                if self._stopping:
                    break
                self._failed(error.text)
            except Exception as error:  # a bug here must not end the link silently
                log.exception("federation link %s failed", self.describe())
                self._failed(f"{type(error).__name__}: {error}")
            finally:
                await self._end_session()
            if self._stopping:
                break
            try:
                await asyncio.sleep(max(self.upstream.reconnect_delay_s, MIN_RECONNECT_DELAY_S))
            except asyncio.CancelledError:
                break
        await self._end_session()
        if self._cleanup_on_stop:
            await self._clean_up_upstream()

    def _failed(self, text: str) -> None:
        delay = max(self.upstream.reconnect_delay_s, MIN_RECONNECT_DELAY_S)
        self.status.failed(text, delay)
        log.warning("federation link %s: %s; reconnecting in %g s (reconnects so far: %d)", self.describe(), text,
                    delay, self.status.reconnects)

    def describe(self) -> str:
        return f"{self.kind} '{self.name}' in vhost '{self.vhost_name}' from upstream '{self.upstream.name}'"

    @property
    def local_connection_name(self) -> str:
        return connection_name(self.upstream.name, self.policy)

    def cancelled(self, source: bool, consumer_tag: str) -> None:
        self.link_failed(LinkError(f"the {'upstream' if source else 'local'} broker cancelled "
                                   f"consumer {consumer_tag} (basic.cancel)"))

    def link_failed(self, error: LinkError) -> None:
        """A connection failed, or a consumer was cancelled: the session ends."""
        if self._ended is not None and not self._ended.done():
            self._ended.set_result(error)

    async def _start_session(self) -> None:
        name = self.local_connection_name
        self._down = PeerConnection(local_address(self.vhost_name), EndHandler(self, source=False), name,
                                    self.host.local_opener, self.host.local_credentials)
        await self._down.open()
        self._down_channel = await self._down.open_channel()
        self._unconfirmed.clear()
        self._ack_upto = 0
        if self.upstream.ack_mode == ON_CONFIRM:
            await self._down.call(self._down_channel, commands.Confirm.Select(), commands.Confirm.SelectOk)
        self._up = await connect_first(self.addresses, EndHandler(self, source=True), name, self.host.local_opener,
                                       self.host.local_credentials)
        self.status.use_uri(safe_uri(self.addresses.current.uri))
        self._up_channel = await self._up.open_channel()
        cluster = self._up.server_properties.get("cluster_name")
        self.upstream_cluster = cluster.decode() if isinstance(cluster, bytes) else cluster
        self.upstream_vhost = self.addresses.current.vhost
        await self._set_up_upstream()

    async def _end_session(self) -> None:
        for connection in (self._up, self._down):
            if connection is not None:
                connection.close("federation link stopped" if self._stopping else "federation link restarting")
        self._up = self._down = None
        self._unconfirmed.clear()
        self._ack_upto = 0

    async def _set_up_upstream(self) -> None:
        raise NotImplementedError

    async def _clean_up_upstream(self) -> None:
        """Delete what the link made on the upstream (it ended for good)."""

    async def _one_off(self, method: Any, *replies: type) -> Any:
        """`method` on a connection of its own to the current upstream address: a refusal that
        closes the connection (503 for an exchange type the upstream lacks) is the answer, not
        a failure of the link. The LinkError when refused."""
        connection = PeerConnection(self.addresses.current, SilentHandler(), "Disposable federation link connection",
                                    self.host.local_opener, self.host.local_credentials)
        try:
            await connection.open()
            channel = await connection.open_channel()
            return await connection.call(channel, method, *replies)
        finally:
            connection.close()

    async def _exists(self, method: Any, reply: type) -> bool:
        """Does the upstream have what a passive declare (`method`) names? Asked on a channel of
        its own, which a 404 closes without touching the link's."""
        up = self._up
        assert up is not None
        channel = await up.open_channel()
        try:
            await up.call(channel, method, reply)
        except ChannelClosed as error:
            if error.code == CONNECTION_NOT_FOUND:
                return False
            raise
        await up.call(channel, commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0),
                      commands.Channel.CloseOk)
        return True

    # -- messages ---------------------------------------------------------------------------

    def delivered(self, tag: int, redelivered: bool, exchange: str, routing_key: str, raw_header: bytes,
                  body: bytes) -> None:
        up, down = self._up, self._down
        if up is None or down is None:
            return
        self.status.count_received(redelivered)
        try:
            header = self._forwarded_header(raw_header, redelivered, exchange, routing_key)
        except UnreadableHeader as error:
            log.warning("federation link %s: a message's header is unreadable (%s): rejected upstream",
                        self.describe(), error)
            self.status.count_dropped()
            if self.upstream.ack_mode != NO_ACK:
                up.nack(self._up_channel, tag, requeue=False)
            return
        if header is None:  # it must not cross (loops.py): dropped, and acknowledged
            self.status.count_dropped()
            if self.upstream.ack_mode != NO_ACK:
                up.ack(self._up_channel, tag)
                self.status.count_acked_upstream()
            return
        exchange_here, key_here = self._destination(routing_key)
        down.publish(self._down_channel, exchange_here, key_here, header, body)
        mode = self.upstream.ack_mode
        if mode == ON_CONFIRM:
            self._unconfirmed.published(tag)
        elif mode == ON_PUBLISH:
            self.status.count_confirmed()
            self.status.count_acked_upstream()
            self._ack_upto = tag
            if not self._ack_scheduled:
                self._ack_scheduled = True
                asyncio.get_running_loop().call_soon(self._ack_published)
        else:
            self.status.count_confirmed()
        self.after_delivery()

    def confirmed(self, seq: int, multiple: bool, ack: bool) -> None:
        """A confirm here: acknowledge what it covers upstream (a nack requeues there: refused)."""
        up = self._up
        if up is None:
            return
        last_tag, count = self._unconfirmed.settle(seq, multiple, ack, self)
        if last_tag:
            up.ack(self._up_channel, last_tag, multiple=count > 1)
            self.status.count_confirmed(count)
            self.status.count_acked_upstream(count)

    def _ack_published(self) -> None:
        """on-publish: one multiple ack per event-loop turn for what was published in it (as
        the shovel's); what was dropped or rejected before it is settled already."""
        self._ack_scheduled = False
        up, tag = self._up, self._ack_upto
        self._ack_upto = 0
        if up is not None and tag:
            up.ack(self._up_channel, tag, multiple=True)

    def refused(self, tag: int) -> None:
        """This broker nacked the message with upstream tag `tag`: requeued upstream."""
        if self._up is not None:
            self._up.nack(self._up_channel, tag, requeue=True)

    def destination_paused(self, paused: bool) -> None:
        if self._up is not None:
            if paused:
                self._up.pause_reading()
            else:
                self._up.resume_reading()

    def after_delivery(self) -> None:
        pass

    def _forwarded_header(self, raw_header: bytes, redelivered: bool, exchange: str, routing_key: str
                          ) -> bytes | None:
        raise NotImplementedError

    def _destination(self, routing_key: str) -> tuple[str, str]:
        raise NotImplementedError


class ExchangeLink(_Link):
    """Federates exchange `name` of `vhost` from `upstream` (see the module docstring)."""

    kind = EXCHANGE

    def __init__(self, host: LinkHost, vhost: str, name: str, upstream: Upstream, policy: str | None) -> None:
        super().__init__(host, vhost, name, upstream, policy)
        self.mirror: BindingMirror | None = None
        self._commands: asyncio.Queue[UpstreamBinding] | None = None
        self._command_task: asyncio.Task[None] | None = None
        self._upstream_queue = ""
        self._internal_exchange = ""

    async def _set_up_upstream(self) -> None:
        up, channel, upstream = self._up, self._up_channel, self.upstream
        assert up is not None
        vhost = self.host.vhost(self.vhost_name)
        exchange = vhost.exchanges.get(self.name) if vhost is not None else None
        if exchange is None:
            raise LinkError(f"exchange '{self.name}' in vhost '{self.vhost_name}' is gone")
        await self._ensure_upstream_exchange(exchange)
        queue = names.upstream_queue_name(upstream.exchange, self.upstream_vhost, self.host.cluster_name,
                                          self.vhost_name, self.name)
        self._upstream_queue = queue
        arguments: dict[str, Any] = {}
        if upstream.expires_ms is not None:
            arguments["x-expires"] = upstream.expires_ms
        if upstream.message_ttl_ms is not None:
            arguments["x-message-ttl"] = upstream.message_ttl_ms
        arguments[INTERNAL_PURPOSE_ARGUMENT] = FEDERATION_PURPOSE
        await up.call(channel, methods.queue_declare(queue=queue, durable=True, arguments=arguments),
                      commands.Queue.DeclareOk)
        no_ack = upstream.ack_mode == NO_ACK
        if not no_ack:
            await up.call(channel, commands.Basic.Qos(prefetch_count=upstream.prefetch_count), commands.Basic.QosOk)
        await up.call(channel, methods.basic_consume(queue=queue, no_ack=no_ack), commands.Basic.ConsumeOk)
        # The internal exchange: the one of the two names that is not there now, so that the
        # old bindings keep routing into the queue until the new ones are all in place.
        old_suffix = await self._active_suffix(queue)
        suffix = names.other_suffix(old_suffix) if old_suffix is not None else names.SUFFIXES[0]
        internal = names.internal_exchange_name(queue, suffix)
        self._internal_exchange = internal
        await self._declare_internal_exchange(internal)
        await up.call(channel, methods.queue_bind(queue=queue, exchange=internal), commands.Queue.BindOk)
        # The bindings as they are now, taken in the same event-loop turn as the mirror is made:
        # every later change is a binding_added / binding_removed on it, in order.
        mirror = BindingMirror(max_hops=upstream.max_hops, cluster_name=self.host.cluster_name,
                               vhost=self.vhost_name, exchange=self.name, suffix=suffix,
                               upstream_cluster=self.upstream_cluster, upstream_vhost=self.upstream_vhost)
        self._commands = asyncio.Queue()
        for destination, routing_key, binding_arguments in exchange.bindings():
            command = mirror.added(destination, routing_key, binding_arguments)
            if command is not None:
                self._commands.put_nowait(command)
        self.mirror = mirror
        await self._send_commands_until_empty()
        if old_suffix is not None:
            await up.call(channel, methods.exchange_delete(exchange=names.internal_exchange_name(queue, old_suffix)),
                          commands.Exchange.DeleteOk)
        self._command_task = asyncio.get_running_loop().create_task(self._send_commands())

    async def _ensure_upstream_exchange(self, exchange: Any) -> None:
        """The upstream exchange as it is there, or declared like the federated one."""
        up, channel = self._up, self._up_channel
        assert up is not None
        if await self._exists(methods.exchange_declare(exchange=self.upstream.exchange, passive=True),
                              commands.Exchange.DeclareOk):
            return
        await up.call(channel, methods.exchange_declare(
            exchange=self.upstream.exchange, exchange_type=exchange.type_name, durable=exchange.durable,
            auto_delete=exchange.auto_delete, internal=exchange.internal, arguments=dict(exchange.arguments)),
            commands.Exchange.DeclareOk)

    async def _active_suffix(self, queue: str) -> str | None:
        """Which internal exchange the last run left on the upstream (None: neither)."""
        for suffix in names.SUFFIXES:
            if await self._exists(methods.exchange_declare(exchange=names.internal_exchange_name(queue, suffix),
                                                            passive=True), commands.Exchange.DeclareOk):
                return suffix
        return None

    async def _declare_internal_exchange(self, internal: str) -> None:
        """An x-federation-upstream exchange, or a fanout one where the upstream has no such
        type (503): this end then does the loop check alone."""
        up, channel = self._up, self._up_channel
        assert up is not None
        purpose: dict[str, Any] = {INTERNAL_PURPOSE_ARGUMENT: FEDERATION_PURPOSE}
        arguments: dict[str, Any] = {MAX_HOPS_ARGUMENT: self.upstream.max_hops, DOWNSTREAM_NAME_ARGUMENT: self.host.cluster_name,
                     DOWNSTREAM_VHOST_ARGUMENT: self.vhost_name, **purpose}
        try:
            await self._one_off(methods.exchange_declare(
                exchange=internal, exchange_type="x-federation-upstream", durable=True, internal=True,
                auto_delete=True, arguments=arguments), commands.Exchange.DeclareOk)
        except LinkError as error:
            if error.code != COMMAND_INVALID:
                raise
            await up.call(channel, methods.exchange_declare(
                exchange=internal, exchange_type="fanout", durable=True, internal=True, auto_delete=True,
                arguments=purpose), commands.Exchange.DeclareOk)

    def binding_changed(self, added: bool, destination: Hashable, routing_key: str, arguments: dict[str, Any]) -> None:
        """A binding of the federated exchange appeared (added) or went: tell the upstream."""
        mirror, queue = self.mirror, self._commands
        if mirror is None or queue is None:
            return  # not connected: the next session starts from the bindings as they are then
        command = (mirror.added if added else mirror.removed)(destination, routing_key, arguments)
        if command is not None:
            queue.put_nowait(command)

    async def _send_commands_until_empty(self) -> None:
        queue = self._commands
        assert queue is not None
        while not queue.empty():
            await self._send(queue.get_nowait())

    async def _send_commands(self) -> None:
        queue = self._commands
        assert queue is not None
        try:
            while True:
                await self._send(await queue.get())
        except LinkError as error:
            self.link_failed(error)
        except asyncio.CancelledError:
            pass

    async def _send(self, command: UpstreamBinding) -> None:
        up = self._up
        if up is None:
            return
        if command.action == BIND:
            method: Any = methods.exchange_bind(destination=self._internal_exchange, source=self.upstream.exchange,
                                                 routing_key=command.routing_key, arguments=command.arguments)
            await up.call(self._up_channel, method, commands.Exchange.BindOk)
        else:
            method = methods.exchange_unbind(destination=self._internal_exchange, source=self.upstream.exchange,
                                              routing_key=command.routing_key, arguments=command.arguments)
            await up.call(self._up_channel, method, commands.Exchange.UnbindOk)

    async def _end_session(self) -> None:
        self.mirror = None
        task, self._command_task = self._command_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._commands = None
        await super()._end_session()

    async def _clean_up_upstream(self) -> None:
        if not self._upstream_queue:
            return
        for method, reply in ((methods.queue_delete(queue=self._upstream_queue), commands.Queue.DeleteOk),
                              (methods.exchange_delete(exchange=self._internal_exchange), commands.Exchange.DeleteOk)):
            try:
                await self._one_off(method, reply)
            except LinkError as error:
                log.warning("federation link %s: could not delete %s on the upstream: %s", self.describe(),
                            self._upstream_queue, error.text)

    def _forwarded_header(self, raw_header: bytes, redelivered: bool, exchange: str, routing_key: str
                          ) -> bytes | None:
        return exchange_forward(
            raw_header, max_hops=self.upstream.max_hops, downstream_name=self.host.cluster_name,
            downstream_vhost=self.vhost_name, uri=self.status.uri, exchange=self.name, redelivered=redelivered,
            upstream_cluster=self.upstream_cluster, upstream_vhost=self.upstream_vhost,
            trust_user_id=self.upstream.trust_user_id)

    def _destination(self, routing_key: str) -> tuple[str, str]:
        return self.name, routing_key


class QueueLink(_Link):
    """Federates queue `name` of `vhost` from `upstream` (see the module docstring)."""

    kind = QUEUE

    def __init__(self, host: LinkHost, vhost: str, name: str, upstream: Upstream, policy: str | None) -> None:
        super().__init__(host, vhost, name, upstream, policy)
        self.demand = DemandWatch()
        self._consuming = False
        self._demand_task: asyncio.Task[None] | None = None
        self._demand_changed: asyncio.Event | None = None

    async def _set_up_upstream(self) -> None:
        up, channel, upstream = self._up, self._up_channel, self.upstream
        assert up is not None
        capabilities = self._up.server_properties.get("capabilities") if self._up is not None else None
        if not isinstance(capabilities, dict) or capabilities.get("consumer_priorities") is not True:
            raise LinkError("upstream_lacks_consumer_priorities: the upstream does not take consumer priorities")
        vhost = self.host.vhost(self.vhost_name)
        queue = vhost.queues.get(self.name) if vhost is not None else None
        if queue is None:
            raise LinkError(f"queue '{self.name}' in vhost '{self.vhost_name}' is gone")
        if not await self._exists(methods.queue_declare(queue=upstream.queue, passive=True),
                                  commands.Queue.DeclareOk):
            await up.call(channel, methods.queue_declare(queue=upstream.queue, durable=queue.durable,
                                                         auto_delete=queue.auto_delete,
                                                         arguments=dict(queue.arguments)), commands.Queue.DeclareOk)
        if upstream.ack_mode != NO_ACK:
            await up.call(channel, commands.Basic.Qos(prefetch_count=upstream.prefetch_count), commands.Basic.QosOk)
        self.demand.reset()
        self._consuming = False
        self._demand_changed = asyncio.Event()
        self._demand_task = asyncio.get_running_loop().create_task(self._follow_demand())
        self.check_demand()

    def check_demand(self) -> None:
        """Look at the queue's demand now (the federation's demand ticker calls this every
        DEMAND_CHECK_S for every queue link, and the link after each message it brought in);
        a change wakes the link to consume or cancel upstream."""
        changed = self._demand_changed
        if changed is None:
            return
        vhost = self.host.vhost(self.vhost_name)
        queue = vhost.queues.get(self.name) if vhost is not None else None
        if queue is not None and self.demand.changed(queue):
            changed.set()

    def after_delivery(self) -> None:
        self.check_demand()

    async def _follow_demand(self) -> None:
        """Consume upstream while the queue here wants messages, and only then."""
        changed = self._demand_changed
        assert changed is not None
        try:
            while True:
                await changed.wait()
                changed.clear()
                await self._consume(self.demand.wanted)
        except LinkError as error:
            self.link_failed(error)
        except asyncio.CancelledError:
            pass

    async def _consume(self, wanted: bool) -> None:
        up = self._up
        if up is None or wanted == self._consuming:
            return
        if wanted:
            await up.call(self._up_channel, methods.basic_consume(
                queue=self.upstream.queue, consumer_tag=self.upstream.consumer_tag,
                no_ack=self.upstream.ack_mode == NO_ACK, arguments={"x-priority": -1}), commands.Basic.ConsumeOk)
        else:
            await up.call(self._up_channel, methods.basic_cancel(consumer_tag=self.upstream.consumer_tag),
                          commands.Basic.CancelOk)
        self._consuming = wanted

    async def _end_session(self) -> None:
        task, self._demand_task = self._demand_task, None
        self._demand_changed = None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._consuming = False
        await super()._end_session()

    def _forwarded_header(self, raw_header: bytes, redelivered: bool, exchange: str, routing_key: str
                          ) -> bytes | None:
        return queue_forward(raw_header, uri=self.status.uri, queue=self.name, redelivered=redelivered,
                             exchange=exchange, routing_key=routing_key, trust_user_id=self.upstream.trust_user_id)

    def _destination(self, routing_key: str) -> tuple[str, str]:
        return "", self.name


Link = ExchangeLink | QueueLink
LinkFactory = Callable[[LinkHost, str, str, Upstream, "str | None"], Link]
