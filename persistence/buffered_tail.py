"""The write buffer in front of a segment log's newest segment, shared by QueueStore and StreamLog.

Both append records to a ``bytearray`` and write it to their tail segment
(opened ``O_APPEND``) with one ``os.write`` per flush; a group commit round
(their ``prepare_sync``) then fsyncs what was written. ``BufferedTail.flush``
is that write: a write that fails is cut back, so no torn record stays in the
middle of the file, and the buffer is kept for a retry. While writes keep
failing, an owner buffers at most ``BUFFER_LIMIT_FACTOR`` times its write
buffer size and then refuses new records (flush raises) rather than grow
without bound.
"""

from __future__ import annotations

import os
from typing import Protocol

BUFFER_LIMIT_FACTOR = 16


class Tail(Protocol):
    """The newest segment as the buffer sees it."""

    @property
    def size(self) -> int:
        """Bytes of the file written to the OS, header included."""
        ...

    def grew(self, written: int) -> None:
        """``written`` more bytes reached the file."""
        ...


class BufferedTail:
    """A write buffer and the tail segment it goes to. The subclass sets the four attributes in
    its constructor and keeps them: ``_tail_fd`` is None while there is no tail segment, and
    ``_failed`` holds the error that stopped writes for good (a failed fsync, or a failed write
    that could not be cut back)."""

    _buffer: bytearray
    _tail: Tail | None
    _tail_fd: int | None
    _failed: OSError | None

    def flush(self) -> None:
        """Write the buffered records to the tail segment with one os.write (more only if the OS
        writes part of it). On failure the file is cut back and the buffer kept for a retry."""
        if not self._buffer or self._tail_fd is None:
            return
        tail = self._tail
        assert tail is not None
        view = memoryview(self._buffer)
        written = 0
        try:
            while written < len(view):
                written += os.write(self._tail_fd, view[written:])
        except OSError:
            view.release()
            try:
                os.ftruncate(self._tail_fd, tail.size)  # no torn record may stay in the middle of the file
            except OSError as err:
                self._failed = err
            raise
        view.release()
        tail.grew(written)
        self._buffer.clear()
