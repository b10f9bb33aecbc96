"""Publish many messages over AMQP 0-9-1 with publisher confirms, as cheaply as Python allows.

``ConfirmedPublisher(url).publish_all(messages)`` opens one connection (``amqp://`` or
``amqps://``, PLAIN login, heartbeats off) and one channel in confirm mode, and publishes
``(exchange, routing_key, properties, body)`` tuples, ``properties`` already encoded
(``encode_properties``), keeping up to ``window`` messages unconfirmed. The frames of many
messages go out in one ``sendall``; the handshake and every frame other than publishes and
confirms go through pamqp. It returns once the broker confirmed every message, or raises
``PublishFailed``: a nack, a mandatory message returned as unroutable, the channel or connection
closed by the broker (its reply code and text), or nothing from the broker for ``timeout_s``
seconds (a broker blocked by an alarm stops reading). Messages confirmed before a failure stay
published; the caller publishes them again under the same ids, for the broker to deduplicate.

(pika's blocking channel waits for each confirm in turn; its asynchronous connection sends
every frame with a system call of its own and costs about four times the CPU per message.)
"""

from __future__ import annotations

import select
import socket
import ssl
import struct
import urllib.parse
from typing import Any, Iterator

from pamqp import commands, frame as pamqp_frame
from pamqp.exceptions import UnmarshalingException

from persistence.properties_format import HEADERS_TABLE, PROPERTY_KINDS, PROPERTY_NAMES

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
CHANNEL = 1
_FRAME_HEAD = struct.Struct(">BHI")
_METHOD_IDS = struct.Struct(">HH")
_CONTENT_HEAD = struct.Struct(">HHQ")
_TAG = struct.Struct(">Q")
_END = b"\xce"
_BASIC, _ACK, _NACK = 60, 80, 120
_CHUNK_BYTES = 256 * 1024  # frames gathered before a send


class PublishFailed(RuntimeError):
    """The broker did not take every message."""


