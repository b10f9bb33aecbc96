"""Frame fuzzer: mutated AMQP frames against a live broker over TCP, while a well-behaved client watches.

Many connections run in parallel. Each sends a handshake (usually valid, sometimes mutated), then
a session built from a corpus of real client conversations (declares, publishes with rich
headers, consumes, acks, nacks, transactions, confirms, closes), in which frames are mutated: bit
flips, truncation, wrong length fields, type bytes and channel numbers, splicing two frames,
repetition, reordering, dropped frames, huge sizes. Meanwhile:

- a pika client in its own process makes a round trip (a confirmed publish and a basic.get)
  every `PROBE_INTERVAL_S`; every one must be answered within `ROUND_TRIP_BOUND_S`;
- the broker's VmRSS is sampled; the peak must stay under the bound of `rss_bound_kib`;
- the broker must stay alive, and its log must hold no internal error and no traceback.

Everything a connection sends follows from (seed, connection number), so a finding replays with
`--seed N --only-connection K`. The soak:

    python -m bench.frame_fuzz --frames 1000000 --seed 1

starts its own broker (like the interop tests: a free port, a temporary data directory) unless
`--port`, `--broker-pid` and `--broker-log` name a running one.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import decimal
import multiprocessing
import os
from queue import Empty
import random
import re
import socket
import struct
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from bench.procfs import rss_kib

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_MAX = 131072  # what the fuzzed broker offers (its default) and the corpus tunes to
CONCURRENCY = 24
# Each frame of a session is mutated with this probability (the handshake has its own odds).
MUTATION_RATE = 0.04
VALID_HANDSHAKE_ODDS = 0.85
# How many corpus scripts one session strings together; sessions stay short so that many
# connections come and go (the handshake and the teardown are fuzzed as often as the middle).
SCRIPTS_PER_SESSION = (1, 6)
# What one connection may send in a session, so the RSS bound holds: body-frame repetition and
# huge payloads are capped by it.
SESSION_BYTE_BUDGET = 1 << 20
# Socket and transport buffer of a fuzzing connection (see Fuzzer._connect).
SEND_BUFFER = 32 * 1024
# The well-behaved client.
PROBE_INTERVAL_S = 0.2
ROUND_TRIP_BOUND_S = 5.0
# Placeholder in corpus names, replaced per connection by a token of the same length, so
# connections do not fight over exclusive queues and length prefixes stay right.
TAG = b"T000000"

# A log entry (a line and whatever follows it up to the next timestamp) is a failure when it
# holds "internal error" (`log.exception` in AMQPProtocol.data_received writes "internal error
# on connection ...") or a traceback (an exception that reached a task or the event loop), or is
# CRITICAL. Plain ERROR lines are not: RabbitMQ logs a client's bad protocol header as an error.
LOG_ENTRY_START = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", re.MULTILINE)
LOG_FAILURE = re.compile(r"internal error on|^Traceback |^\S+ \S+ CRITICAL |^Exception in callback|exception was never retrieved",
                         re.MULTILINE)
# Findings of issue 10 that others fix on their own branches. Until a fix reaches main the
# fuzzer names each one it meets (its traceback's signature) instead of calling it unexplained;
# an entry is removed here when its fix lands, so the bar only goes up.
UNDECODABLE_HEADER = "a content header whose properties do not decode (issue 10 'Hostile input', branch input)"
KNOWN_FINDINGS: dict[str, str] = {
    "in decode_properties": UNDECODABLE_HEADER,  # publish checks, consumers' property reads
    "in header_fields": UNDECODABLE_HEADER,  # dead-lettering such a message edits its headers
}


# -- the corpus: what real clients send ------------------------------------------------


def _marshal(channel: int, *values: object) -> list[bytes]:
    return [frame.marshal(value, channel) for value in values]


def handshake_frames() -> list[bytes]:
    """Protocol header through connection.open, as pika sends them."""
    client_properties = {
        "product": "frame-fuzz",
        "platform": "Python",
        "capabilities": {
            "authentication_failure_close": True,
            "basic.nack": True,
            "connection.blocked": True,
            "consumer_cancel_notify": True,
            "publisher_confirms": True,
        },
        "information": "See http://pika.rtfd.org",
        "version": "1.3.2",
    }
    return [
        PROTOCOL_HEADER,
        *_marshal(
            0,
            commands.Connection.StartOk(
                client_properties=client_properties, mechanism="PLAIN", response="\0guest\0guest", locale="en_US"
            ),
            commands.Connection.TuneOk(channel_max=2047, frame_max=FRAME_MAX, heartbeat=0),
            commands.Connection.Open(virtual_host="/"),
        ),
    ]


def _rich_properties(variant: int) -> commands.Basic.Properties:
    headers = {
        "x-string": "héllo",
        "x-int": 42 + variant,
        "x-negative": -7,
        "x-big": 1 << 40,
        "x-float": 1.5,
        "x-decimal": decimal.Decimal("3.14"),
        "x-bool": True,
        "x-none": None,
        "x-time": datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc),
        "x-list": [1, "two", [3, {"four": 4}]],
        "x-table": {"nested": {"deeper": {"deepest": "yes"}}},
    }
    return commands.Basic.Properties(
        content_type="application/json",
        content_encoding="utf-8",
        headers=headers,
        delivery_mode=1 + variant % 2,
        priority=variant % 10,
        correlation_id=f"corr-{variant}",
        reply_to="fz-" + TAG.decode() + "-reply",
        expiration="60000" if variant % 3 == 0 else None,
        message_id=f"msg-{variant}",
        timestamp=datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.timezone.utc),
        message_type="fuzz",
        user_id="guest" if variant % 4 == 0 else None,
        app_id="frame-fuzz",
    )


def _publish(channel: int, exchange: str, routing_key: str, body: bytes, variant: int, **flags: bool) -> list[bytes]:
    """basic.publish, its content header and body frames split as a client with frame_max 4096 would."""
    frames = _marshal(
        channel,
        commands.Basic.Publish(exchange=exchange, routing_key=routing_key, **flags),
        ContentHeader(body_size=len(body), properties=_rich_properties(variant) if variant % 2 else None),
    )
    step = 4088
    frames += _marshal(channel, *(ContentBody(body[start : start + step]) for start in range(0, len(body), step)))
    return frames


def _recover_async() -> commands.Basic.RecoverAsync:
    """basic.recover-async: deprecated by the spec (pamqp warns), still sent by old clients."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return commands.Basic.RecoverAsync(requeue=True)


