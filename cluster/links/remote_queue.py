"""A queue owned by another node, as this node holds it: `RemoteQueue`.

It sits in the vhost's `queues` like any queue, so bindings lead to it and routing finds it;
what it does goes to the owner over the link (cluster_link.py):

- `publish` forwards the message on the owner's forward stream and reports AWAIT_RECEIPT, so the
  publisher's confirm waits for the owner's confirm of that message (`publish_receipt`). With the owner down the
  message is refused (REJECTED: the publisher gets a basic.nack), as RabbitMQ 3.10 rejects
  publishes to a classic queue whose node is down.
- a consumer here is a consumer there, on a mirror channel of its own with its prefetch,
  priority, exclusivity and arguments; the owner decides who gets what (priorities, single
  active consumer) and this node hands each delivery to its client with its own delivery tag.
  Acks, rejects and requeues go back with the owner's tag; the owner's basic.cancel (queue
  deleted) reaches the client as a consumer cancel notification.
- a stand-in of a replicated queue (`keep_consumers_across_leader_changes`) does not cancel its
  consumers when the owner's link goes or the owner cancels them (the leader died or handed the
  queue over): they wait, and when the stand-in is replaced (a new leader took the queue) they
  move to the new form, re-consumed on the new leader (`reattach`) or added to the queue itself
  (docs/replication.md "Consumers at a failover").
- basic.get, queue.purge and queue.declare-ok (its message and consumer counts) ask the owner
  and answer when it does (the queue type's answers, amqp_server/channel/answers.py, which keep
  their place among the channel's other replies).

Memory stays bounded: the owner sends a consumer at most its prefetch (LINK_WINDOW when it has
none) beyond what the client acked, and forwarding stops reading a publisher while the stream
to the owner has FORWARD_HIGH messages unconfirmed.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any


from amqp_server.wire import errors
from cluster.links.link import ForwardStream, LinkState, MirrorChannel, MirrorState, NodeLink, QueueUnavailable
from amqp_server.wire.errors import AMQPError
from queues.arguments import QueueArguments
from queues.arguments.intervals import interval_ms
from queues.arguments.queue_type_rules import STREAM
from queues.consumer import Consumer
from queues.message import Message, QueueEntry
from queues.publish_outcome import AWAIT_RECEIPT, REJECTED
from queues.queue import Queue
from queues.queue_type import ConsumeAnswer, CountsAnswer, GetAnswer
from queues.stream_queue import OFFSET_HEADER, check_consumer_arguments, consume_refusal

if TYPE_CHECKING:
    from amqp_server.channel.channel import Channel
    from cluster.links.node_links import ClusterLinks
    from amqp_server.channel.ordered_replies import SyncCallback
    from queues.timers import Timer, Timers

log = logging.getLogger(__name__)

# A consumer without a prefetch limit gets at most this many unsettled deliveries from the owner
# at a time, so a slow client cannot make this node buffer the whole queue.
LINK_WINDOW = 2000
# How often a replicated queue's stand-in whose consumers wait looks whether its owner serves the
# queue again (the link went without a leader change); a new leader replaces the stand-in instead.
PARKED_RETRY_S = 1.0
# A consumer that waited this long for an owner that the shared definitions say serves the queue
# but that this node cannot reach (a partition: the owner is live for the coordination service,
# its links from here fail) is cancelled (basic.cancel), so its client can move to a node that
# reaches the queue. A leader change (session TTL, 5 s by default, and an election) ends sooner.
PARKED_CANCEL_S = 10.0
# Stands for "a connection of another node" as the exclusive owner: no connection here may use it.
OTHER_NODES_CONNECTION = object()
# The refusals of a re-attach (`reattach`) that may pass, so the consumer waits and tries again:
# 404 is what a node answers for a queue it does not serve, which during a leader change means
# "not yet" (the new leader has not taken it, or this node's link to it dropped: "link lost"
# comes as 404 too). A 404 never outlives the queue: if the queue was really deleted, the
# deletion reaches this node through the shared definitions, deletes this stand-in and cancels
# its consumers. Every other code (403 another consumer's exclusive use, 405 an exclusive
# queue, 406 an argument the owner refuses, ...) is the owner's answer about this consumer on a
# queue it serves: asking again gets the same answer for ever, so the consumer is cancelled
# (basic.cancel), as RabbitMQ cancels a consumer it cannot keep.
TRANSIENT_REFUSALS = frozenset({errors.NOT_FOUND})


def _offset_of(message: Message | None) -> int | None:
    """The stream offset a delivery of a stream carries (its `x-stream-offset` header)."""
    return _integer((message.properties.headers or {}).get(OFFSET_HEADER)) if message is not None else None


def _integer(value: object) -> int | None:
    """`value` if it is an integer offset (a header or argument table's bool is not one)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class RemoteDelivery(QueueEntry):
    """A message the owner delivered to this node, with the owner's delivery tag."""

    __slots__ = ("mirror", "link_tag")

    def __init__(self, message: Message, mirror: MirrorChannel, link_tag: int, redelivered: bool) -> None:
        super().__init__(message, link_tag)
        self.mirror = mirror
        self.link_tag = link_tag
        self.delivery_count = 1 if redelivered else 0


class RemoteConsumer:
    """One client consumer of a remote queue: its mirror channel on the owner and the deliveries
    that arrived while the client had no room."""

    __slots__ = ("queue", "consumer", "mirror", "waiting", "active", "parked", "last_message", "started_at")

    def __init__(self, queue: "RemoteQueue", consumer: Consumer, mirror: MirrorChannel | None) -> None:
        self.queue = queue
        self.consumer = consumer
        self.mirror = mirror  # None while it waits for an owner that serves the queue (`reattach`)
        self.waiting: deque[RemoteDelivery] = deque()
        self.active = False  # the owner answered consume-ok
        self.parked = False  # a replicated queue's consumer waiting for its leader (owner_cancelled)
        self.last_message: Message | None = None  # the last one handed to the client (a stream's offset)
        self.started_at = time.time()  # when it consumed with its arguments (a stream's "next")

    def delivered(self, mirror: MirrorChannel, consumer_tag: str, link_tag: int, redelivered: bool,
                  message: Message) -> None:
        self.queue.delivered(self, RemoteDelivery(message, mirror, link_tag, redelivered))

    def cancelled_by_owner(self, mirror: MirrorChannel, consumer_tag: str) -> None:
        self.queue.owner_cancelled(self)

    def mirror_failed(self, mirror: MirrorChannel, error: QueueUnavailable) -> None:
        if self.active:  # a refused consume is answered by its callback instead
            self.queue.owner_cancelled(self)


class FetchHandler:
    """What a remote queue's fetch channel (basic.get, queue.purge and its counts) reports to
    (a MirrorHandler): it never consumes, so it gets no deliveries; when it fails, the queue
    opens a new one for the next request."""

    __slots__ = ("queue",)

    def __init__(self, queue: "RemoteQueue") -> None:
        self.queue = queue

    def delivered(self, mirror: MirrorChannel, consumer_tag: str, link_tag: int, redelivered: bool,
                  message: Message) -> None:
        """Not called: the fetch channel has no consumer."""

    def cancelled_by_owner(self, mirror: MirrorChannel, consumer_tag: str) -> None:
        """Not called: the fetch channel has no consumer."""

    def mirror_failed(self, mirror: MirrorChannel, error: QueueUnavailable) -> None:
        self.queue.fetcher_failed(mirror)


class ForwardedMessage:
    """One message forwarded to its queue's owner, waited for as a queue is (`when_stored`)."""

    __slots__ = ("stream", "seq")

    def __init__(self, stream: "ForwardStream", seq: int) -> None:
        self.stream = stream
        self.seq = seq

    def when_stored(self, callback: "SyncCallback") -> None:
        """Call back once the owner confirmed this message (None) or nacked it, or its link failed."""
        self.stream.when_confirmed(self.seq, callback)


class RemoteQueue(Queue):
    """A queue whose owner is another node (see the module docstring)."""

    def __init__(self, name: str, vhost: str, *, owner: str, links: "ClusterLinks", durable: bool,
                 exclusive: bool, auto_delete: bool, arguments: dict[str, Any] | None, timers: "Timers") -> None:
        super().__init__(name, vhost, durable=durable, exclusive_owner=OTHER_NODES_CONNECTION if exclusive else None,
                         auto_delete=auto_delete, arguments=arguments, timers=timers)
        # Deduplication, length limits, TTLs and x-delivery-count are the owner's to apply.
        self.dedup = None
        self.adds_delivery_count = False
        self.single_active = None  # the owner's: it refuses a basic.get of a queue with one
        self.owner = owner
        self._links = links
        self._link: NodeLink | None = None  # the link the last message was forwarded on
        self._last_seq = 0
        self._remote_consumers: dict[Consumer, RemoteConsumer] = {}
        self._fetcher: MirrorChannel | None = None  # the mirror channel for basic.get and purge
        self._keeps_consumers = False  # a replicated queue's stand-in: consumers wait for the new leader
        self._parked_retry: "Timer | None" = None  # the timer of `_retry_parked`
        # consumer -> when it started waiting (monotonic) while its owner counted as serving the queue
        self._unreachable_since: dict[Consumer, float] = {}

    @property
    def home_node(self) -> str:  # type: ignore[override]
        return self.owner

    def __repr__(self) -> str:
        return f"<RemoteQueue {self.name!r} vhost={self.vhost!r} owner={self.owner!r}>"

    # -- availability ------------------------------------------------------------------

    def unavailable(self) -> AMQPError:
        """RabbitMQ's error for a queue whose home node is down (rabbit_amqqueue:not_found_or_absent)."""
        return AMQPError(
            errors.NOT_FOUND,
            f"home node '{self.owner}' of durable {errors.resource('queue', self.name, self.vhost)} "
            "is down or inaccessible",
        )

    def check_available(self) -> None:
        """404 while the owner is not live (declare, consume, get and purge ask first)."""
        if not self._links.queue_available(self.vhost, self.name, self.owner):
            raise self.unavailable()

    def _owner_link(self) -> NodeLink:
        link = self._links.link(self.owner, self.vhost)
        if link is None:
            raise self.unavailable()
        return link

    # -- publishing --------------------------------------------------------------------

    def publish(self, message: Message) -> int:
        link = self._link
        if link is None or link.state is LinkState.FAILED:
            link = self._links.link(self.owner, self.vhost)
            if link is None:
                return REJECTED
            self._link = link
        self._last_seq = link.stream.forward(self.name, message)
        return AWAIT_RECEIPT

    def publish_receipt(self) -> "ForwardedMessage":
        """The message just published here, to wait for the owner's confirm of it alone
        (publisher confirms and tx.commit: a nack of any one message must reach its publisher)."""
        # publish() set _link just before it answered AWAIT_RECEIPT (testing it for None would
        # cost a check per message).
        return ForwardedMessage(self._link.stream, self._last_seq)  # type: ignore[union-attr]

    @property
    def congested(self) -> bool:
        link = self._link
        return link is not None and link.stream.is_congested(self)

    def touch(self) -> None:
        """x-expires runs on the owner."""

    def reconfigure(self, settings: QueueArguments) -> None:
        """A policy changed: the owner applies it to its queue (length limits, TTLs,
        deduplication, x-delivery-count); here only the settings shown change."""
        self.settings = settings

    # -- consumers ---------------------------------------------------------------------

    @property
    def consumer_count(self) -> int:
        return len(self._remote_consumers)

    def consumers(self) -> list[Consumer]:
        return list(self._remote_consumers)

    def consumer_offsets(self) -> list[tuple[Consumer, int]]:
        """A stream's consumers here and the offset each reads next, as its client sees it: after
        the last record it was handed, or the first one the leader sent that it was not handed
        yet. A consumer handed nothing and sent nothing yet is left out (where it starts is the
        leader's to resolve: `next`, a timestamp...), unless it asked for an integer offset."""
        if self.settings.queue_type != STREAM:
            return []
        offsets = []
        for consumer, remote in list(self._remote_consumers.items()):
            offset = _offset_of(remote.last_message)
            if offset is not None:
                offsets.append((consumer, offset + 1))
            elif remote.waiting and (first := _offset_of(remote.waiting[0].message)) is not None:
                offsets.append((consumer, first))
            elif (start := _integer(consumer.arguments.get(OFFSET_HEADER))) is not None:
                offsets.append((consumer, start))
        return offsets

    def has_exclusive_consumer(self) -> bool:
        return False  # the owner knows every node's consumers and refuses what it must

    def keep_consumers_across_leader_changes(self) -> None:
        """This is a replicated queue's stand-in: see the module docstring."""
        self._keeps_consumers = True

    def check_consumer_arguments(self, arguments: dict[str, Any]) -> None:
        """A stream's stand-in refuses what the stream would, before asking its owner."""
        if self.settings.queue_type == STREAM:
            check_consumer_arguments(arguments, errors.resource("queue", self.name, self.vhost),
                                     int(time.time() * 1000))

    def consume(self, consumer: Consumer, answer: ConsumeAnswer) -> None:
        """Consume on the owner for `consumer`; consume-ok (unless nowait) follows the owner's,
        and the owner's refusal closes the client's channel with the owner's code and text."""
        if self.settings.queue_type == STREAM:
            # What the owner cannot see of this node's consumer (the owner consumes for it with a
            # prefetch and manual acks, which a stream requires): refused here as the stream does.
            refusal = consume_refusal(consumer, answer.global_qos_active,
                                      errors.resource("queue", self.name, self.vhost))
            if refusal is not None:
                answer.refused(refusal)
                return
        link = self._owner_link()
        answer.later()
        self._consume_on_owner(link, consumer, answer)

    def continuation(self, consumer: Consumer) -> dict[str, Any] | None:
        """A stream consumer goes on, on the stream's new leader, after the last record its
        client was handed; one handed nothing yet from where it started (a start relative to
        the time it consumed, `next` say, becomes that time, less a second for the nodes'
        clocks: a record may come twice, none is skipped)."""
        remote = self._remote_consumers.get(consumer)
        if remote is None or self.settings.queue_type != STREAM:
            return None
        arguments = dict(consumer.arguments)
        offset = _offset_of(remote.last_message)
        if offset is not None:
            arguments[OFFSET_HEADER] = offset + 1
            return arguments
        start = arguments.get(OFFSET_HEADER, "next")
        if isinstance(start, bytes):
            start = start.decode("utf-8", "replace")
        if start in ("next", "last"):
            since = remote.started_at - 1.0
        elif isinstance(start, str) and interval_ms(start) is not None:
            since = remote.started_at - (interval_ms(start) or 0) / 1000 - 1.0
        else:
            return arguments  # first, an offset, a timestamp: the same wherever it is asked
        arguments[OFFSET_HEADER] = datetime.datetime.fromtimestamp(max(since, 0), datetime.timezone.utc)
        return arguments

    def reattach(self, channel: "Channel", consumer: Consumer) -> None:
        """A consumer of the queue's previous form (the old leader's stand-in, or the queue
        itself before this node stopped leading) consumes on the new owner, untold: no
        consume-ok. A refusal does not close its channel: a 404 (the owner does not serve the
        queue yet) keeps it waiting, any other refusal cancels it (basic.cancel;
        TRANSIENT_REFUSALS says why)."""
        consumer.move_to(self)
        link = None
        if self._links.queue_available(self.vhost, self.name, self.owner):
            link = self._links.link(self.owner, self.vhost)
        if link is None:
            # Its owner does not serve it yet (this very node, about to be named the home of
            # the new leader, or a node whose link is not up): wait, as after a lost link.
            remote = RemoteConsumer(self, consumer, None)
            self._remote_consumers[consumer] = remote
            self._park(remote)
            return
        self._consume_on_owner(link, consumer, None)

    def _consume_on_owner(self, link: NodeLink, consumer: Consumer, answer: ConsumeAnswer | None) -> None:
        """`answer` is None for a re-attach (`reattach`), which the client is not told of."""
        channel = consumer.sink
        remote = RemoteConsumer(self, consumer, None)
        remote.mirror = mirror = link.open_mirror(remote)
        self._remote_consumers[consumer] = remote
        prefetch = consumer.prefetch_count
        if channel.global_prefetch_count:
            prefetch = min(prefetch or channel.global_prefetch_count, channel.global_prefetch_count)
        mirror.consume(
            self.name, consumer.tag, no_ack=False, exclusive=consumer.exclusive,
            prefetch_count=prefetch if prefetch and not consumer.no_ack else LINK_WINDOW,
            # The consumer timeout is kept here, where the client's acks arrive.
            arguments={key: value for key, value in consumer.arguments.items() if key != "x-consumer-timeout"},
            on_reply=lambda reply: self._consume_answered(channel, remote, answer, reply),
        )

    def _consume_answered(self, channel: Any, remote: RemoteConsumer, answer: ConsumeAnswer | None,
                          reply: Any) -> None:
        if not channel.is_open:  # closed meanwhile: its release() cancelled the consumer
            if answer is not None:
                answer.started()  # (dropped: the channel is gone)
            return
        if not isinstance(reply, QueueUnavailable):
            remote.active = True
            self._unreachable_since.pop(remote.consumer, None)
            if answer is not None:
                answer.started()
            return
        if answer is None:  # re-attached
            # The client's consume succeeded long ago: no channel error now. A refusal that may
            # pass (no leader serves the queue yet) parks it again; any other is final.
            remote.active = True
            if reply.code in TRANSIENT_REFUSALS:
                self.owner_cancelled(remote)
            else:
                self._cancel(remote)
            return
        self._remote_consumers.pop(remote.consumer, None)
        answer.refused(self._refusal(reply))

    def prefetch_changed(self, consumer: Consumer) -> None:
        """A basic.qos changed the running consumer's prefetch: the owner applies it too."""
        remote = self._remote_consumers.get(consumer)
        if remote is not None and remote.mirror is not None and not consumer.no_ack and consumer.prefetch_count:
            remote.mirror.qos(consumer.prefetch_count)

    def add_consumer(self, consumer: Consumer) -> None:
        raise NotImplementedError("a remote queue's consumers come through subscribe()")

    def remove_consumer(self, consumer: Consumer) -> None:
        """The client cancelled (or its channel closed): cancel on the owner; what the client
        still holds unacked stays settleable until it is settled."""
        remote = self._remote_consumers.pop(consumer, None)
        self._unreachable_since.pop(consumer, None)
        if remote is None or remote.mirror is None:  # (None: it waits for its owner, `reattach`)
            return
        mirror = remote.mirror
        while remote.waiting:
            mirror.reject(remote.waiting.popleft().link_tag, requeue=True)
        if mirror.state is MirrorState.OPEN:
            mirror.cancel(consumer.tag, lambda reply: self._close_if_done(mirror))
        else:
            self._close_if_done(mirror)

    def delivered(self, remote: RemoteConsumer, entry: RemoteDelivery) -> None:
        """The owner delivered to `remote`; one that was cancelled here meanwhile gives it back."""
        if self._remote_consumers.get(remote.consumer) is not remote:
            entry.mirror.reject(entry.link_tag, requeue=True)
            self._close_if_done(entry.mirror)
            return
        remote.waiting.append(entry)
        self.dispatch()

    def owner_cancelled(self, remote: RemoteConsumer) -> None:
        """The owner cancelled the consumer (its queue is gone) or the link went. A replicated
        queue's stand-in keeps the consumer, waiting for the new leader (`reattach` by the
        stand-in that replaces this one; `delete` cancels it if none does)."""
        if self._remote_consumers.get(remote.consumer) is not remote:
            return
        # What the owner sent and the client did not get yet goes back (after a failover the new
        # leader has it from its log).
        mirror = remote.mirror
        assert mirror is not None  # only a mirror's callbacks get here
        while remote.waiting:
            mirror.reject(remote.waiting.popleft().link_tag, requeue=True)
        remote.active = False
        if self._keeps_consumers and not self.deleted:
            self._park(remote)
            return
        self._cancel(remote)

    def _cancel(self, remote: RemoteConsumer) -> None:
        """The consumer ends here: its client gets basic.cancel (if it announced
        consumer_cancel_notify); what it holds unacked stays settleable on its channel."""
        remote.parked = False
        self._unreachable_since.pop(remote.consumer, None)
        if self._remote_consumers.get(remote.consumer) is remote:
            del self._remote_consumers[remote.consumer]
        if remote.mirror is not None:
            self._close_if_done(remote.mirror)
        remote.consumer.sink.consumer_cancelled(remote.consumer)

    def _park(self, remote: RemoteConsumer) -> None:
        remote.parked = True
        if self._parked_retry is None:
            self._parked_retry = self.timers.call_later(PARKED_RETRY_S, self._retry_parked)

    def _retry_parked(self) -> None:
        """Consumers wait (owner_cancelled) and no new leader replaced this stand-in: once the
        owner serves the queue again (its link came back), they consume there again."""
        self._parked_retry = None
        if self.deleted:
            return
        if not self._links.queue_available(self.vhost, self.name, self.owner):
            self._unreachable_since.clear()  # no owner serves it: a failover is under way
            self._parked_retry = self.timers.call_later(PARKED_RETRY_S, self._retry_parked)
            return
        now = time.monotonic()
        for remote in [remote for remote in self._remote_consumers.values() if remote.parked]:
            consumer = remote.consumer
            since = self._unreachable_since.setdefault(consumer, now)
            if now - since > PARKED_CANCEL_S:
                # The owner serves the queue, for the coordination service, and this node has
                # not reached it for that long: cut off from it. Tell the client, which can
                # consume on a node that reaches the queue (as RabbitMQ's pause_minority
                # closes a minority node's connections).
                log.warning("consumer %s of %s: node %s, which serves it, unreachable from here for %.0f s; "
                            "cancelling the consumer", consumer.tag, self.name, self.owner, now - since)
                self._cancel(remote)
                continue
            continuation = self.continuation(consumer)  # (a stream's: where its client is)
            if continuation is not None:
                consumer.go_on_with(continuation)
            self.remove_consumer(consumer)
            self.reattach(consumer.sink, consumer)  # type: ignore[arg-type]
            if consumer in self._remote_consumers:  # still waiting: it keeps counting from then
                self._unreachable_since.setdefault(consumer, since)

    def dispatch(self, now: float | None = None, first: QueueEntry | None = None) -> None:
        """Hand waiting deliveries to the consumers that have room (`first` is never given: a
        remote queue's publishes go to its owner, Queue.publish's dispatch is not run here)."""
        for remote in list(self._remote_consumers.values()):
            waiting = remote.waiting
            consumer = remote.consumer
            while waiting and consumer.has_capacity():
                entry = waiting.popleft()
                remote.last_message = entry.message
                if consumer.no_ack:
                    entry.mark_gone()
                    entry.mirror.ack(entry.link_tag)  # the client settles nothing: settle here
                else:
                    consumer.count_unacked()
                    self.unacked_count += 1
                consumer.sink.deliver(consumer, entry)

    # -- settling ----------------------------------------------------------------------

    def ack(self, entry: QueueEntry, consumer: Consumer | None) -> None:
        assert isinstance(entry, RemoteDelivery)  # what dispatch and basic.get hand out here
        self.settle(entry, consumer)
        entry.mirror.ack(entry.link_tag)
        self._close_if_done(entry.mirror)

    def reject(self, entry: QueueEntry, consumer: Consumer | None) -> None:
        assert isinstance(entry, RemoteDelivery)  # what dispatch and basic.get hand out here
        self.settle(entry, consumer)
        entry.mirror.reject(entry.link_tag, requeue=False)  # the owner dead-letters it
        self._close_if_done(entry.mirror)

    def requeue(self, entries: Any, cause: str | None = None) -> None:
        mirrors = set()
        for entry, consumer in entries:
            self.settle(entry, consumer)
            entry.mirror.reject(entry.link_tag, requeue=True)
            mirrors.add(entry.mirror)
        for mirror in mirrors:
            self._close_if_done(mirror)

    def _close_if_done(self, mirror: MirrorChannel) -> None:
        """A mirror channel with no consumer here and nothing unsettled is closed."""
        if not mirror.idle:
            return
        if mirror is self._fetcher:
            self._fetcher = None
        elif any(remote.mirror is mirror for remote in self._remote_consumers.values()):
            return
        mirror.close()

    # -- basic.get and queue.purge ---------------------------------------------------------

    def _fetch_channel(self) -> MirrorChannel:
        fetcher = self._fetcher
        if fetcher is None or fetcher.state is not MirrorState.OPEN:
            fetcher = self._fetcher = self._owner_link().open_mirror(FetchHandler(self))
        return fetcher

    def get_for(self, no_ack: bool, answer: GetAnswer) -> None:
        """basic.get on the owner; get-ok or get-empty in order with the channel's replies."""
        fetcher = self._fetch_channel()
        answer.later()
        fetcher.get(self.name, lambda reply: self._fetched(fetcher, no_ack, answer, reply))

    def _fetched(self, fetcher: MirrorChannel, no_ack: bool, answer: GetAnswer, reply: Any) -> None:
        if isinstance(reply, QueueUnavailable):
            self._fetcher = None
            answer.refused(self._refusal(reply))
            return
        if not answer.wanted:
            if reply is not None and not no_ack:
                fetcher.reject(reply[0], requeue=True)
            self._close_if_done(fetcher)
            return
        if reply is None:
            answer.empty()
            self._close_if_done(fetcher)
            return
        link_tag, redelivered, message, count = reply
        entry = RemoteDelivery(message, fetcher, link_tag, redelivered)
        if no_ack:
            entry.mark_gone()
            fetcher.ack(link_tag)
        else:
            self.unacked_count += 1
        answer.got(entry, message.raw_header, redelivered, count)
        self._close_if_done(fetcher)

    def purge_for(self, answer: CountsAnswer) -> None:
        """queue.purge on the owner; purge-ok with the owner's count."""
        fetcher = self._fetch_channel()
        answer.later()
        fetcher.purge(self.name, lambda reply: self._counted(fetcher, answer, reply))

    def count(self, answer: CountsAnswer) -> None:
        """The owner's message and consumer counts, as RabbitMQ's nodes answer queue.declare-ok
        for a queue of another node."""
        fetcher = self._fetch_channel()
        answer.later()
        fetcher.declare_passive(self.name, lambda reply: self._counted(fetcher, answer, reply))

    def _counted(self, fetcher: MirrorChannel, answer: CountsAnswer, reply: Any) -> None:
        if isinstance(reply, QueueUnavailable):
            self._fetcher = None
            answer.refused(self._refusal(reply))
            return
        self._close_if_done(fetcher)
        answer.counted(reply.message_count, getattr(reply, "consumer_count", 0))

    def _refusal(self, reply: QueueUnavailable) -> AMQPError:
        """The error the client gets for the owner's refusal (a lost link: the queue's node is down)."""
        return self.unavailable() if reply.text == "link lost" else AMQPError(reply.code, reply.text)

    def fetcher_failed(self, mirror: MirrorChannel) -> None:
        """The fetch channel `mirror` failed (FetchHandler): the next request opens a new one."""
        if mirror is self._fetcher:
            self._fetcher = None

    # -- administration ----------------------------------------------------------------

    def purge(self) -> int:
        """Nothing is held here to purge (AMQP's queue.purge goes to the owner: purge_for)."""
        return 0

    def delete(self) -> list[Consumer]:
        """This node forgets the queue (deleted on its owner): consumers here are told."""
        self.deleted = True
        if self._parked_retry is not None:
            self._parked_retry.cancel()
            self._parked_retry = None
        consumers = list(self._remote_consumers)
        self._unreachable_since.clear()
        for remote in self._remote_consumers.values():
            remote.waiting.clear()
            if remote.mirror is not None:
                remote.mirror.close()
        self._remote_consumers.clear()
        if self._fetcher is not None:
            self._fetcher.close()
            self._fetcher = None
        return consumers
