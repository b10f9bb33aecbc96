"""The method replies of one channel, in the order of the methods, even when one waits for disk.

AMQP requires a channel's replies in the order of its methods. Some replies promise
durability and so wait for an fsync round: declare-ok (and delete-ok, bind-ok, unbind-ok)
after a durable definition changed, commit-ok after persistent messages. While one
waits, later replies on the channel (a passive declare's, basic.qos-ok, channel.close-ok,
a server's channel.close) queue behind it instead of overtaking it. Deliveries and
publisher confirms are not method replies and are not held.

In a cluster the wait is also for the coordination service to commit a definition change,
and a change can be refused there (another node declared the same queue differently at the
same moment): the held reply then becomes the channel.close (or connection.close) of that
refusal, and the replies after it on the channel are dropped, as the client will never read them.

Nothing is allocated while no reply waits: ``send`` is one test, and the deque of held replies
exists only while one waits (an idle channel does not carry one, about 700 bytes).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from amqp_server.wire import errors
from amqp_server.wire.states import ChannelState, ConnectionState
from amqp_server.wire.errors import AMQPError

# None when done; an OSError when the write failed; an AMQPError when the change was refused.
SyncCallback = Callable[[Exception | None], None]
# Starts waiting for disk and calls the callback (error or None) when done, maybe at once.
WaitForDisk = Callable[[SyncCallback], None]


class ReplyConnection(Protocol):
    """What a channel's OrderedReplies uses of its connection: it sends frames, and closes the
    channel or the connection when a held reply's change was refused. (Here, not in ports.py:
    ports.py's MethodChannel names OrderedReplies, so this module imports nothing of the package.)"""

    @property
    def state(self) -> ConnectionState: ...

    @property
    def channels(self) -> Mapping[int, Any]: ...

    def method_frame(self, channel_id: int, method: Any) -> bytes: ...

    def send_method(self, channel_id: int, method: Any) -> None: ...

    def send_frames(self, frames: list[bytes]) -> None: ...

    def close_by_broker(self, code: int, text: str) -> None: ...

    def fail_channel(self, channel: Any, error: AMQPError) -> None: ...


class _Held:
    __slots__ = ("frame", "ready", "failure")

    def __init__(self, frame: bytes, ready: bool) -> None:
        self.frame = frame  # the encoded reply
        self.ready = ready
        self.failure = ""  # what could not be written, for the connection.close text


class OrderedReplies:
    """Sends one channel's method replies in order; see the module docstring."""

    __slots__ = ("_connection", "_channel_id", "_held")

    def __init__(self, connection: ReplyConnection, channel_id: int) -> None:
        self._connection = connection
        self._channel_id = channel_id
        self._held: deque[_Held] | None = None  # made by hold(), dropped when drained

    @property
    def waiting(self) -> bool:
        """A reply waits for disk, so later ones are held behind it."""
        return bool(self._held)

    def send(self, method: Any) -> None:
        """Send ``method`` now, or after the replies that wait before it."""
        if not self._held:
            self._connection.send_method(self._channel_id, method)
        else:
            self._held.append(_Held(self._connection.method_frame(self._channel_id, method), ready=True))

    def send_frame(self, frame: bytes) -> None:
        """Send an encoded reply (codec's hand-built frames) now, or after those that wait."""
        self.send_frames([frame])

    def send_frames(self, frames: list[bytes]) -> None:
        """Send a reply of several frames (basic.get-ok and its content) now, or after those that wait."""
        if not self._held:
            self._connection.send_frames(frames)
        else:
            self._held.append(_Held(b"".join(frames), ready=True))

    def send_when_durable(self, frame: bytes, wait: WaitForDisk, failure: str = "") -> None:
        """Send the encoded reply ``frame`` once ``wait`` reports the disk write done, in order
        with the others.

        If ``wait`` reports an AMQPError the reply is refused with it; any other error closes
        the connection with 541 INTERNAL_ERROR, saying ``failure`` and the error."""
        self.release(self.hold(frame), wait, failure)

    def hold(self, frame: bytes) -> _Held:
        """Reserve the place of the encoded reply ``frame``: what is sent on the channel until
        ``release`` waits behind it (queue.delete-ok goes before the basic.cancel its deletion
        sends, as in RabbitMQ)."""
        entry = _Held(frame, ready=False)
        if self._held is None:
            self._held = deque()
        self._held.append(entry)
        return entry

    def release(self, entry: _Held, wait: WaitForDisk | None, failure: str = "") -> None:
        """Send a held reply now (``wait`` None) or once ``wait`` reports the disk write done."""
        if wait is None:
            self._done(entry, None)
            return
        entry.failure = failure
        wait(lambda error: self._done(entry, error))

    def fill(self, entry: _Held, frames: list[bytes]) -> None:
        """Send a held reply whose frames are known only now (a basic.get-ok a cluster node
        answered), in order with the others."""
        entry.frame = b"".join(frames)
        self._done(entry, None)

    def fill_later(self, entry: _Held, frame: bytes) -> None:
        """Give a held reply its frame now and send it later (release), in order."""
        entry.frame = frame

    def withdraw(self, entry: _Held) -> None:
        """A held reply will not be sent after all (its request failed): what waited behind
        it goes out."""
        self.fill(entry, [])

    def _done(self, entry: _Held, error: Exception | None) -> None:
        if self._connection.state is not ConnectionState.OPEN:  # closed meanwhile: nobody to answer
            self._held = None
            return
        if isinstance(error, AMQPError):
            self._refused(entry, error)
            return
        if error is not None:
            self._held = None
            self._connection.close_by_broker(errors.INTERNAL_ERROR, f"{entry.failure}: {error}")
            return
        entry.ready = True
        held = self._held
        ready = []
        while held and held[0].ready:
            ready.append(held.popleft().frame)
        if not held:
            self._held = None
        if ready:
            self._connection.send_frames(ready)

    def _refused(self, entry: _Held, error: AMQPError) -> None:
        """The method whose reply ``entry`` holds was refused: answer with the error instead."""
        held = self._held
        if held is None or not any(waiting is entry for waiting in held):
            return
        while held[-1] is not entry:
            held.pop()  # replies to methods after it: the client never reads them
        held.pop()
        if not held:
            self._held = None
        connection = self._connection
        if error.is_hard:
            self._held = None
            connection.close_by_broker(error.code, error.reply_text)
            return
        channel = connection.channels.get(self._channel_id)
        if channel is None or channel.state is not ChannelState.OPEN:
            return
        # Its channel.close goes out in the refused reply's place, after the replies before it.
        connection.fail_channel(channel, error)
