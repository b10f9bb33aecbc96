"""Mutations of a session's frames, and the session each connection of a run sends.

Everything follows from (seed, connection number): a finding replays from those two numbers.
"""

from __future__ import annotations

import random
import struct
import warnings
from collections.abc import Callable

from pamqp import commands, frame

from bench.frame_fuzz.corpus import FRAME_MAX, SLOT, SLOTS, TAG, TUNINGS, Script, handshake_frames, marshal

# Each frame of a session is mutated with this probability (the handshake has its own odds).
MUTATION_RATE = 0.04
VALID_HANDSHAKE_ODDS = 0.85
# How many corpus scripts one session strings together; sessions stay short so that many
# connections come and go (the handshake and the teardown are fuzzed as often as the middle).
SCRIPTS_PER_SESSION = (1, 6)
# What one connection may send in a session, so the RSS bound holds: body-frame repetition and
# huge payloads are capped by it.
SESSION_BYTE_BUDGET = 1 << 20

INTERESTING_SIZES = (0, 1, 3, 4, 7, 8, 4087, 4088, 4096, 4097, FRAME_MAX - 8, FRAME_MAX - 1, FRAME_MAX, FRAME_MAX + 1,
                     0x7FFFFFFF, 0xFFFFFFFF)
INTERESTING_BYTES = (0x00, 0x01, 0x7F, 0x80, 0xCE, 0xFF)
FIELD_TYPES = b"tbBsuUiIlLfdDSAxTFVZ\x00\xff"


def _nested(depth: int) -> dict[str, object]:
    table: dict[str, object] = {"leaf": 1}
    for _ in range(depth):
        table = {"t": table}
    return table


# Values a decoded method argument or property may be set to, by AMQP type: the edges of each
# type, and names and arguments the broker gives a meaning to.
INTERESTING_VALUES: dict[str, tuple[object, ...]] = {
    "octet": (0, 1, 2, 9, 10, 255),
    "short": (0, 1, 2047, 2048, 65535),
    "long": (0, 1, 4095, 4096, 0x7FFFFFFF, 0xFFFFFFFF),
    "longlong": (0, 1, 2, 0x7FFFFFFFFFFFFFFF, 0xFFFFFFFFFFFFFFFF),
    "timestamp": (0, 0xFFFFFFFF),
    "bit": (False, True),
    "shortstr": ("", "amq.direct", "amq.gen-x", "amq.rabbitmq.reply-to", "amq.rabbitmq.reply-to.x", "fz-x1-s01",
                 "#", "*.*", "a" * 255, "-1", "0", "99999999999999999999", "x-delayed-message", "headers"),
    "longstr": ("", "\x00", "x" * 70000),
    "table": ({}, {"x-max-length": -1}, {"x-max-length-bytes": 0}, {"x-message-ttl": -5}, {"x-message-ttl": 0},
              {"x-expires": 0}, {"x-expires": 1}, {"x-dead-letter-exchange": "amq.direct"},
              {"x-dead-letter-exchange": "fz-nowhere", "x-dead-letter-routing-key": 5},
              {"x-queue-type": "quorum"}, {"x-queue-type": "stream"}, {"x-max-priority": 255}, {"x-max-priority": 0},
              {"x-overflow": "reject-publish"}, {"x-overflow": "drop-head", "x-max-length": 0},
              {"x-single-active-consumer": True}, {"x-priority": 0x7FFFFFFF}, {"x-priority": -1},
              {"x-delayed-type": "x-delayed-message"}, {"alternate-exchange": ""}, {"alternate-exchange": 7},
              {"x-match": "all-with-x"}, {"x-match": "nonsense"}, {"x-consumer-timeout": 1},
              {"x-delivery-limit": 0}, {"x-queue-mode": "lazy"}, {"x-delay": -5}, {"x-delay": 1 << 62},
              {"x-stream-offset": "first"}, {"CC": ["a", "b"]}, {"BCC": "x"}, {"CC": [1, None, {"a": []}]},
              {"x-death": [{"count": -1, "queue": 5}]}, {"x-death": "no"}, {"x-delivery-count": -1},
              {"deep": _nested(200)}),
}
# Arguments a semantic mutation leaves alone: durable declarations outlive the run (every
# fuzzing connection would leave its queues in the definitions file).
KEPT_ARGUMENTS = {"durable"}


