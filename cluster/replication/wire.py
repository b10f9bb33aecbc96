"""Frames between a queue's leader and its followers, one TCP stream per follower.

Protocol version 2 (`PROTOCOL_VERSION`; version 1 had no handshake). A stream starts with a
mutual proof of the cluster secret (`Handshake`), fixed-size messages before any frame:

    CHALLENGE  listener -> connector  magic "AMQPREPL", version u16, listener nonce (32 bytes)
    RESPONSE   connector -> listener  connector nonce (32 bytes),
                                      HMAC-SHA256(secret, CONNECTOR_LABEL | listener nonce | connector nonce)
    PROOF      listener -> connector  HMAC-SHA256(secret, LISTENER_LABEL | connector nonce | listener nonce)

Each side checks the other's HMAC with `hmac.compare_digest`; a side that receives more than the
message it waits for, or a wrong one, fails the handshake and the stream is closed. Neither
side sends anything else before the PROOF arrived, so no frame is read from, or sent to, a peer
that has not proved it holds the secret. Then the frames:

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
    RESET     leader -> follower   term, base_index, base_term, base_position, then an opaque
                                   document: the leader no longer stores the entries the follower
                                   lacks (a stream's retention, or a queue's compaction, dropped
                                   them: a queue's document is its snapshot): the follower drops
                                   its log, which goes on after entry ``base_index`` (of
                                   ``base_term``) at ``base_position`` of its storage, as the
                                   document says (a stream: its segment size there), and ACKs
                                   ``base_index``
    STATE     leader -> follower   term, then an opaque document (a stream's tracked consumer
                                   offsets): state that is not in the log, replaced whole

Sans-I/O: `FrameReader.feed` turns received bytes into frames, the encoders return bytes.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import secrets
import struct
from typing import NamedTuple, NoReturn

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
    RESET = 6
    STATE = 7


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
    index: int  # type: ignore[assignment]  # a field, hiding tuple.index (never called on it)


class Mismatch(NamedTuple):
    term: int
    hint: int


class Refuse(NamedTuple):
    term: int


class Reset(NamedTuple):
    term: int
    base_index: int
    base_term: int
    base_position: int  # where the log's own storage goes on after the base (a stream: the next offset)
    document: bytes  # what else the log needs to go on from there (a stream: its segment size)


class State(NamedTuple):
    term: int
    document: bytes


Frame = Hello | Append | Ack | Mismatch | Refuse | Reset | State


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


def encode_reset(term: int, base_index: int, base_term: int, base_position: int, document: bytes) -> bytes:
    return _frame(FrameKind.RESET, _U64x4.pack(term, base_index, base_term, base_position) + document)


def encode_state(term: int, document: bytes) -> bytes:
    return _frame(FrameKind.STATE, _U64.pack(term) + document)


def _decode(kind: int, body: memoryview) -> Frame:
    try:
        if kind == FrameKind.RESET:
            return Reset(*_U64x4.unpack_from(body), bytes(body[32:]))  # type: ignore[call-arg]
        if kind == FrameKind.STATE:
            return State(_U64.unpack_from(body)[0], bytes(body[8:]))
        if kind == FrameKind.APPEND:
            # (The struct's four fields, then the entries: mypy cannot count a struct's fields.)
            return Append(*_U64x4.unpack_from(body), bytes(body[32:]))  # type: ignore[call-arg]
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


PROTOCOL_VERSION = 2
HANDSHAKE_MAGIC = b"AMQPREPL"
NONCE_SIZE = 32
_MAC_SIZE = hashlib.sha256().digest_size
_VERSION = struct.Struct(">H")
CHALLENGE_SIZE = len(HANDSHAKE_MAGIC) + _VERSION.size + NONCE_SIZE
RESPONSE_SIZE = NONCE_SIZE + _MAC_SIZE
PROOF_SIZE = _MAC_SIZE
# One label per direction: a proof one side made can never pass for the other side's.
CONNECTOR_LABEL = b"amqp-server replication 2: connecting side\x00"
LISTENER_LABEL = b"amqp-server replication 2: listening side\x00"


class AuthenticationFailed(ProtocolError):
    """The peer did not prove it holds the cluster secret (or sent what no handshake holds)."""


class HandshakeState(enum.Enum):
    AWAIT_CHALLENGE = "await_challenge"  # connecting side: the listener's nonce comes first
    AWAIT_RESPONSE = "await_response"  # listening side: CHALLENGE sent
    AWAIT_PROOF = "await_proof"  # connecting side: RESPONSE sent
    OPEN = "open"  # each side proved the secret to the other: frames follow
    FAILED = "failed"


# The one transition table: a state waiting for a message, its size, and the state after it.
_WAITING: dict[HandshakeState, tuple[int, HandshakeState]] = {
    HandshakeState.AWAIT_CHALLENGE: (CHALLENGE_SIZE, HandshakeState.AWAIT_PROOF),
    HandshakeState.AWAIT_RESPONSE: (RESPONSE_SIZE, HandshakeState.OPEN),
    HandshakeState.AWAIT_PROOF: (PROOF_SIZE, HandshakeState.OPEN),
}


def _mac(secret: bytes, label: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(secret, label + first + second, hashlib.sha256).digest()


class Handshake:
    """One side's mutual proof of the cluster secret at a stream's start, sans-I/O (see the
    module docstring). `listening` or `connecting` makes one; `opening` is what to send first,
    `feed` takes received bytes and returns what to send; `is_open` once both proved it.
    A failure raises AuthenticationFailed and the handshake stays FAILED."""

    def __init__(self, secret: bytes, state: HandshakeState) -> None:
        if not secret:
            raise ValueError("a replication stream needs the cluster secret")
        self._secret = secret
        self.state = state
        self._nonce = secrets.token_bytes(NONCE_SIZE)
        self._peer_nonce = b""
        self._buffer = bytearray()

    @classmethod
    def listening(cls, secret: bytes) -> "Handshake":
        return cls(secret, HandshakeState.AWAIT_RESPONSE)

    @classmethod
    def connecting(cls, secret: bytes) -> "Handshake":
        return cls(secret, HandshakeState.AWAIT_CHALLENGE)

    @property
    def is_open(self) -> bool:
        return self.state is HandshakeState.OPEN

    def opening(self) -> bytes:
        """What this side sends as the stream opens: the listener's CHALLENGE, or nothing."""
        if self.state is HandshakeState.AWAIT_RESPONSE:
            return HANDSHAKE_MAGIC + _VERSION.pack(PROTOCOL_VERSION) + self._nonce
        return b""

    def feed(self, data: bytes) -> bytes:
        """Take received bytes; returns the bytes to send (possibly none)."""
        if self.state is HandshakeState.FAILED:
            raise AuthenticationFailed("the handshake failed already")
        waiting = _WAITING.get(self.state)
        if waiting is None:
            raise RuntimeError(f"the handshake is {self.state.value}")
        size, after = waiting
        self._buffer += data
        if len(self._buffer) < size:
            return b""
        if len(self._buffer) > size:
            self._fail(f"{len(self._buffer)} bytes where the handshake waits for {size}")
        message = bytes(self._buffer)
        self._buffer.clear()
        if self.state is HandshakeState.AWAIT_CHALLENGE:
            reply = self._challenged(message)
        elif self.state is HandshakeState.AWAIT_RESPONSE:
            reply = self._responded(message)
        else:
            reply = self._proved(message)
        self.state = after
        return reply

    def _challenged(self, challenge: bytes) -> bytes:
        if not challenge.startswith(HANDSHAKE_MAGIC):
            self._fail("the peer is not a replication listener")
        (version,) = _VERSION.unpack_from(challenge, len(HANDSHAKE_MAGIC))
        if version != PROTOCOL_VERSION:
            self._fail(f"the peer speaks replication protocol {version}, this node {PROTOCOL_VERSION}")
        self._peer_nonce = challenge[len(HANDSHAKE_MAGIC) + _VERSION.size:]
        return self._nonce + _mac(self._secret, CONNECTOR_LABEL, self._peer_nonce, self._nonce)

    def _responded(self, response: bytes) -> bytes:
        self._peer_nonce, proof = response[:NONCE_SIZE], response[NONCE_SIZE:]
        if not hmac.compare_digest(proof, _mac(self._secret, CONNECTOR_LABEL, self._nonce, self._peer_nonce)):
            self._fail("the peer did not prove the cluster secret")
        return _mac(self._secret, LISTENER_LABEL, self._peer_nonce, self._nonce)

    def _proved(self, proof: bytes) -> bytes:
        if not hmac.compare_digest(proof, _mac(self._secret, LISTENER_LABEL, self._nonce, self._peer_nonce)):
            self._fail("the listener did not prove the cluster secret")
        return b""

    def _fail(self, reason: str) -> NoReturn:
        self.state = HandshakeState.FAILED
        self._buffer.clear()
        raise AuthenticationFailed(reason)


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
