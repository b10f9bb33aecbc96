"""Encoding and decoding of the records in a queue segment file (format 1).

Every record is framed the same way, all integers big-endian::

    length   u32   bytes that follow this field (crc + type + payload), >= 5
    crc      u32   CRC-32 (zlib/IEEE, poly 0x04C11DB7 reflected) of type + payload
    type     u8    RecordType
    payload  length - 5 bytes

A message record's payload holds the per-queue sequence number, the publish
time, exchange, routing key, the AMQP basic properties exactly as received
(property flags + property list) and the body. A state record's payload
starts with the sequence number of the message it is about and the time it
happened, followed by fields that depend on the type. Bytes after the fields
described here belong to fields added later in format 1 and are ignored;
unknown record types are skipped. docs/queue-files.md is the contract.
"""

from __future__ import annotations

import enum
import struct
import zlib
from typing import Literal, NamedTuple, overload

RECORD_HEAD = struct.Struct(">IIB")  # length, crc, type
LENGTH = struct.Struct(">I")
LENGTH_AND_CRC = struct.Struct(">II")  # RECORD_HEAD without the type
MIN_RECORD_LENGTH = 5  # crc + type, an empty payload
MAX_RECORD_LENGTH = 0xFFFF_FFFF

_MESSAGE_FIXED = struct.Struct(">BQQ")  # type, seq, published_at_ms
_U8 = struct.Struct(">B")
_MESSAGE_FIXED_AND_LENGTH = struct.Struct(">BQQB")  # _MESSAGE_FIXED, then the exchange's length
_U32 = struct.Struct(">I")
_SEQ_AT = struct.Struct(">QQ")
# Every payload starts with seq and a time (u64 each); a message's length-prefixed fields follow:
# exchange and routing key (u8 length), properties and body (u32 length). State fields follow too.
MESSAGE_FIELDS_AT = STATE_FIELDS_AT = _SEQ_AT.size
MESSAGE_FIELD_WIDTHS = (1, 1, 4, 4)
_MAX_U63 = (1 << 63) - 1


class RecordType(enum.IntEnum):
    MESSAGE = 0x01
    DELIVERED = 0x10
    ACKED = 0x11
    DROPPED = 0x12
    DEAD_LETTERED = 0x13
    EXPIRED = 0x14
    REQUEUED = 0x15
    WAITING_RETRY = 0x16
    PURGED = 0x17


class MessageState(str, enum.Enum):
    """What a state record says happened to a message (value = name used in the API and docs)."""

    DELIVERED = "delivered"
    ACKED = "acked"
    DROPPED = "dropped"
    DEAD_LETTERED = "dead_lettered"
    EXPIRED = "expired"
    REQUEUED = "requeued"
    WAITING_RETRY = "waiting_retry"
    PURGED = "purged"

    @property
    def settles(self) -> bool:
        """True when a message in this state has left the queue for good."""
        return self in _SETTLING


_SETTLING = frozenset({MessageState.ACKED, MessageState.DROPPED, MessageState.DEAD_LETTERED, MessageState.EXPIRED})


class Reason(enum.IntEnum):
    """Why a message was dropped or dead-lettered (names as in RabbitMQ's x-death "reason")."""

    UNSPECIFIED = 0
    REJECTED = 1
    EXPIRED = 2
    MAXLEN = 3
    DELIVERY_LIMIT = 4


STATE_OF_TYPE: dict[int, MessageState] = {
    RecordType.DELIVERED: MessageState.DELIVERED,
    RecordType.ACKED: MessageState.ACKED,
    RecordType.DROPPED: MessageState.DROPPED,
    RecordType.DEAD_LETTERED: MessageState.DEAD_LETTERED,
    RecordType.EXPIRED: MessageState.EXPIRED,
    RecordType.REQUEUED: MessageState.REQUEUED,
    RecordType.WAITING_RETRY: MessageState.WAITING_RETRY,
    RecordType.PURGED: MessageState.PURGED,
}
TYPE_OF_STATE: dict[MessageState, int] = {state: rtype for rtype, state in STATE_OF_TYPE.items()}