class Mutator:
    """Turns a session's frames into hostile ones; every choice comes from `rng`."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.budget = SESSION_BYTE_BUDGET
        self.operations: list[Callable[[list[bytes], int], None]] = [
            self.flip_bits, self.flip_bits, self.truncate, self.set_length, self.set_type, self.set_channel,
            self.splice, self.repeat, self.swap, self.drop, self.overwrite_byte, self.insert_bytes,
            self.huge_body_size, self.field_type, self.oversized_frame, self.set_method_id,
            self.set_argument, self.set_argument, self.set_property, self.set_property,
        ]

    def mutate(self, frames: list[bytes], rate: float) -> list[bytes]:
        frames = list(frames)
        index = 0
        while index < len(frames):
            if frames[index] and self.rng.random() < rate:  # a dropped frame stays dropped
                self.rng.choice(self.operations)(frames, index)
            index += 1
        return frames

    def _spend(self, size: int) -> bool:
        if size > self.budget:
            return False
        self.budget -= size
        return True

    def flip_bits(self, frames: list[bytes], i: int) -> None:
        data = bytearray(frames[i])
        for _ in range(self.rng.randint(1, 4)):
            data[self.rng.randrange(len(data))] ^= 1 << self.rng.randrange(8)
        frames[i] = bytes(data)

    def truncate(self, frames: list[bytes], i: int) -> None:
        frames[i] = frames[i][: self.rng.randrange(len(frames[i]))]

    def set_length(self, frames: list[bytes], i: int) -> None:
        if len(frames[i]) < 7:
            return
        size = self.rng.choice(INTERESTING_SIZES + (len(frames[i]) - 8 + self.rng.randint(-3, 3),))
        frames[i] = frames[i][:3] + struct.pack(">I", size & 0xFFFFFFFF) + frames[i][7:]

    def set_type(self, frames: list[bytes], i: int) -> None:
        frames[i] = bytes((self.rng.choice((0, 1, 2, 3, 4, 8, 9, 0xCE, 0xFF)),)) + frames[i][1:]

    def set_channel(self, frames: list[bytes], i: int) -> None:
        if len(frames[i]) < 3:
            return
        channel = self.rng.choice((0, 1, 2, 3, 4, 2047, 2048, 65535, self.rng.randrange(65536)))
        frames[i] = frames[i][:1] + struct.pack(">H", channel) + frames[i][3:]

    def splice(self, frames: list[bytes], i: int) -> None:
        other = self.rng.choice(frames)
        frames[i] = frames[i][: self.rng.randrange(len(frames[i]) + 1)] + other[self.rng.randrange(len(other) + 1) :]

    def repeat(self, frames: list[bytes], i: int) -> None:
        count = self.rng.choice((2, 3, 10, 100))
        count = min(count, max(1, self.budget // max(1, len(frames[i]))))
        if self._spend(count * len(frames[i])):
            frames[i : i + 1] = [frames[i]] * count

    def swap(self, frames: list[bytes], i: int) -> None:
        j = self.rng.randrange(len(frames))
        frames[i], frames[j] = frames[j], frames[i]

    def drop(self, frames: list[bytes], i: int) -> None:
        frames[i] = b""

    def overwrite_byte(self, frames: list[bytes], i: int) -> None:
        data = bytearray(frames[i])
        if data:
            data[self.rng.randrange(len(data))] = self.rng.choice(INTERESTING_BYTES + (self.rng.randrange(256),))
        frames[i] = bytes(data)

    def insert_bytes(self, frames: list[bytes], i: int) -> None:
        at = self.rng.randrange(len(frames[i]) + 1)
        noise = self.rng.randbytes(self.rng.choice((1, 2, 4, 8, 64)))
        frames[i] = frames[i][:at] + noise + frames[i][at:]

    def huge_body_size(self, frames: list[bytes], i: int) -> None:
        """A content header announcing a huge body (or a frame claiming to be one)."""
        data = frames[i]
        if len(data) >= 7 + 12 and data[0] == 2:
            size = self.rng.choice((1 << 63, (1 << 64) - 1, 1 << 27, (1 << 27) + 1, 1 << 32))
            frames[i] = data[:11] + struct.pack(">Q", size) + data[19:]

    def field_type(self, frames: list[bytes], i: int) -> None:
        """Replace a likely field-table type tag (a byte after a short name) with any other."""
        data = bytearray(frames[i])
        spots = [at for at in range(8, len(data) - 1) if data[at] in b"tbBsuUiIlLfdDSAxTFV" and 0 < data[at - 1] < 0x7F]
        if spots:
            data[self.rng.choice(spots)] = self.rng.choice(FIELD_TYPES)
            frames[i] = bytes(data)

    def oversized_frame(self, frames: list[bytes], i: int) -> None:
        """A body (or any) frame with a payload around frame_max and the 4096 pre-tune limit."""
        size = self.rng.choice((4089, 4096, FRAME_MAX - 8, FRAME_MAX - 7, FRAME_MAX))
        if not self._spend(size):
            return
        kind = self.rng.choice((1, 2, 3))
        channel = self.rng.choice((0, 1, 2))
        frames.insert(i, struct.pack(">BHI", kind, channel, size) + bytes(size) + b"\xce")

    def set_argument(self, frames: list[bytes], i: int) -> None:
        """A decodable method with one argument set to an interesting value of its type."""
        decoded = _unmarshal(frames[i])
        if decoded is None or decoded[0] != 1:
            return
        _kind, channel, method = decoded
        names = [name for name in getattr(method, "__slots__", ()) if name not in KEPT_ARGUMENTS]
        if not names:
            return
        name = self.rng.choice(names)
        setattr(method, name, self.rng.choice(INTERESTING_VALUES.get(method.amqp_type(name), (None,))))
        frames[i] = _marshal_or(frames[i], method, channel)

    def set_property(self, frames: list[bytes], i: int) -> None:
        """A content header with one property set to an interesting value (headers: a table)."""
        decoded = _unmarshal(frames[i])
        if decoded is None or decoded[0] != 2:
            return
        _kind, channel, header = decoded
        name = self.rng.choice(commands.Basic.Properties.__slots__)
        kind = "table" if name == "headers" else commands.Basic.Properties.amqp_type(name)
        if kind == "timestamp":
            return  # pamqp wants a datetime; the bit flips cover the raw 64 bits
        setattr(header.properties, name, self.rng.choice(INTERESTING_VALUES[kind]))
        frames[i] = _marshal_or(frames[i], header, channel)

    def set_method_id(self, frames: list[bytes], i: int) -> None:
        data = frames[i]
        if len(data) >= 11 and data[0] == 1:
            ids = self.rng.choice(((10, 11), (10, 50), (20, 10), (20, 40), (30, 10), (40, 10), (50, 10), (60, 40),
                                   (60, 60), (60, 80), (85, 10), (90, 10), (0, 0), (65535, 65535)))
            frames[i] = data[:7] + struct.pack(">HH", *ids) + data[11:]


# -- sessions ---------------------------------------------------------------------------


def connection_token(number: int) -> bytes:
    """A TAG-sized name part unique to connection `number` in one run."""
    return f"c{number % 16**6:06x}".encode()


def session_frames(seed: int, number: int, scripts: list[Script]) -> list[bytes]:
    """Everything connection `number` of a run with `seed` sends, in order (deterministic)."""
    rng = random.Random(f"{seed}:{number}")
    mutator = Mutator(rng)
    frames = handshake_frames(rng.choice(TUNINGS))
    if rng.random() > VALID_HANDSHAKE_ODDS:
        frames = mutator.mutate(frames, 0.5)
    body: list[bytes] = []
    open_channels = {0}
    for _ in range(rng.randint(*SCRIPTS_PER_SESSION)):
        script = rng.choice(scripts)
        if script.channel not in open_channels:
            body += marshal(script.channel, commands.Channel.Open()) + script.setup
            open_channels.add(script.channel)
        body += script.frames
        if script.closes_channel:
            open_channels.discard(script.channel)
    if rng.random() < 0.5:
        body += marshal(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    frames += mutator.mutate(body, MUTATION_RATE)
    token = connection_token(number)
    slot = f"s{number % SLOTS:02d}".encode()
    return [piece.replace(TAG, token).replace(SLOT, slot) for piece in frames if piece]


def _unmarshal(data: bytes) -> tuple[int, int, object] | None:
    """(frame type, channel, pamqp object) of a frame pamqp can read, else None."""
    try:
        with warnings.catch_warnings():  # basic.recover-async is deprecated, and sent on purpose
            warnings.simplefilter("ignore", DeprecationWarning)
            _consumed, channel, value = frame.unmarshal(data)
    except Exception:  # whatever pamqp raises for bytes it cannot read: nothing to mutate
        return None
    return data[0], channel, value


def _marshal_or(original: bytes, value: object, channel: int) -> bytes:
    """The frame re-encoded, or `original` when pamqp refuses the value (names it validates)."""
    try:
        return frame.marshal(value, channel)
    except Exception:  # pamqp's validation and encoders raise TypeError, ValueError, struct.error
        return original
