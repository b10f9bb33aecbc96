"""The queue type behaviour: what every kind of queue does for a channel, whatever holds it.

Modelled on RabbitMQ's `rabbit_queue_type`: the channel (amqp_server/channel/) holds queues
and calls these methods; it never asks which type it holds. Classic and quorum queues are
`queues.queue.Queue` (a quorum queue is one whose journal a cluster replicates); the cluster
plug-in adds the stand-in of a queue another node holds (cluster/links/remote_queue.py); streams
are queues/stream_queue.py, behind the same interface. The declare half of each type, the arguments
and properties it takes, is its `QueueTypeRules` entry (queues/arguments/queue_type_rules.py).

Methods whose answer may come later (the owner of a remote queue answers over a link) take an
*answer*: a narrow object of the channel's (amqp_server/channel/answers.py) that the queue
calls once, at once or later, with the outcome. A queue type knows nothing of frames or
channels beyond these answers.

The per-message methods (`publish`, `when_stored`, `ack`, `reject`, `requeue`, dispatching to
consumers) are plain methods of the queue, called without an answer: they are the hot path.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from queues.consumer import Consumer
    from queues.message import Message, QueueEntry


class QueueTypeRefusal(Exception):
    """A queue type refuses a method as RabbitMQ's type does: the AMQP reply `code` (a soft or a
    hard error, which closes the channel or the connection) and its `text`. The channel turns
    it into its AMQP error (amqp_server/channel/answers.py)."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


class Answer(Protocol):
    """What every answer does, whatever method it answers (the channel's side of it is
    amqp_server/channel/answers.py's `Answer`)."""

    def later(self) -> None:
        """The answer will come after the method returns (the queue's owner answers over a
        link): called before then, it keeps the answer's place among the channel's replies."""

    @property
    def wanted(self) -> bool:
        """False once the channel that asked has closed: what the answer would carry (a
        message fetched for basic.get) is to be given back instead."""

    def refused(self, error: Exception) -> None:
        """The queue cannot serve the method (say, its owner node is unreachable): `error` is
        raised to, or sent on, the channel as it is."""


class ConsumeAnswer(Answer, Protocol):
    @property
    def global_qos_active(self) -> bool:
        """The channel's last basic.qos was a global limit (RabbitMQ's active limiter), which
        some queue types refuse."""

    def started(self) -> None:
        """The consumer is registered (basic.consume-ok, unless nowait)."""


class GetAnswer(Answer, Protocol):
    def got(self, entry: "QueueEntry", raw_header: bytes, redelivered: bool, message_count: int,
            durable_wait: Any = None) -> None:
        """basic.get-ok: `entry`, with the content header to send and the count of messages left;
        `durable_wait`, where the get must be on disk before the reply leaves (a replicated queue's
        `delivered` record), is the journal's wait for it."""

    def empty(self) -> None:
        """basic.get-empty."""


class CountsAnswer(Answer, Protocol):
    def counted(self, message_count: int, consumer_count: int) -> None:
        """The queue's counts (queue.declare-ok, queue.delete's if-empty/if-unused, purge-ok)."""


class QueueType(abc.ABC):
    """One queue, of whatever type, as the channel and the broker's model use it."""

    # Where the queue's messages live: "" on this node, else the name of the node that holds
    # them (the channel never tests this; a transaction uses it to stay on one node, and the
    # hand-over to find the worker that serves a client).
    home_node: str = ""

    name: str
    deleted: bool

    # -- declare, info ---------------------------------------------------------------------

    def check_available(self) -> None:
        """Raise the error a client gets when the queue cannot serve it now (its owner node is
        down: 404, as RabbitMQ's). A queue of this node always can."""

    @abc.abstractmethod
    def count(self, answer: CountsAnswer) -> None:
        """Answer with the message and consumer counts (queue.declare-ok, queue.delete)."""

    @property
    @abc.abstractmethod
    def message_count(self) -> int: ...

    @property
    @abc.abstractmethod
    def consumer_count(self) -> int: ...

    # -- publish ---------------------------------------------------------------------------

    @abc.abstractmethod
    def publish(self, message: "Message") -> int:
        """Enqueue `message`; a queues/publish_outcome.py code. AWAIT_RECEIPT: the message went to
        where the queue lives, and `publish_receipt()` says when it was stored there."""

    def publish_receipt(self) -> Any:
        """After a publish answered AWAIT_RECEIPT: an object whose `when_stored(callback)` calls
        back once that very message is stored where the queue lives."""
        raise NotImplementedError(f"{type(self).__name__} stores what it is published here")

    @abc.abstractmethod
    def when_stored(self, callback: Callable[[OSError | None], None]) -> None:
        """Call back once every message published so far is stored (fsynced where durable)."""

    # -- consume, cancel, get --------------------------------------------------------------

    def check_consumer_arguments(self, arguments: dict[str, Any]) -> None:
        """Raise QueueTypeRefusal for basic.consume arguments this type refuses (checked before
        the channel's own checks of x-priority and the like, as RabbitMQ's queue types do)."""

    def exclusive_use_refused(self, exclusive: bool) -> bool:
        """A new consumer (an exclusive one if `exclusive`) would be refused: 403 "in exclusive use"."""
        return False

    @abc.abstractmethod
    def consume(self, consumer: "Consumer", answer: ConsumeAnswer) -> None:
        """Start `consumer` (basic.consume), then tell `answer`."""

    @abc.abstractmethod
    def remove_consumer(self, consumer: "Consumer") -> None:
        """basic.cancel, or its channel closed."""

    def continuation(self, consumer: "Consumer") -> dict[str, Any] | None:
        """The consume arguments under which `consumer` goes on where it is, when the queue takes
        another form (a replicated queue's leader changed: cluster/definitions/apply.py); None:
        its own arguments say it (a queue hands out what is ready, wherever it is)."""
        return None

    def prefetch_changed(self, consumer: "Consumer") -> None:
        """A basic.qos changed a running consumer's prefetch (where the queue lives elsewhere,
        that node applies it too)."""

    @abc.abstractmethod
    def get_for(self, no_ack: bool, answer: GetAnswer) -> None:
        """basic.get: the next message, or empty."""

    # -- settle ----------------------------------------------------------------------------

    @abc.abstractmethod
    def ack(self, entry: "QueueEntry", consumer: "Consumer | None") -> None: ...

    def ack_many(self, taken: "Sequence[tuple[QueueEntry, Any, Consumer | None]]") -> None:
        """`ack` each (entry, this queue, consumer) of `taken`, in order: the deliveries of this
        queue one `multiple` ack settles. A type may settle them together."""
        for entry, _queue, consumer in taken:
            self.ack(entry, consumer)

    @abc.abstractmethod
    def reject(self, entry: "QueueEntry", consumer: "Consumer | None") -> None: ...

    @abc.abstractmethod
    def requeue(self, entries: Iterable[tuple["QueueEntry", "Consumer | None"]], cause: str | None = None) -> None: ...

    # -- purge, delete, recover ------------------------------------------------------------

    @abc.abstractmethod
    def purge_for(self, answer: CountsAnswer) -> None:
        """queue.purge: drop the ready messages and answer with how many (as message_count)."""

    @abc.abstractmethod
    def delete(self) -> "list[Consumer]":
        """The queue is gone: its consumers, for their channels to tell."""

    def recover(self) -> int:
        """Take back what the queue's files hold after a restart; the number of messages."""
        return 0
