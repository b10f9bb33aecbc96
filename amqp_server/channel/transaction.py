"""Transactions (tx.select, tx.commit, tx.rollback): a channel's publishes and settlements kept
until commit.

After tx.select a channel keeps its publishes and its acks, nacks and rejects in a Transaction
instead of applying them; tx.commit applies them in order and tx.rollback forgets them, and the
channel stays transactional either way. As in RabbitMQ, a settlement's delivery tags are
checked when it arrives (a tag settled earlier in the same transaction is already unknown, 406)
and applied at commit; commit-ok for persistent messages waits until they are on disk, as a
confirm does, and a message a queue could not write fails the commit (406 "partial tx
completion"). A channel is in confirm mode or transactional, never both (406).

On a cluster, a commit must not touch queues that live on more than one node (`check_one_home`):
queues of two nodes would be applied by two nodes, and one of them may fail (or die) after the
other applied its part. Rather than half-apply such a commit, it is refused before anything is
applied, with the error RabbitMQ uses for what it does not implement (540 NOT_IMPLEMENTED,
which closes the connection). A transaction whose queues all live on one node, this one or
another, commits as on one node. docs/cluster.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pamqp import commands

from amqp_server.wire import codec, errors
from amqp_server.wire.errors import AMQPError
from amqp_server.broker.reply_to import is_reply_key
from amqp_server.broker.sender_selected import sender_selected_keys
from amqp_server.channel.settlement import apply_settlement, take_if_present, unknown_delivery_tag
from queues.journal import when_synced
from queues.message import FLAG_HEADERS
from queues.publish_outcome import WRITE_FAILED

if TYPE_CHECKING:
    from amqp_server.channel.ports import MethodChannel, OpenTransaction, Publish, Settlement, SettlingTimeouts
    from amqp_server.channel.unacked_store import UnackedStore
    from exchanges import Exchange
    from queues.message import Message


class Transaction:
    """The publishes and settlements of a channel's open transaction."""

    __slots__ = ("publishes", "settlements", "_settled_up_to", "_settled_tags")

    def __init__(self) -> None:
        self.publishes: list[Publish] = []
        self.settlements: list[Settlement] = []
        # Tags settled in the open transaction: all up to _settled_up_to, and these.
        self._settled_up_to = 0
        self._settled_tags: set[int] = set()

    def publish(self, exchange: "Exchange", message: "Message", mandatory: bool) -> None:
        self.publishes.append((exchange, message, mandatory))

    def settle(self, unacked: UnackedStore, timeouts: "SettlingTimeouts | None", next_delivery_tag: int, kind: str,
               tag: int, multiple: bool, requeue: bool) -> None:
        """Keep a settlement of deliveries of `unacked` (a channel's, whose next delivery tag is
        `next_delivery_tag`) for commit: 406 unless it names a delivery not yet settled in this
        transaction, or one that timed out; what it names counts as settled from now on
        (RabbitMQ takes it off the channel's unacked list at once, so a second ack of one is
        an unknown tag)."""
        settled_up_to = self._settled_up_to
        timed_out = timeouts is not None and timeouts.has_timed_out(tag)
        if multiple:
            if tag == 0:
                self._settled_up_to = next_delivery_tag - 1
            elif (tag in unacked and tag > settled_up_to and tag not in self._settled_tags) or timed_out:
                self._settled_up_to = max(tag, settled_up_to)
            else:
                raise unknown_delivery_tag(kind, tag)
        elif tag in unacked:
            if tag <= settled_up_to or tag in self._settled_tags:
                raise unknown_delivery_tag(kind, tag)
            self._settled_tags.add(tag)
        elif not timed_out:
            raise unknown_delivery_tag(kind, tag)
        self.settlements.append((kind, tag, multiple, requeue))

    def end(self) -> tuple[list[Publish], list[Settlement]]:
        """Commit or rollback: what the transaction kept; the next one starts empty."""
        kept = self.publishes, self.settlements
        self.publishes = []
        self.settlements = []
        self._settled_up_to = 0
        self._settled_tags.clear()
        return kept