class ConfirmedPublisher:
    """One publishing run over one connection; see the module docstring."""

    def __init__(self, url: str, *, window: int = 1000, timeout_s: float = 60.0, mandatory: bool = True) -> None:
        self.url, self.window, self.timeout_s, self.mandatory = url, window, timeout_s, mandatory
        self.frame_max = 131072
        self._sock: socket.socket | None = None
        self._buffer = bytearray()
        self._sent = 0
        self._confirmed = 0
        self._error: str | None = None
        self._methods: dict[tuple[str, str], bytes] = {}

    def publish_all(self, messages: Iterator[tuple[str, str, bytes, bytes]]) -> int:
        """Publish every message; how many. Raises ``PublishFailed``."""
        try:
            self._connect()
            self._run(iter(messages))
            self._close()
        except (OSError, UnmarshalingException) as err:
            raise PublishFailed(f"amqp-queue sink: {err!r} talking to {self._where()} ({self._confirmed} of "
                                f"{self._sent} messages confirmed)") from err
        finally:
            if self._sock is not None:
                self._sock.close()
        return self._confirmed

    # ---- the run ----

    def _run(self, messages: Iterator[tuple[str, str, bytes, bytes]]) -> None:
        exhausted = False
        while True:
            if self._error is not None:
                raise PublishFailed(f"amqp-queue sink: {self._error} ({self._confirmed} of {self._sent} messages "
                                    "confirmed)")
            if not exhausted and self._sent - self._confirmed < self.window:
                chunk = bytearray()
                while self._sent - self._confirmed < self.window and len(chunk) < _CHUNK_BYTES:
                    try:
                        exchange, routing_key, properties, body = next(messages)
                    except StopIteration:
                        exhausted = True
                        break
                    chunk += self._publish_frames(exchange, routing_key, properties, body)
                    self._sent += 1
                if chunk:
                    self._send(chunk)
                self._read(wait=False)
                continue
            if exhausted and self._confirmed >= self._sent:
                return
            self._read(wait=True)

    def _publish_frames(self, exchange: str, routing_key: str, properties: bytes, body: bytes) -> bytes:
        method = self._methods.get((exchange, routing_key))
        if method is None:
            # Built here, not by pamqp's Basic.Publish: pamqp refuses exchange names RabbitMQ (and
            # this broker) accept, non-ASCII ones and those over 127 characters.
            payload = _METHOD_IDS.pack(_BASIC, 40) + b"\x00\x00" + _shortstr(exchange, "exchange") + \
                _shortstr(routing_key, "routing_key") + (b"\x01" if self.mandatory else b"\x00")
            method = _frame(1, payload)
            if len(self._methods) < 4096:
                self._methods[(exchange, routing_key)] = method
        header = _frame(2, _CONTENT_HEAD.pack(_BASIC, 0, len(body)) + properties)
        room = self.frame_max - 8
        if len(body) <= room:
            return method + header + (_frame(3, body) if body else b"")
        return method + header + b"".join(_frame(3, body[i : i + room]) for i in range(0, len(body), room))

    def _send(self, data: bytes | bytearray) -> None:
        assert self._sock is not None
        try:
            self._sock.sendall(data)
        except socket.timeout:
            raise PublishFailed(f"amqp-queue sink: the broker took no data for {self.timeout_s:g} s (blocked by a "
                                f"resource alarm?) ({self._confirmed} of {self._sent} messages confirmed)") from None

    def _read(self, wait: bool) -> None:
        """Take in what the broker sent; with ``wait``, wait (up to the timeout) for something."""
        sock = self._sock
        assert sock is not None
        if not wait and not select.select([sock], [], [], 0)[0]:
            return
        try:
            data = sock.recv(1 << 16)
        except socket.timeout:
            raise PublishFailed(f"amqp-queue sink: no confirm from the broker for {self.timeout_s:g} s "
                                f"({self._confirmed} of {self._sent} messages confirmed)") from None
        if not data:
            raise PublishFailed(f"amqp-queue sink: the broker closed the connection ({self._confirmed} of "
                                f"{self._sent} messages confirmed)")
        self._buffer += data
        self._frames()

    def _frames(self) -> None:
        buffer = self._buffer
        pos = 0
        while len(buffer) - pos >= 7:
            kind, channel, size = _FRAME_HEAD.unpack_from(buffer, pos)
            end = pos + 7 + size + 1
            if end > len(buffer):
                break
            if kind == 1 and size >= 13:
                class_id, method_id = _METHOD_IDS.unpack_from(buffer, pos + 7)
                if class_id == _BASIC and method_id in (_ACK, _NACK):
                    self._confirm(method_id == _ACK, _TAG.unpack_from(buffer, pos + 11)[0], buffer[pos + 19] & 1)
                    pos = end
                    continue
            if kind in (1, 2, 3):
                self._other(bytes(buffer[pos:end]))
            pos = end  # heartbeats (none are asked for) and anything else: nothing to do
        del buffer[:pos]

    def _confirm(self, acked: bool, tag: int, multiple: int) -> None:
        if not acked:
            self._error = self._error or f"the broker refused (nacked) message {tag}"
        self._confirmed = tag if multiple else max(self._confirmed, tag)

    def _other(self, raw: bytes) -> None:
        _, _, value = pamqp_frame.unmarshal(raw)
        if isinstance(value, commands.Basic.Return):
            self._error = self._error or (
                f"a message was returned as unroutable: {value.reply_code} {value.reply_text} (exchange "
                f"{value.exchange!r}, routing key {value.routing_key!r}): no queue is bound for it")
        elif isinstance(value, commands.Channel.Close):
            self._error = self._error or f"the broker closed the channel: {value.reply_code} {value.reply_text}"
            self._send(pamqp_frame.marshal(commands.Channel.CloseOk(), CHANNEL))
            raise PublishFailed(f"amqp-queue sink: {self._error} ({self._confirmed} of {self._sent} confirmed)")
        elif isinstance(value, commands.Connection.Close):
            self._error = self._error or f"the broker closed the connection: {value.reply_code} {value.reply_text}"
            self._send(pamqp_frame.marshal(commands.Connection.CloseOk(), 0))
            raise PublishFailed(f"amqp-queue sink: {self._error} ({self._confirmed} of {self._sent} confirmed)")
        # Connection.Blocked / Unblocked, the content of a returned message: nothing to do.

    # ---- connecting ----

    def _where(self) -> str:
        parsed = urllib.parse.urlsplit(self.url)
        return f"{parsed.hostname}:{parsed.port or (5671 if parsed.scheme == 'amqps' else 5672)}"

    def _connect(self) -> None:
        parsed = urllib.parse.urlsplit(self.url)
        tls = parsed.scheme == "amqps"
        host = parsed.hostname or "localhost"
        sock = socket.create_connection((host, parsed.port or (5671 if tls else 5672)), timeout=self.timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls:
            query = urllib.parse.parse_qs(parsed.query)
            context = ssl.create_default_context(cafile=query.get("cafile", [None])[0])
            sock = context.wrap_socket(sock, server_hostname=host)
        self._sock = sock
        user = urllib.parse.unquote(parsed.username or "guest")
        password = urllib.parse.unquote(parsed.password or "guest")
        vhost = urllib.parse.unquote(parsed.path[1:]) if len(parsed.path) > 1 else "/"
        sock.sendall(PROTOCOL_HEADER)
        self._expect(commands.Connection.Start)
        client: Any = {"product": "amqp-queue Spark sink",
                       "capabilities": {"publisher_confirms": True, "connection.blocked": True, "basic.nack": True}}
        self._call(commands.Connection.StartOk(
            client_properties=client,
            mechanism="PLAIN", response=f"\0{user}\0{password}", locale="en_US"), 0, None)
        tune = self._expect(commands.Connection.Tune)
        self.frame_max = min(tune.frame_max or 131072, 131072)
        self._call(commands.Connection.TuneOk(channel_max=tune.channel_max, frame_max=self.frame_max, heartbeat=0),
                   0, None)
        self._call(commands.Connection.Open(virtual_host=vhost), 0, commands.Connection.OpenOk)
        self._call(commands.Channel.Open(), CHANNEL, commands.Channel.OpenOk)
        self._call(commands.Confirm.Select(), CHANNEL, commands.Confirm.SelectOk)

    def _call(self, method: Any, channel: int, reply: type | None) -> Any:
        assert self._sock is not None
        self._sock.sendall(pamqp_frame.marshal(method, channel))
        return None if reply is None else self._expect(reply)

    def _expect(self, kind: type) -> Any:
        """The next method frame, which must be a ``kind``."""
        assert self._sock is not None
        while True:
            buffer = self._buffer
            if len(buffer) >= 7:
                _, _, size = _FRAME_HEAD.unpack_from(buffer, 0)
                if len(buffer) >= 8 + size:
                    raw = bytes(buffer[: 8 + size])
                    del buffer[: 8 + size]
                    _, _, value = pamqp_frame.unmarshal(raw)
                    if isinstance(value, kind):
                        return value
                    if isinstance(value, (commands.Connection.Close, commands.Channel.Close)):
                        raise PublishFailed(f"amqp-queue sink: {self._where()} refused: {value.reply_code} "
                                            f"{value.reply_text}")
                    continue
            data = self._sock.recv(1 << 16)
            if not data:
                raise PublishFailed(f"amqp-queue sink: {self._where()} closed the connection while opening it "
                                    "(wrong user or password, or no such vhost?)")
            buffer += data

    def _close(self) -> None:
        self._call(commands.Connection.Close(reply_code=200, reply_text="done", class_id=0, method_id=0), 0, commands.Connection.CloseOk)


def _frame(kind: int, payload: bytes) -> bytes:
    return _FRAME_HEAD.pack(kind, CHANNEL, len(payload)) + payload + _END


def _shortstr(value: str, what: str) -> bytes:
    raw = value.encode()
    if len(raw) > 255:
        raise ValueError(f"amqp-queue sink: {what} is longer than 255 bytes: {value[:40]!r}...")
    return bytes((len(raw),)) + raw


# ---- the basic properties ----------------------------------------------------------------------------

# The basic properties in wire order, each with its flag bit (AMQP 0-9-1 section 4.2.6.1) and kind
# (a short string, the headers table, or a fixed width: persistence.properties_format, the source's
# decoder, reads them by the same table).
PROPERTY_FLAGS = tuple((name, 0x8000 >> i, kind) for i, (name, kind) in enumerate(zip(PROPERTY_NAMES, PROPERTY_KINDS)))
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")
_F64 = struct.Struct(">d")


def encode_properties(values: dict[str, Any]) -> bytes:
    """The property flags and list of a content header for the properties in ``values`` (names
    as in ``PROPERTY_NAMES``; a None value is absent); ``timestamp`` in seconds."""
    flags = 0
    parts = []
    for name, flag, kind in PROPERTY_FLAGS:
        value = values.get(name)
        if value is None:
            continue
        flags |= flag
        if kind == 1:  # delivery_mode, priority: an octet
            if not 0 <= value <= 255:
                raise ValueError(f"amqp-queue sink: {name} must be 0..255, not {value}")
            parts.append(bytes((value,)))
        elif kind == HEADERS_TABLE:
            parts.append(encode_table(value))
        elif kind == 8:  # timestamp
            parts.append(_U64.pack(value))
        else:
            parts.append(_shortstr(value, name))
    return _U16.pack(flags) + b"".join(parts)


def encode_table(table: dict[str, Any]) -> bytes:
    """An AMQP field table (strings as long strings, integers as 64-bit, floats as doubles).

    Not pamqp's ``encode.field_table``: it writes a float as a 32-bit ``f`` (1.1 reads back as
    1.100000023841858) and refuses ``bytes`` (Spark's binary map values)."""
    out = bytearray()
    for key, value in table.items():
        out += _shortstr(str(key), "a header name")
        out += _field(value)
    return _U32.pack(len(out)) + bytes(out)


def _field(value: Any) -> bytes:
    if value is None:
        return b"V"
    if isinstance(value, bool):
        return b"t\x01" if value else b"t\x00"
    if isinstance(value, int):
        return b"l" + _I64.pack(value)
    if isinstance(value, float):
        return b"d" + _F64.pack(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        return b"x" + _U32.pack(len(raw)) + raw
    if isinstance(value, dict):
        return b"F" + encode_table(value)
    if isinstance(value, (list, tuple)):
        items = b"".join(_field(item) for item in value)
        return b"A" + _U32.pack(len(items)) + items
    raw = str(value).encode()
    return b"S" + _U32.pack(len(raw)) + raw
