"""The files of a stream: segment header, stream record, and the directory layout (stream format 1).

A stream segment is framed like a queue segment (docs/queue-files.md): a
40-byte header, then records ``length u32, crc u32, type u8, payload`` with
the same CRC-32, so the Spark reader's record walk
(``segment_file.trusted_record_offsets``) reads stream segments unchanged.
It differs in its magic (``AMQPSSEG``, so a queue reader refuses a stream
file instead of reading it as an empty queue), in its format version (its
own, ``STREAM_FORMAT_VERSION``) and in its one record type, ``0x20``::

    offset u64, timestamp_ms u64, flags u8, filter_len u8, filter bytes,
    head_crc u32,
    exchange_len u8, exchange, routing_key_len u8, routing_key,
    properties_len u32, properties, body_len u32, body

``head_crc`` covers the record's ``length`` field and the bytes from ``type``
to the end of the filter value, so a filtered read can check the offset, the
filter value and where the next record starts, and skip the record, without
reading its message. The message fields are those of a queue's message record
(same order, same widths), so the Spark columnar decoder reads them too.
docs/stream-files.md is the contract.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import NamedTuple

from persistence import segment_file
from persistence.format_version import UnsupportedFormatVersion
from persistence.record_format import LENGTH
from persistence.segment_file import HEADER_SIZE as HEADER_SIZE  # the queue segment's header layout
from persistence.segment_file import SegmentHeader, SegmentKind
from persistence.segment_file import parse_segment_file_name as parse_segment_file_name  # named as a queue's
from persistence.segment_file import segment_file_name as segment_file_name
from persistence.segment_layout import name_to_dir

STREAM_MAGIC = b"AMQPSSEG"
STREAM_FORMAT_VERSION = 1
SUPPORTED_STREAM_FORMAT_VERSIONS = frozenset({1})

STREAM_RECORD = 0x20
FLAG_FILTER = 0x01  # the record has a filter value (an empty one is still a value)
FLAG_CHUNK_START = 0x02  # the first record of what one write (a flush) put in the file
KNOWN_FLAGS = FLAG_FILTER | FLAG_CHUNK_START

# length, crc, type, offset, timestamp, flags, filter_len: the fixed start of every stream record.
HEAD = struct.Struct(">IIBQQBB")
_TYPED_HEAD = struct.Struct(">BQQBB")  # HEAD from the type on
FILTER_AT = HEAD.size  # 27: the filter value starts here, then head_crc (u32)
_U32 = struct.Struct(">I")
_U8 = struct.Struct(">B")
# Everything but the five variable fields: the HEAD, head_crc, and four field lengths (1+1+4+4).
RECORD_OVERHEAD = HEAD.size + 4 + 10
ENVELOPED_RECORD_OVERHEAD = HEAD.size + 4 + 4  # the same, with the envelope's three lengths in the envelope
MAX_SHORT = 255
MAX_RECORD_LENGTH = 0xFFFF_FFFF
_MAX_U63 = (1 << 63) - 1

INDEX_SUFFIX = ".sidx"  # segment files are named as a queue's (segment_file.segment_file_name)
STREAMS_DIR = "streams"
STREAM_META = "stream.json"
VHOST_META = "vhost.json"
OFFSETS_FILE = "consumer-offsets.json"


class UnsupportedStreamFormatVersion(UnsupportedFormatVersion):
    """A stream file written in a format version this code does not read."""

    def __init__(self, path: str, version: object) -> None:
        super().__init__(path, version)
        supported = ", ".join(str(v) for v in sorted(SUPPORTED_STREAM_FORMAT_VERSIONS))
        self.args = (
            f"{path}: stream file format version {version!r} is not supported "
            f"(this amqp-server reads version {supported}); it was probably written by a newer amqp-server",
        )


def check_stream_format_version(path: str, version: object) -> None:
    if version not in SUPPORTED_STREAM_FORMAT_VERSIONS or isinstance(version, bool):
        raise UnsupportedStreamFormatVersion(path, version)


class CorruptStreamHeader(ValueError):
    """A stream segment whose header is short or fails its magic or CRC check."""


STREAM_SEGMENT = SegmentKind(
    STREAM_MAGIC,
    STREAM_FORMAT_VERSION,
    check_stream_format_version,
    CorruptStreamHeader,
    "stream segment header",
    "stream segment file",
)


class StreamRecord(NamedTuple):
    """One message of a stream, as a reader returns it."""

    offset: int
    timestamp_ms: int
    exchange: str
    routing_key: str
    raw_properties: bytes  # the content header's property flags and property list, as received
    body: bytes
    filter_value: str | None = None


# ---- names and directories ---------------------------------------------------------------


def index_file_name(segment_id: int) -> str:
    return f"{segment_id:020d}{INDEX_SUFFIX}"


def stream_path(data_dir: Path, vhost: str, stream: str) -> Path:
    """``<data_dir>/streams/<sha1(vhost)>/<sha1(stream)>``, as queues are laid out under ``queues/``."""
    return Path(data_dir) / STREAMS_DIR / name_to_dir(vhost) / name_to_dir(stream)


# ---- segment header ----------------------------------------------------------------------


def encode_header(segment_id: int, created_at_ms: int) -> bytes:
    """A stream segment's header: a queue segment's with the stream magic and format version."""
    return segment_file.encode_header(segment_id, created_at_ms, STREAM_SEGMENT)


def decode_header(path: str, data: bytes) -> SegmentHeader:
    """The header at the start of ``data``; its segment id is the offset of the segment's first
    record. Raises ``CorruptStreamHeader`` or ``UnsupportedStreamFormatVersion``."""
    return segment_file.decode_header(path, data, STREAM_SEGMENT)


# ---- records -----------------------------------------------------------------------------


def record_size(filter_b: bytes, exchange_b: bytes, routing_key_b: bytes, raw_properties: bytes, body: bytes) -> int:
    """Bytes the record will take in the file (length field included)."""
    return RECORD_OVERHEAD + len(filter_b) + len(exchange_b) + len(routing_key_b) + len(raw_properties) + len(body)


def encode_record(
    offset: int,
    timestamp_ms: int,
    flags: int,
    filter_b: bytes,
    exchange_b: bytes,
    routing_key_b: bytes,
    raw_properties: bytes,
    body: bytes,
) -> bytes:
    """The record up to (not including) the body; the body follows it in the file unchanged.

    Returned apart so the caller appends the body to its write buffer without one more copy.
    The short strings must be at most 255 bytes (the caller checks: ``check_short``)."""
    return encode_record_with(
        offset, timestamp_ms, flags, filter_b, encode_envelope(exchange_b, routing_key_b, raw_properties), body
    )


def encode_envelope(exchange_b: bytes, routing_key_b: bytes, raw_properties: bytes) -> bytes:
    """A record's envelope: its fields from ``exchange_len`` to the end of ``properties`` (the
    short strings at most 255 bytes: ``check_short``). A writer makes it once for the records of
    one exchange, routing key and properties."""
    return b"".join(
        (
            _U8.pack(len(exchange_b)),
            exchange_b,
            _U8.pack(len(routing_key_b)),
            routing_key_b,
            _U32.pack(len(raw_properties)),
            raw_properties,
        )
    )


def encode_record_with(offset: int, timestamp_ms: int, flags: int, filter_b: bytes, envelope: bytes, body: bytes) -> bytes:
    """``encode_record`` with the message fields before the body given as their envelope
    (``encode_envelope``)."""
    if not (0 <= offset <= _MAX_U63 and 0 <= timestamp_ms <= _MAX_U63):
        raise ValueError(f"offset and timestamp must be in 0..2**63-1, got {offset}, {timestamp_ms}")
    n_filter = len(filter_b)
    length = ENVELOPED_RECORD_OVERHEAD - 4 + n_filter + len(envelope) + len(body)
    if length > MAX_RECORD_LENGTH:
        raise ValueError(f"stream record of {length + 4} bytes exceeds the 4 GiB record limit")
    length_b = LENGTH.pack(length)
    typed = _TYPED_HEAD.pack(STREAM_RECORD, offset, timestamp_ms, flags, n_filter)
    if n_filter:
        typed += filter_b
    rest = _U32.pack(zlib.crc32(typed, zlib.crc32(length_b))) + envelope + _U32.pack(len(body))
    return b"".join((length_b, _U32.pack(zlib.crc32(body, zlib.crc32(rest, zlib.crc32(typed)))), typed, rest))


def check_short(name: str, value: bytes) -> None:
    if len(value) > MAX_SHORT:
        raise ValueError(f"{name} is an AMQP short string: at most 255 bytes of UTF-8, got {len(value)}")


def head_crc_ok(buf: bytes, i: int, n_filter: int) -> bool:
    """True when the head CRC of the record at ``buf[i:]`` matches (its head must be in ``buf``)."""
    end = i + FILTER_AT + n_filter
    stored: int = _U32.unpack_from(buf, end)[0]
    return zlib.crc32(buf[i + 8 : end], zlib.crc32(buf[i : i + 4])) == stored


def envelope_end(buf: bytes, h: int, end: int) -> int:
    """Where the *envelope* of the record whose message fields start at ``buf[h]`` ends: the
    bytes from ``exchange_len`` to the end of ``properties`` (the fields before ``body_len``).
    Records of one publisher usually share their envelope byte for byte, so a reader compares
    it with the previous record's instead of parsing it again. ``end`` is the record's end."""
    try:
        n = buf[h]
        h += 1 + n
        n = buf[h]
        h += 1 + n
        (n,) = _U32.unpack_from(buf, h)
    except (IndexError, struct.error) as err:
        raise MalformedStreamRecord(f"the message fields run past the record: {err}") from err
    h += 4 + n
    if h + 4 > end:
        raise MalformedStreamRecord("the properties run past the end of the record")
    return h


def split_envelope(envelope: bytes) -> tuple[bytes, bytes, bytes]:
    """The exchange, routing key and properties of an envelope (``envelope_end``)."""
    n = envelope[0]
    exchange = envelope[1 : 1 + n]
    h = 1 + n
    n = envelope[h]
    routing_key = envelope[h + 1 : h + 1 + n]
    h += 1 + n
    return exchange, routing_key, envelope[h + 4 :]


class MalformedStreamRecord(ValueError):
    """A record whose CRC matches but whose fields do not fit its length (a writer bug)."""


def decode_message(
    buf: bytes, i: int, end: int, offset: int, timestamp_ms: int, flags: int, n_filter: int
) -> StreamRecord:
    """The StreamRecord at ``buf[i:end]`` whose HEAD fields were already unpacked and CRC checked."""
    h = i + FILTER_AT
    filter_value = buf[h : h + n_filter].decode("utf-8") if flags & FLAG_FILTER else None
    h += n_filter + 4
    try:
        n = buf[h]
        exchange = buf[h + 1 : h + 1 + n]
        h += 1 + n
        n = buf[h]
        routing_key = buf[h + 1 : h + 1 + n]
        h += 1 + n
        (n,) = _U32.unpack_from(buf, h)
        props = buf[h + 4 : h + 4 + n]
        h += 4 + n
        (n,) = _U32.unpack_from(buf, h)
        h += 4
        if h + n > end:
            raise IndexError("the body runs past the end of the record")
        body = buf[h : h + n]
        return StreamRecord(
            offset, timestamp_ms, exchange.decode("utf-8"), routing_key.decode("utf-8"), props, body, filter_value
        )
    except (IndexError, struct.error, UnicodeDecodeError) as err:
        raise MalformedStreamRecord(f"stream record {offset}: {err}") from err