def _features(channel: int, tag: str) -> list[bytes]:
    """Dead-lettering, overflow, priorities, delayed and alternate exchanges, direct reply-to,
    passive declares and recover: the broker's less travelled paths."""
    dead_letters = f"fz-{tag}-dl"
    limited = f"fz-{tag}-lim"
    frames = _marshal(
        channel,
        commands.Queue.Declare(queue=dead_letters, exclusive=True),
        commands.Queue.Declare(queue=limited, exclusive=True, arguments={
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead_letters, "x-max-length": 2,
            "x-overflow": "reject-publish-dlx", "x-max-priority": 5, "x-message-ttl": 50, "x-delivery-limit": 2,
        }),
        commands.Exchange.Declare(exchange="fz-delayed", exchange_type="x-delayed-message",
                                  arguments={"x-delayed-type": "direct"}),
        commands.Exchange.Declare(exchange="fz-alt", exchange_type="fanout", arguments={"alternate-exchange": "amq.fanout"}),
        commands.Queue.Bind(queue=limited, exchange="fz-delayed", routing_key=limited),
        commands.Queue.Declare(queue=limited, passive=True),
        commands.Exchange.Declare(exchange="fz-delayed", passive=True),
        commands.Confirm.Select(nowait=True),
        commands.Basic.Consume(queue="amq.rabbitmq.reply-to", no_ack=True, consumer_tag=f"reply-{tag}"),
        commands.Basic.Consume(queue=dead_letters, consumer_tag=f"dl-{tag}", arguments={"x-priority": 7},
                               exclusive=True),
    )
    for variant in range(5):
        frames += _publish(channel, "", limited, b"overflow", variant)
    frames += _marshal(
        channel,
        commands.Basic.Publish(exchange="fz-delayed", routing_key=limited),
        ContentHeader(body_size=5, properties=commands.Basic.Properties(
            headers={"x-delay": 30}, reply_to="amq.rabbitmq.reply-to", priority=9, expiration="0")),
        ContentBody(b"later"),
    )
    frames += _publish(channel, "fz-alt", "any", b"alternate", 2, mandatory=True)
    frames += _marshal(
        channel,
        commands.Basic.Get(queue=limited),
        commands.Basic.Nack(delivery_tag=0, multiple=True, requeue=True),
        commands.Basic.Get(queue=limited),
        commands.Basic.Nack(delivery_tag=0, multiple=True, requeue=False),
        _recover_async(),
        commands.Basic.Cancel(consumer_tag=f"dl-{tag}", nowait=True),
        commands.Queue.Delete(queue=limited, if_unused=True, if_empty=True),
    )
    return frames


