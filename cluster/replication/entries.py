"""The replicated log entry, identical in the log file and in APPEND frames.

    length   u32   bytes after this field (crc + index + term + payload), >= 20
    crc      u32   CRC-32 (zlib) of index + term + payload
    index    u64   position in the queue's log, 1, 2, 3, ... with no gaps
    term     u64   the leader's term when the entry was written
    payload  ...   opaque (for a queue: one segment record; empty: the no-op a new leader writes)

Because the bytes are the same on disk and on the wire, a leader sends a run of its file as it
is, and a follower checks and appends it as it is: nothing is decoded per record on either side
beyond this header.
"""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

HEAD = struct.Struct(">IIQQ")  # length, crc, index, term
HEAD_SIZE = HEAD.size
_BODY_HEAD = struct.Struct(">QQ")
MIN_LENGTH = 4 + 16
MAX_PAYLOAD = 256 * 1024 * 1024


class BadEntry(ValueError):
    """Bytes that are not a well-formed run of entries (torn, damaged or out of order)."""


class EntryHead(NamedTuple):
    index: int  # type: ignore[assignment]  # a field, hiding tuple.index (never called on it)
    term: int
    start: int  # offset of the entry in the buffer it was found in
    end: int  # offset just after it


def encode_entry(index: int, term: int, payload: bytes | bytearray | memoryview) -> bytes:
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"a replicated record of {len(payload)} bytes is over {MAX_PAYLOAD}")
    body_head = _BODY_HEAD.pack(index, term)
    crc = zlib.crc32(payload, zlib.crc32(body_head))
    return struct.pack(">II", 4 + 16 + len(payload), crc) + body_head + bytes(payload)


def scan_entries(buffer: bytes | bytearray | memoryview, first_index: int | None = None,
                 *, stop_at_damage: bool = False) -> tuple[list[EntryHead], int]:
    """The entries at the start of ``buffer`` and the offset where well-formed entries end.

    Each must pass its CRC and, when ``first_index`` is given, carry the next index in turn.
    With ``stop_at_damage`` (recovering a file) a torn or damaged entry ends the scan; without
    it (a frame from the network) anything but whole good entries raises BadEntry."""
    view = memoryview(buffer)
    heads: list[EntryHead] = []
    pos = 0
    size = len(view)
    expected = first_index
    while pos < size:
        if size - pos < HEAD_SIZE:
            if stop_at_damage:
                break
            raise BadEntry(f"{size - pos} bytes left at offset {pos}: a torn entry")
        length, crc, index, term = HEAD.unpack_from(view, pos)
        end = pos + 4 + length
        problem = None
        if length < MIN_LENGTH or end > size:
            problem = f"entry length {length} at offset {pos} runs past the end"
        elif zlib.crc32(view[pos + 8:end]) != crc:
            problem = f"entry at offset {pos}: CRC mismatch"
        elif expected is not None and index != expected:
            problem = f"entry at offset {pos} has index {index}, expected {expected}"
        if problem is not None:
            if stop_at_damage:
                break
            raise BadEntry(problem)
        heads.append(EntryHead(index, term, pos, end))
        expected = index + 1
        pos = end
    return heads, pos