# Fields after seq + at_ms, per state record type.
_STATE_EXTRA: dict[int, struct.Struct] = {
    RecordType.DELIVERED: struct.Struct(">I"),  # delivery_count
    RecordType.ACKED: struct.Struct(""),
    RecordType.DROPPED: struct.Struct(">B"),  # reason
    RecordType.DEAD_LETTERED: struct.Struct(">B"),  # reason
    RecordType.EXPIRED: struct.Struct(""),
    RecordType.REQUEUED: struct.Struct(">I"),  # delivery_count
    RecordType.WAITING_RETRY: struct.Struct(">IQ"),  # delivery_count, due_at_ms
    RecordType.PURGED: struct.Struct(""),
}
_STATE_RECORD: dict[int, struct.Struct] = {
    rtype: struct.Struct(">IIBQQ" + extra.format.lstrip(">")) for rtype, extra in _STATE_EXTRA.items()
}


class MalformedRecord(ValueError):
    """A record whose CRC is right but whose payload does not fit its type (a writer bug)."""


class MessageRecord(NamedTuple):
    seq: int
    published_at_ms: int
    exchange: str
    routing_key: str
    raw_properties: bytes
    body: bytes


class StateRecord(NamedTuple):
    seq: int
    state: MessageState
    at_ms: int
    delivery_count: int = 0
    due_at_ms: int = 0
    reason: Reason = Reason.UNSPECIFIED


class UnknownRecord(NamedTuple):
    """A record of a type this reader does not know; its CRC was valid."""

    record_type: int
    payload: bytes


def encode_message(
    seq: int, published_at_ms: int, exchange: str, routing_key: str, raw_properties: bytes, body: bytes
) -> tuple[bytes, bytes]:
    """The message record as (everything before the body, body), to be written back to back.

    Returning the body separately lets the caller append it to its write
    buffer without building one more copy of it.
    """
    exchange_b = exchange.encode("utf-8")
    routing_key_b = routing_key.encode("utf-8")
    if len(exchange_b) > 255 or len(routing_key_b) > 255:
        raise ValueError("exchange and routing key are AMQP short strings: at most 255 bytes of UTF-8")
    if not (0 <= seq <= _MAX_U63 and 0 <= published_at_ms <= _MAX_U63):
        _check_u63("seq", seq)
        _check_u63("published_at_ms", published_at_ms)
    # Type, seq and time, then the exchange's length: one pack (the struct the reader uses, and a byte).
    prefix = b"".join(
        (
            _MESSAGE_FIXED_AND_LENGTH.pack(RecordType.MESSAGE, seq, published_at_ms, len(exchange_b)),
            exchange_b,
            _U8.pack(len(routing_key_b)),
            routing_key_b,
            _U32.pack(len(raw_properties)),
            raw_properties,
            _U32.pack(len(body)),
        )
    )
    length = 4 + len(prefix) + len(body)
    if length > MAX_RECORD_LENGTH:
        raise ValueError(f"message record of {length} bytes exceeds the 4 GiB record limit")
    return LENGTH_AND_CRC.pack(length, zlib.crc32(body, zlib.crc32(prefix))) + prefix, body


class StateKind(NamedTuple):
    """What the writer needs to know of one MessageState, looked up once per record by the
    state's name (no enum conversion, no enum properties per record)."""

    state: MessageState
    rtype: int
    body: struct.Struct  # the record after its length and CRC: type, seq, at_ms, then the extra fields
    settles: bool
    extra: str  # "" | "count" (delivery_count) | "retry" (delivery_count, due_at_ms) | "reason"


_EXTRA_OF_TYPE: dict[int, str] = {
    RecordType.DELIVERED: "count",
    RecordType.REQUEUED: "count",
    RecordType.WAITING_RETRY: "retry",
    RecordType.DROPPED: "reason",
    RecordType.DEAD_LETTERED: "reason",
}
# By the state's value ("delivered", "acked", ...), a plain string.
STATE_KINDS: dict[str, StateKind] = {
    state._value_: StateKind(
        state,
        rtype,
        struct.Struct(">BQQ" + _STATE_EXTRA[rtype].format.lstrip(">")),
        state in _SETTLING,
        _EXTRA_OF_TYPE.get(rtype, ""),
    )
    for state, rtype in TYPE_OF_STATE.items()
}


def state_kind(state: MessageState | str) -> StateKind:
    """The StateKind of a state or state name; ValueError for one that does not exist."""
    kind = STATE_KINDS.get(state)  # a name or a MessageState (which hashes and compares as its name)
    if kind is None:
        kind = STATE_KINDS[MessageState(state)._value_]
    return kind


def encode_state(
    state: MessageState | str,
    seq: int,
    at_ms: int,
    *,
    delivery_count: int = 0,
    due_at_ms: int = 0,
    reason: Reason = Reason.UNSPECIFIED,
) -> bytes:
    """A complete state record."""
    return encode_state_of(state_kind(state), seq, at_ms, delivery_count, due_at_ms, reason)