@dataclass(frozen=True)
class Script:
    """A piece of a client conversation on one channel. A session opens the channel before it,
    followed by `setup` (the declarations the script relies on), if the channel is not open."""

    channel: int
    frames: list[bytes]
    setup: list[bytes] = field(default_factory=list)
    closes_channel: bool = False


def corpus_scripts() -> list[Script]:
    """Conversations after the handshake; names carry the TAG placeholder. Transactions and
    confirms get channels of their own (a channel cannot be both), the rest share 1 to 3."""
    tag = TAG.decode()
    queue = f"fz-{tag}-q"
    args = {"x-max-length": 50, "x-message-ttl": 60000}
    declare_queue = commands.Queue.Declare(queue=queue, exclusive=True, arguments=args)
    scripts: list[Script] = []
    for channel in (1, 2, 3):
        declares = _marshal(
            channel,
            commands.Exchange.Declare(exchange=f"fz-x{channel}", exchange_type="topic"),
            commands.Exchange.Declare(exchange=f"fz-h{channel}", exchange_type="headers", auto_delete=True),
            declare_queue,
            commands.Queue.Declare(queue="", exclusive=True, auto_delete=True),
            commands.Queue.Bind(queue=queue, exchange=f"fz-x{channel}", routing_key="a.*.c"),
            commands.Queue.Bind(queue=queue, exchange=f"fz-h{channel}", arguments={"x-match": "any", "k": "v"}),
            commands.Exchange.Bind(destination=f"fz-h{channel}", source=f"fz-x{channel}", routing_key="#"),
        )
        publishes: list[bytes] = []
        for variant, size in enumerate((0, 10, 300, 5000, 9000)):
            publishes += _publish(channel, "", queue, bytes(range(256)) * (size // 256) + b"x" * (size % 256), variant)
        publishes += _publish(channel, f"fz-x{channel}", "a.b.c", b"routed", 3)
        consume = _marshal(
            channel,
            declare_queue,
            commands.Basic.Qos(prefetch_count=3),
            commands.Basic.Consume(queue=queue, consumer_tag=f"ctag-{tag}"),
        )
        for variant in range(4):
            consume += _publish(channel, "", queue, b"consume me", variant)
        consume += _marshal(
            channel,
            commands.Basic.Ack(delivery_tag=1),
            commands.Basic.Nack(delivery_tag=2, requeue=True),
            commands.Basic.Reject(delivery_tag=3, requeue=False),
            commands.Basic.Ack(delivery_tag=0, multiple=True),
            commands.Basic.Get(queue=queue),
            commands.Basic.Recover(requeue=True),
            commands.Basic.Cancel(consumer_tag=f"ctag-{tag}"),
            commands.Queue.Purge(queue=queue),
        )
        teardown = _marshal(
            channel,
            commands.Basic.Qos(prefetch_count=10, global_=True),
            commands.Channel.Flow(active=True),
            commands.Queue.Unbind(queue=queue, exchange=f"fz-x{channel}", routing_key="a.*.c"),
            commands.Exchange.Unbind(destination=f"fz-h{channel}", source=f"fz-x{channel}", routing_key="#"),
            commands.Queue.Delete(queue=queue),
            commands.Exchange.Delete(exchange=f"fz-h{channel}"),
            commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0),
        )
        scripts += [Script(channel, declares), Script(channel, publishes, declares), Script(channel, consume, declares),
                    Script(channel, teardown, declares, closes_channel=True), Script(channel, _features(channel, tag))]
    for channel in (4, 5):
        tx = _marshal(channel, declare_queue, commands.Tx.Select())
        tx += _publish(channel, "", queue, b"tx one", 1)
        tx += _marshal(channel, commands.Tx.Commit(), commands.Basic.Get(queue=queue), commands.Basic.Ack(delivery_tag=1))
        tx += _publish(channel, "", queue, b"tx two", 2)
        tx += _marshal(channel, commands.Tx.Rollback(), commands.Tx.Commit())
        scripts.append(Script(channel, tx))
    for channel in (6, 7):
        confirms = _marshal(channel, commands.Confirm.Select())
        confirms += _publish(channel, "", queue, b"confirmed", 1)
        confirms += _publish(channel, "", "nowhere", b"returned", 2, mandatory=True)
        confirms += _publish(channel, "amq.headers", "", b"to headers", 3)
        scripts.append(Script(channel, confirms))
    scripts.append(Script(0, [struct.pack(">BHI", 8, 0, 0) + b"\xce"]))  # a heartbeat
    return scripts


# -- mutations -------------------------------------------------------------------------

INTERESTING_SIZES = (0, 1, 3, 4, 7, 8, 4087, 4088, 4096, 4097, FRAME_MAX - 8, FRAME_MAX - 1, FRAME_MAX, FRAME_MAX + 1,
                     0x7FFFFFFF, 0xFFFFFFFF)
INTERESTING_BYTES = (0x00, 0x01, 0x7F, 0x80, 0xCE, 0xFF)
FIELD_TYPES = b"tbBsuUiIlLfdDSAxTFVZ\x00\xff"


class Mutator:
    """Turns a session's frames into hostile ones; every choice comes from `rng`."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.budget = SESSION_BYTE_BUDGET
        self.operations: list[Callable[[list[bytes], int], None]] = [
            self.flip_bits, self.flip_bits, self.truncate, self.set_length, self.set_type, self.set_channel,
            self.splice, self.repeat, self.swap, self.drop, self.overwrite_byte, self.insert_bytes,
            self.huge_body_size, self.field_type, self.oversized_frame, self.set_method_id,
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
    frames = handshake_frames()
    if rng.random() > VALID_HANDSHAKE_ODDS:
        frames = mutator.mutate(frames, 0.5)
    body: list[bytes] = []
    open_channels = {0}
    for _ in range(rng.randint(*SCRIPTS_PER_SESSION)):
        script = rng.choice(scripts)
        if script.channel not in open_channels:
            body += _marshal(script.channel, commands.Channel.Open()) + script.setup
            open_channels.add(script.channel)
        body += script.frames
        if script.closes_channel:
            open_channels.discard(script.channel)
    if rng.random() < 0.5:
        body += _marshal(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    frames += mutator.mutate(body, MUTATION_RATE)
    token = connection_token(number)
    return [piece.replace(TAG, token) for piece in frames if piece]


# -- the run ---------------------------------------------------------------------------

CLOSE_OK_FRAME = frame.marshal(commands.Connection.CloseOk(), 0)
_CONNECTION_CLOSE = b"\x00\x0a\x00\x32"
_OUR_FRAME = re.compile(r'File "[^"]*/((?:amqp_server|queues|exchanges|persistence)/[\w/]+\.py)", line \d+, in (\w+)')
_PEER = re.compile(r"127\.0\.0\.1:(\d+)")


@dataclass
class LogFailure:
    """One kind of failure in the broker log: the broker's frames of its traceback (or its
    first line), how often it happened, and which fuzzing connections it happened on."""

    signature: str
    example: str
    count: int = 0
    ports: list[int] = field(default_factory=list)
    known: str | None = None


def log_failures(text: str) -> list[LogFailure]:
    """The failure entries of a broker log, grouped by signature (see LOG_FAILURE)."""
    starts = [match.start() for match in LOG_ENTRY_START.finditer(text)] or [0]
    if starts[0] != 0:
        starts.insert(0, 0)
    kinds: dict[str, LogFailure] = {}
    for begin, end in zip(starts, starts[1:] + [len(text)]):
        entry = text[begin:end].strip()
        if not LOG_FAILURE.search(entry):
            continue
        ours = " <- ".join(f"{path}:{function}" for path, function in reversed(_OUR_FRAME.findall(entry)))
        if ours:
            signature = f"{entry.splitlines()[-1].split(':')[0]} at {ours}"
        else:
            signature = re.sub(r"\d+", "N", entry.splitlines()[0][24:])
        kind = kinds.setdefault(signature, LogFailure(signature, entry))
        kind.count += 1
        kind.ports += [int(port) for port in _PEER.findall(entry.splitlines()[0])]
        kind.known = next((name for marker, name in KNOWN_FINDINGS.items() if marker in entry), None)
    return list(kinds.values())


@dataclass
class FuzzReport:
    seed: int
    frames: int = 0
    bytes_sent: int = 0
    connections: int = 0
    closed_by_broker: int = 0  # connections the broker closed with connection.close (an error)
    duration_s: float = 0.0
    baseline_rss_kib: int = 0
    peak_rss_kib: int = 0
    rss_bound_kib: int = 0
    round_trips: int = 0
    max_round_trip_s: float = 0.0
    broker_alive: bool = True
    log_failures: list[LogFailure] = field(default_factory=list)
    probe_failures: list[str] = field(default_factory=list)
    # Local port -> connection number, so a log line naming a peer leads to its replay.
    ports: dict[int, int] = field(default_factory=dict)

    @property
    def known_findings(self) -> dict[str, int]:
        """Failures that are issue-10 findings fixed elsewhere (KNOWN_FINDINGS), with their counts."""
        found: dict[str, int] = {}
        for failure in self.log_failures:
            if failure.known is not None:
                found[failure.known] = found.get(failure.known, 0) + failure.count
        return found

    def problems(self) -> list[str]:
        """Everything the run found except the known findings: empty when the broker held up."""
        found = []
        if not self.broker_alive:
            found.append("the broker process died")
        if self.peak_rss_kib > self.rss_bound_kib:
            found.append(f"peak RSS {self.peak_rss_kib} KiB over the bound of {self.rss_bound_kib} KiB")
        for failure in self.log_failures:
            if failure.known is None:
                replays = ", ".join(str(self.ports[port]) for port in failure.ports[:5] if port in self.ports)
                found.append(f"{failure.count} x {failure.signature} (connections {replays or '?'}):\n{failure.example}")
        found += [f"well-behaved client: {text}" for text in self.probe_failures]
        return found

    def summary(self) -> str:
        known = "".join(f"\n  known finding, {count} x: {name}" for name, count in self.known_findings.items())
        return (
            f"seed {self.seed}: {self.frames} frames ({self.bytes_sent / 1e6:.1f} MB) on {self.connections} connections "
            f"({self.closed_by_broker} closed by the broker with an error) "
            f"in {self.duration_s:.1f} s; RSS {self.baseline_rss_kib // 1024} MiB at start, peak "
            f"{self.peak_rss_kib // 1024} MiB (bound {self.rss_bound_kib // 1024} MiB); well-behaved client: "
            f"{self.round_trips} round trips, max {self.max_round_trip_s * 1000:.0f} ms{known}"
        )


def rss_bound_kib(baseline_kib: int, concurrency: int) -> int:
    """What the broker may hold at most: its RSS at start, plus for every fuzzing connection
    its session budget and a frame_max read buffer, twice over (input is copied once into
    messages and once into queue entries), plus 64 MiB for the allocator and the garbage the
    collector has not reached."""
    per_connection = 2 * (SESSION_BYTE_BUDGET + FRAME_MAX) // 1024
    return baseline_kib + concurrency * per_connection + 64 * 1024


def _probe(host: str, port: int, stop: "multiprocessing.synchronize.Event", last_answer: "multiprocessing.sharedctypes.Synchronized",
           stats: "multiprocessing.queues.Queue") -> None:
    """The well-behaved client: a confirmed publish and a basic.get, every PROBE_INTERVAL_S."""
    import pika

    round_trips = 0
    slowest = 0.0
    try:
        parameters = pika.ConnectionParameters(host=host, port=port, heartbeat=0, blocked_connection_timeout=60)
        connection = pika.BlockingConnection(parameters)
        channel = connection.channel()
        channel.confirm_delivery()
        queue = channel.queue_declare("", exclusive=True).method.queue
        while not stop.is_set():
            started = time.monotonic()
            channel.basic_publish("", queue, b"probe", mandatory=True)
            method, _properties, body = channel.basic_get(queue, auto_ack=True)
            if method is None or body != b"probe":
                raise AssertionError(f"basic.get returned {method!r} {body!r}")
            elapsed = time.monotonic() - started
            last_answer.value = time.monotonic()
            round_trips += 1
            slowest = max(slowest, elapsed)
            stop.wait(PROBE_INTERVAL_S)
        connection.close()
        stats.put((round_trips, slowest, None))
    except Exception as error:  # reported to the fuzzer, which fails the run
        stats.put((round_trips, slowest, f"{type(error).__name__}: {error}"))


class Fuzzer:
    """Runs the fuzzing connections against one broker and watches it."""

    def __init__(self, host: str, port: int, pid: int, log_path: Path, seed: int, frames: int | None,
                 duration_s: float | None, concurrency: int = CONCURRENCY, only_connection: int | None = None) -> None:
        self.host, self.port, self.pid, self.log_path = host, port, pid, log_path
        self.frame_target = frames
        self.duration_s = duration_s
        self.concurrency = 1 if only_connection is not None else concurrency
        self.only_connection = only_connection
        self.report = FuzzReport(seed=seed)
        self.scripts = corpus_scripts()
        self._next_connection = 0 if only_connection is None else only_connection
        self._deadline = 0.0
        self._stop = asyncio.Event()
        self._last_answer: Any = None  # the well-behaved client's shared clock, set by run()

    def _done(self) -> bool:
        if self._stop.is_set():
            return True
        if self.frame_target is not None and self.report.frames >= self.frame_target:
            return True
        return self.duration_s is not None and time.monotonic() >= self._deadline

    def _take_connection_number(self) -> int | None:
        if self.only_connection is not None and self._next_connection > self.only_connection:
            return None
        number = self._next_connection
        self._next_connection += 1
        return number

    async def _worker(self) -> None:
        while not self._done():
            number = self._take_connection_number()
            if number is None:
                return
            await self._run_connection(number, session_frames(self.report.seed, number, self.scripts))

    async def _run_connection(self, number: int, frames: list[bytes]) -> None:
        """Send the session in batches until it ends or the broker closes the connection."""
        try:
            reader, writer = await self._connect()
        except OSError as error:
            self.report.probe_failures.append(f"fuzz connection {number} could not connect: {error}")
            self._stop.set()
            return
        self.report.connections += 1
        self.report.ports[writer.get_extra_info("sockname")[1]] = number
        answers = asyncio.create_task(self._read_until_closed(reader, writer))
        try:
            for start in range(0, len(frames), 16):
                if answers.done() or self._done():
                    break
                batch = frames[start : start + 16]
                data = b"".join(batch)
                writer.write(data)
                await writer.drain()
                self.report.frames += len(batch)
                self.report.bytes_sent += len(data)
            # Give the broker the time to answer (and close what it must) before we hang up.
            if await asyncio.wait_for(asyncio.shield(answers), 0.2):
                self.report.closed_by_broker += 1
        except (OSError, asyncio.TimeoutError):
            pass
        finally:
            answers.cancel()
            writer.close()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection that cannot run far ahead of the broker: small socket and transport
        buffers, so frames counted as sent are frames the broker was about to read, not
        megabytes queued in the kernel that a close would throw away."""
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, (self.host, self.port))
        except OSError:
            sock.close()
            raise
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.transport.set_write_buffer_limits(high=SEND_BUFFER)
        return reader, writer

    @staticmethod
    async def _read_until_closed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Drop what the broker sends; at its connection.close answer close-ok, as a client must,
        and return True (the session stops: frames after it would only be discarded). False when
        the socket closed without one."""
        buffer = bytearray()
        while data := await reader.read(1 << 16):
            buffer += data
            offset = 0
            while len(buffer) - offset >= 8:
                kind, channel, size = struct.unpack_from(">BHI", buffer, offset)
                if len(buffer) - offset < size + 8:
                    break
                if kind == 1 and channel == 0 and buffer[offset + 7 : offset + 11] == _CONNECTION_CLOSE:
                    writer.write(CLOSE_OK_FRAME)
                    return True
                offset += size + 8
            del buffer[:offset]
        return False

    async def _watch(self) -> None:
        """Sample RSS and the well-behaved client until the run ends; stop it at the first problem."""
        while not self._done():
            try:
                self.report.peak_rss_kib = max(self.report.peak_rss_kib, rss_kib(self.pid))
            except (OSError, RuntimeError):  # the process is gone (or a zombie without VmRSS)
                self.report.broker_alive = False
                self._stop.set()
                return
            silent = time.monotonic() - self._last_answer.value
            if silent > ROUND_TRIP_BOUND_S + PROBE_INTERVAL_S:
                self.report.probe_failures.append(f"no answer for {silent:.1f} s")
                self._stop.set()
                return
            await asyncio.sleep(0.1)

    def run(self) -> FuzzReport:
        context = multiprocessing.get_context("spawn")
        stop = context.Event()
        self._last_answer = context.Value("d", time.monotonic() + 10.0)  # pika's start-up is not a stall
        stats = context.Queue()
        probe = context.Process(target=_probe, args=(self.host, self.port, stop, self._last_answer, stats), daemon=True)
        log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.report.baseline_rss_kib = self.report.peak_rss_kib = rss_kib(self.pid)
        self.report.rss_bound_kib = rss_bound_kib(self.report.baseline_rss_kib, self.concurrency)
        probe.start()
        started = time.monotonic()
        try:
            asyncio.run(self._run_all(started))
        finally:
            self.report.duration_s = time.monotonic() - started
            stop.set()
            self._collect_probe(probe, stats)
        self.report.broker_alive = self.report.broker_alive and Path(f"/proc/{self.pid}/status").exists()
        with open(self.log_path, "rb") as log:
            log.seek(log_offset)
            self.report.log_failures = log_failures(log.read().decode(errors="replace"))
        return self.report

    async def _run_all(self, started: float) -> None:
        self._deadline = started + (self.duration_s or float("inf"))
        watcher = asyncio.create_task(self._watch())
        await asyncio.gather(*(self._worker() for _ in range(self.concurrency)))
        self._stop.set()
        await watcher

    def _collect_probe(self, probe: Any, stats: Any) -> None:
        try:
            round_trips, slowest, error = stats.get(timeout=ROUND_TRIP_BOUND_S + 5)
        except Empty:
            round_trips, slowest, error = 0, 0.0, "the well-behaved client never reported (stalled)"
        probe.join(5)
        if probe.is_alive():
            probe.kill()
        self.report.round_trips = round_trips
        self.report.max_round_trip_s = slowest
        if error is not None:
            self.report.probe_failures.append(error)
        if slowest > ROUND_TRIP_BOUND_S:
            self.report.probe_failures.append(f"a round trip took {slowest:.1f} s (bound {ROUND_TRIP_BOUND_S} s)")


# -- command line ----------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.frame_fuzz", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=1_000_000, help="stop after this many frames (default 1,000,000)")
    parser.add_argument("--duration", type=float, help="stop after this many seconds")
    parser.add_argument("--seed", type=int, default=None, help="replay a run (default: random)")
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY, help=f"parallel connections ({CONCURRENCY})")
    parser.add_argument("--only-connection", type=int, help="replay one connection of the seed's run")
    parser.add_argument("--port", type=int, help="fuzz a running broker on 127.0.0.1 (with --broker-pid, --broker-log)")
    parser.add_argument("--broker-pid", type=int)
    parser.add_argument("--broker-log", type=Path)
    parser.add_argument("--workdir", type=Path, help="keep the started broker's data and log here")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    print(f"frame fuzz: seed {seed}, replay with: python -m bench.frame_fuzz --seed {seed} --frames {args.frames}",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="frame-fuzz-") as scratch:
        broker = None
        if args.port is None:
            from interop_tests.broker_process import launch

            broker = launch(args.workdir or Path(scratch))
            host, port, pid, log_path = broker.host, broker.port, broker.process.pid, broker.log_path
        else:
            host, port, pid, log_path = "127.0.0.1", args.port, args.broker_pid, args.broker_log
        try:
            report = Fuzzer(host, port, pid, log_path, seed, args.frames, args.duration, args.concurrency,
                            args.only_connection).run()
        finally:
            if broker is not None:
                broker.stop()
        print(report.summary())
        problems = report.problems()
        for problem in problems:
            print(f"FAIL: {problem}")
        if problems:
            print(f"replay one connection: python -m bench.frame_fuzz --seed {seed} --only-connection K")
        print(f"load: {os.getloadavg()}")
        return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
