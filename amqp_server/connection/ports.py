"""What the connection needs of the runtime around it, as Protocols (typing only).

The connection layer sits below the runtime: the shell (amqp_server/runtime/server.py) hands a
new Connection its callbacks and, on the shared port of `--workers N`, the hand-over that may
move it to another worker (amqp_server/runtime/handover.py's HandoverRecorder, which satisfies
`Handover` as it is), so no module of amqp_server.connection imports amqp_server.runtime.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from amqp_server.wire.states import HandoverState


class Handover(Protocol):
    """A connection's record of the client's bytes while it may still move to the worker that
    owns its queue. The Connection calls `received` with every read and `before_frame` with every
    frame, and drops it once it stays (any state but RECORDING, after `stopped` if MOVING)."""

    @property
    def state(self) -> "HandoverState": ...

    def received(self, data: bytes) -> bool:
        """Every read, before the connection handles it; True while moving: the bytes are kept
        for the owner and not handled here."""

    def before_frame(self, connection: Any, frame_type: int, channel_id: int, payload: bytes) -> bool:
        """Every frame before `connection` (the Connection) handles it; True: stop before it,
        the connection moves."""

    def stopped(self, unread: bytes) -> None:
        """The connection stopped before the hand-over frame; `unread` is what it had read after it."""

    def refused(self) -> bytes:
        """The connection stays; returns the frames it stopped before and after, to handle here."""

    def taken(self) -> None:
        """The socket is the owner's now."""