def encode_state_of(
    kind: StateKind, seq: int, at_ms: int, delivery_count: int = 0, due_at_ms: int = 0, reason: int = 0
) -> bytes:
    """A complete state record of `kind` (state_kind()); the fields its kind has no room for are ignored."""
    if not (0 <= seq <= _MAX_U63 and 0 <= at_ms <= _MAX_U63):
        _check_u63("seq", seq)
        _check_u63("at_ms", at_ms)
    extra = kind.extra
    if not extra:
        body = kind.body.pack(kind.rtype, seq, at_ms)
    elif extra == "count":
        body = kind.body.pack(kind.rtype, seq, at_ms, delivery_count)
    elif extra == "retry":
        _check_u63("due_at_ms", due_at_ms)
        body = kind.body.pack(kind.rtype, seq, at_ms, delivery_count, due_at_ms)
    else:
        body = kind.body.pack(kind.rtype, seq, at_ms, int(reason))
    return LENGTH_AND_CRC.pack(len(body) + 4, zlib.crc32(body)) + body


@overload
def decode_payload(rtype: Literal[RecordType.MESSAGE], payload: bytes | memoryview) -> MessageRecord: ...
@overload
def decode_payload(rtype: int, payload: bytes | memoryview) -> MessageRecord | StateRecord | UnknownRecord: ...
def decode_payload(rtype: int, payload: bytes | memoryview) -> MessageRecord | StateRecord | UnknownRecord:
    """Decode a record's payload (the bytes after the type byte) whose CRC was already checked."""
    try:
        if rtype == RecordType.MESSAGE:
            return _decode_message(payload)
        if rtype in STATE_OF_TYPE:
            return _decode_state(rtype, payload)
    except (struct.error, IndexError, UnicodeDecodeError) as err:
        raise MalformedRecord(f"record type 0x{rtype:02x}: {err}") from err
    return UnknownRecord(rtype, bytes(payload))


def _decode_message(payload: bytes | memoryview) -> MessageRecord:
    size = len(payload)
    seq, published_at_ms = _SEQ_AT.unpack_from(payload, 0)
    pos = MESSAGE_FIELDS_AT
    fields: list[bytes] = []
    for width in MESSAGE_FIELD_WIDTHS:  # exchange, routing key, properties, body
        n = payload[pos] if width == 1 else _U32.unpack_from(payload, pos)[0]
        pos += width
        if pos + n > size:
            raise IndexError("a field length runs past the end of the record")
        fields.append(bytes(payload[pos : pos + n]))
        pos += n
    exchange, routing_key, raw_properties, body = fields
    return MessageRecord(
        seq, published_at_ms, exchange.decode("utf-8"), routing_key.decode("utf-8"), raw_properties, body
    )


def _decode_state(rtype: int, payload: bytes | memoryview) -> StateRecord:
    seq, at_ms = _SEQ_AT.unpack_from(payload, 0)
    extra = _STATE_EXTRA[rtype].unpack_from(payload, STATE_FIELDS_AT)
    state = STATE_OF_TYPE[rtype]
    if rtype in (RecordType.DELIVERED, RecordType.REQUEUED):
        return StateRecord(seq, state, at_ms, delivery_count=extra[0])
    if rtype == RecordType.WAITING_RETRY:
        return StateRecord(seq, state, at_ms, delivery_count=extra[0], due_at_ms=extra[1])
    if rtype in (RecordType.DROPPED, RecordType.DEAD_LETTERED):
        return StateRecord(seq, state, at_ms, reason=_reason(extra[0]))
    return StateRecord(seq, state, at_ms)


def state_fields(rtype: int, payload: bytes | memoryview, offset: int = 0) -> tuple[int, ...]:
    """(seq, at_ms, *extra) of a state record's payload starting at ``offset``; fast path for recovery."""
    return _SEQ_AT.unpack_from(payload, offset) + _STATE_EXTRA[rtype].unpack_from(payload, offset + STATE_FIELDS_AT)


def min_state_payload(rtype: int) -> int:
    return STATE_FIELDS_AT + _STATE_EXTRA[rtype].size


def _reason(code: int) -> Reason:
    try:
        return Reason(code)
    except ValueError:
        return Reason.UNSPECIFIED  # a reason added later; still a drop / dead-letter


def _check_u63(name: str, value: int) -> None:
    if not 0 <= value <= _MAX_U63:
        raise ValueError(f"{name} must be in 0..2**63-1, got {value}")
