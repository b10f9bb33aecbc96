"""Frames between a queue's leader and its followers, one TCP stream per follower.

Every frame is ``length u32`` (bytes after it), ``kind u8``, then the kind's fields (integers
big-endian u64 unless said otherwise):

    HELLO     follower -> leader   term, last_index, last_term, node (u16 + UTF-8), queue (u16 + UTF-8)
    APPEND    leader -> follower   term, prev_index, prev_term, commit_index, entries (the rest:
                                   log entries exactly as in the leader's file, see `entries`)
    ACK       follower -> leader   term, index: the follower has fsynced its log up to ``index``
                                   and it matches the leader's
    MISMATCH  follower -> leader   term, hint: the entry before APPEND's run is not the leader's;
                                   resend from ``hint + 1``
    REFUSE    follower -> leader   term: the follower has promised a newer term; the leader is stale

Sans-I/O: `FrameReader.feed` turns received bytes into frames, the encoders return bytes.
"""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple

from cluster.replication.entries import HEAD_SIZE, MAX_PAYLOAD

FRAME_HEAD = struct.Struct(">IB")
MAX_APPEND_BYTES = 1024 * 1024  # entries larger than this travel alone in their frame
MAX_FRAME = MAX_PAYLOAD + HEAD_SIZE + MAX_APPEND_BYTES  # the largest entry, alone, with room to spare
_U64x2 = struct.Struct(">QQ")
_U64x3 = struct.Struct(">QQQ")
_U64x4 = struct.Struct(">QQQQ")
_U64 = struct.Struct(">Q")
_U16 = struct.Struct(">H")


class FrameKind(enum.IntEnum):
    HELLO = 1
    APPEND = 2
    ACK = 3
    MISMATCH = 4
    REFUSE = 5


class ProtocolError(ValueError):
    """The peer sent something that is not a frame of this protocol; the stream is closed."""


class Hello(NamedTuple):
    term: int
    last_index: int
    last_term: int
    node: str
    queue: str


class Append(NamedTuple):
    term: int
    prev_index: int
    prev_term: int
    commit_index: int
    entries: bytes


class Ack(NamedTuple):
    term: int
    index: int


class Mismatch(NamedTuple):
    term: int
    hint: int


class Refuse(NamedTuple):
    term: int


Frame = Hello | Append | Ack | Mismatch | Refuse


def _frame(kind: FrameKind, body: bytes) -> bytes:
    return FRAME_HEAD.pack(1 + len(body), kind) + body


def _short(text: str) -> bytes:
    data = text.encode("utf-8")
    if len(data) > 0xFFFF:
        raise ValueError("name too long")
    return _U16.pack(len(data)) + data


def encode_hello(term: int, last_index: int, last_term: int, node: str, queue: str) -> bytes:
    return _frame(FrameKind.HELLO, _U64x3.pack(term, last_index, last_term) + _short(node) + _short(queue))


def encode_append(term: int, prev_index: int, prev_term: int, commit_index: int,
                  entries: bytes | bytearray | memoryview) -> bytes:
    return _frame(FrameKind.APPEND, _U64x4.pack(term, prev_index, prev_term, commit_index) + bytes(entries))


def encode_ack(term: int, index: int) -> bytes:
    return _frame(FrameKind.ACK, _U64x2.pack(term, index))


def encode_mismatch(term: int, hint: int) -> bytes:
    return _frame(FrameKind.MISMATCH, _U64x2.pack(term, hint))


def encode_refuse(term: int) -> bytes:
    return _frame(FrameKind.REFUSE, _U64.pack(term))


def _decode(kind: int, body: memoryview) -> Frame:
    try:
        if kind == FrameKind.APPEND:
            return Append(*_U64x4.unpack_from(body), bytes(body[32:]))
        if kind == FrameKind.ACK:
            return Ack(*_U64x2.unpack_from(body))
        if kind == FrameKind.MISMATCH:
            return Mismatch(*_U64x2.unpack_from(body))
        if kind == FrameKind.REFUSE:
            return Refuse(*_U64.unpack_from(body))
        if kind == FrameKind.HELLO:
            term, last_index, last_term = _U64x3.unpack_from(body)
            pos = 24
            names = []
            for _ in range(2):
                (n,) = _U16.unpack_from(body, pos)
                pos += 2
                if pos + n > len(body):
                    raise ProtocolError("HELLO: a name runs past the frame")
                names.append(bytes(body[pos:pos + n]).decode("utf-8"))
                pos += n
            return Hello(term, last_index, last_term, names[0], names[1])
    except (struct.error, UnicodeDecodeError) as error:
        raise ProtocolError(f"malformed frame of kind {kind}: {error}") from error
    raise ProtocolError(f"unknown frame kind {kind}")


class FrameReader:
    """Reassembles frames from a byte stream; a frame over MAX_FRAME is a ProtocolError."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        self._buffer += data
        frames: list[Frame] = []
        buffer = self._buffer
        pos = 0
        while len(buffer) - pos >= FRAME_HEAD.size:
            length, kind = FRAME_HEAD.unpack_from(buffer, pos)
            if not 1 <= length <= MAX_FRAME:
                raise ProtocolError(f"frame length {length} out of range")
            end = pos + 4 + length
            if end > len(buffer):
                break
            with memoryview(buffer) as view:
                frames.append(_decode(kind, view[pos + FRAME_HEAD.size:end]))
            pos = end
        if pos:
            del buffer[:pos]
        return frames