def tx_select(channel: "MethodChannel", method: commands.Tx.Select) -> None:
    if channel.confirms is not None:
        raise AMQPError(errors.PRECONDITION_FAILED, "cannot switch from confirm to tx mode")
    channel.select_transactions()
    channel.replies.send(commands.Tx.SelectOk())


def _open_transaction(channel: "MethodChannel") -> "OpenTransaction":
    if channel.transaction is None:
        raise AMQPError(errors.PRECONDITION_FAILED, "channel is not transactional")
    return channel.transaction


def tx_commit(channel: "MethodChannel", method: commands.Tx.Commit) -> None:
    transaction = _open_transaction(channel)
    if channel.connection.broker.clustered:
        check_one_home(channel, transaction.publishes, transaction.settlements)
    publishes, settlements = transaction.end()
    journaled: set[Any] = set()
    write_failed = False
    for exchange, message, mandatory in publishes:
        stored = channel.route_publish(exchange, message, mandatory)
        if stored == WRITE_FAILED:
            write_failed = True
        elif isinstance(stored, list):  # (not None: nothing to wait on)
            journaled.update(stored)
    stats = channel.connection.broker.stats
    for kind, tag, multiple, requeue in settlements:
        # Tags were checked when the ack arrived; ones that timed out since are skipped.
        taken = take_if_present(channel.unacked, channel.delivery_timeouts, tag, multiple)
        apply_settlement(stats, channel, kind, taken, requeue)
    if not journaled and not write_failed:
        channel.replies.send(commands.Tx.CommitOk())
        return

    def wait(done: Callable[[Exception | None], None]) -> None:
        # Like a confirm, commit-ok for persistent messages waits until they are on disk. A
        # message a queue could not write, or an fsync that failed, fails the transaction as a
        # nack does in RabbitMQ: 406 "partial tx completion" closes the channel.
        def synced(error: OSError | None) -> None:
            done(partial_tx_completion() if write_failed or error is not None else None)

        if journaled:
            when_synced(list(journaled), synced)
        else:
            synced(None)

    # `wait` reports every failure as "partial tx completion": no 541 text is needed.
    channel.replies.send_when_durable(codec.method_frame(channel.id, commands.Tx.CommitOk()), wait)


def partial_tx_completion() -> AMQPError:
    """RabbitMQ's answer to a tx.commit some of whose messages a queue refused (rabbit_channel
    complete_tx): the channel is closed."""
    return AMQPError(errors.PRECONDITION_FAILED, "partial tx completion", 90, 20)


def tx_rollback(channel: "MethodChannel", method: commands.Tx.Rollback) -> None:
    _open_transaction(channel).end()
    channel.replies.send(commands.Tx.RollbackOk())


def check_one_home(channel: "MethodChannel", publishes: list[Publish], settlements: list[Settlement]) -> None:
    """540 when the transaction's publishes and settlements reach queues that live on several
    nodes (QueueType.home_node; "" is this node, as is a delayed exchange's store)."""
    vhost = channel.vhost
    homes: set[str] = set()
    for exchange, message, _mandatory in publishes:
        if exchange is vhost.default_exchange and is_reply_key(message.routing_key):
            continue
        keys = sender_selected_keys(message) if message.property_flags & FLAG_HEADERS else None
        homes.update(queue.home_node for queue in vhost.route(exchange, message, keys))
    unacked = channel.unacked
    for _kind, tag, multiple, _requeue in settlements:
        if multiple:
            homes.update(delivery.queue.home_node for t, delivery in unacked.items() if tag == 0 or t <= tag)
        else:
            delivery = unacked.get(tag)
            if delivery is not None:
                homes.add(delivery.queue.home_node)
    if len(homes) > 1:
        named = ", ".join(sorted("this node" if home == "" else f"'{home}'" for home in homes))
        raise AMQPError(
            errors.NOT_IMPLEMENTED,
            f"tx.commit would apply to queues on more than one cluster node ({named}); a transaction "
            "cannot be atomic across nodes, so nothing of it was applied",
        )
