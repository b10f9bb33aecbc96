"""A persistent publish with confirms crosses the layers downward only, from socket read to confirm.

A newcomer must be able to follow one publish through the code (issues 14 and 22). This runs a
real broker on a free 127.0.0.1 port with a durable queue, publishes one persistent message in
confirm mode, and records every call of a project function between the moment the publish bytes
reach the broker's socket and the moment its basic.ack is written back (sys.setprofile on the
event loop; the fsync itself runs in the group commit's worker thread). A call's caller is the
nearest project function on the stack (a call through the standard library counts as its
caller's); the event loop's own calls (a read, a write, the group commit's rounds) have none.

Layers are those of tests/test_import_layers.py. Every call goes to the caller's layer or a
lower one, except the callbacks a lower layer was handed, named in HANDED_DOWN: that is how the
confirm comes back up. The publish's way down is WAY_DOWN, and amqp_server/runtime/server.py's
docstring describes both; these tests keep all three true.
"""

from __future__ import annotations

import asyncio
import functools
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from amqp_server.broker.broker import Broker
from amqp_server.config.settings import ServerConfig
from amqp_server.runtime.server import AMQPServer
from persistence.definitions import FileDefinitionStore
from tests.frame_driver import PROTOCOL_HEADER, marshal, plain_response
from tests.test_import_layers import MODULES, RANK, unit_of

ROOT = Path(__file__).resolve().parent.parent
# The exchange of the traced publish: a named one, so the publish is routed by the broker's vhost
# (to the default exchange the channel looks the queue up by name itself).
EXCHANGE = "amq.direct"
_LAYER_OF_FILE = {str(path.relative_to(ROOT)): unit_of(module) for module, path in MODULES.items()}

# The callbacks by which the confirm comes back up: (layer, function) -> who handed it down.
HANDED_DOWN = {
    ("channel", "StoreWait.one_stored"):
        "Queue.when_stored(callback): the channel's confirms hand the queue their callback, the queue's journal "
        "hands it to the group commit, whose completion calls it once the fsync is done",
    ("connection", "Connection.confirms_pending"):
        "a Channel is handed its connection when it opens (channel/ports.py, ChannelConnection): confirms to send",
    ("connection", "Connection.send_method"):
        "a Channel is handed its connection when it opens (channel/ports.py, ChannelConnection): the basic.ack",
    ("runtime", "AMQPProtocol._schedule_flush"):
        "Connection(on_output=...): the shell's 'output is waiting' callback, handed to each connection it makes",
}
# The publish on its way down: the layers on the stack, outermost first, wherever the calls of
# the read descend furthest (the longest descending runs, in the order they first happen).
WAY_DOWN = [
    ("runtime", "connection", "wire"),  # Connection.receive_data: the wire's FrameReader splits the bytes
    ("runtime", "connection", "channel", "wire"),  # Channel.handle_publish: the content header checked
    ("runtime", "connection", "channel", "broker", "exchanges"),  # VirtualHost.route: the exchange's bindings
    ("runtime", "connection", "channel", "queues", "persistence"),  # Queue.publish: journaled, then stored
]


def _layer(filename: str) -> str | None:
    """The layer of a project file, as the tests name it ("runtime", "queues"); None outside."""
    try:
        relative = str(Path(filename).resolve().relative_to(ROOT))
    except ValueError:
        return None
    unit = _LAYER_OF_FILE.get(relative)
    return None if unit is None else unit.removeprefix("amqp_server.")


def _rank(layer: str) -> int:
    return RANK[layer if layer in RANK else f"amqp_server.{layer}"]


@dataclass(frozen=True)
class Call:
    caller: tuple[str, str, str] | None  # (layer, file, function) of the nearest project caller
    callee: tuple[str, str, str]
    stack: tuple[str, ...]  # the layers of the project frames, outermost first, callee's last, runs merged
    in_read: bool  # made while the broker handled the socket read (not a later write or fsync round)

    @property
    def upward(self) -> bool:
        return self.caller is not None and _rank(self.callee[0]) > _rank(self.caller[0])


@dataclass(frozen=True)
class Trace:
    calls: tuple[Call, ...]
    files: tuple[str, ...]  # every project file that ran, in the order they first ran


async def _read_until(reader: asyncio.StreamReader, buffer: bytearray, kind: type) -> object:
    """Read frames until one of `kind` arrives; returns it."""
    while True:
        while len(buffer) >= 8:
            size = int.from_bytes(buffer[3:7], "big")
            if len(buffer) < size + 8:
                break
            consumed, _channel, value = frame.unmarshal(bytes(buffer[: size + 8]))
            del buffer[:consumed]
            if isinstance(value, kind):
                return value
        data = await reader.read(65536)
        assert data, "the broker closed the connection"
        buffer.extend(data)


def _publish(body: bytes) -> bytes:
    """basic.publish, its content header and its body frame, back to back."""
    properties = commands.Basic.Properties(delivery_mode=2)
    return marshal(
        1,
        commands.Basic.Publish(exchange=EXCHANGE, routing_key="hops"),
        ContentHeader(body_size=len(body), properties=properties),
        ContentBody(body),
    )


def _stack_of(frame_) -> tuple[tuple[str, ...], bool]:  # noqa: ANN001
    """The layers of the project frames from the outermost to `frame_` (runs merged), and whether
    the outermost is the shell's data_received (the read)."""
    layers: list[str] = []
    outermost = ""
    while frame_ is not None:
        layer = _layer(frame_.f_code.co_filename)
        if layer is not None:
            if not layers or layers[-1] != layer:
                layers.append(layer)
            outermost = frame_.f_code.co_qualname
        frame_ = frame_.f_back
    return tuple(reversed(layers)), outermost == "AMQPProtocol.data_received"


async def _trace_one_confirmed_publish(data_dir: Path, apart: bool) -> Trace:
    config = ServerConfig(host="127.0.0.1", port=0, data_dir=data_dir)
    broker = Broker(config, FileDefinitionStore(data_dir), message_dir=data_dir)
    server = AMQPServer(broker, "127.0.0.1", 0)
    await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        buffer = bytearray()
        writer.write(PROTOCOL_HEADER)
        await _read_until(reader, buffer, commands.Connection.Start)
        writer.write(marshal(0, commands.Connection.StartOk(mechanism="PLAIN", response=plain_response("guest", "guest"))))
        await _read_until(reader, buffer, commands.Connection.Tune)
        writer.write(marshal(0, commands.Connection.TuneOk(channel_max=16, frame_max=131072, heartbeat=0)))
        writer.write(marshal(0, commands.Connection.Open()))
        await _read_until(reader, buffer, commands.Connection.OpenOk)
        writer.write(marshal(1, commands.Channel.Open()))
        await _read_until(reader, buffer, commands.Channel.OpenOk)
        writer.write(marshal(1, commands.Queue.Declare(queue="hops", durable=True)))
        await _read_until(reader, buffer, commands.Queue.DeclareOk)
        writer.write(marshal(1, commands.Queue.Bind(queue="hops", exchange=EXCHANGE, routing_key="hops")))
        await _read_until(reader, buffer, commands.Queue.BindOk)
        writer.write(marshal(1, commands.Confirm.Select()))
        await _read_until(reader, buffer, commands.Confirm.SelectOk)
        # A first publish warms every cache (segment files opened, channel state made), so
        # the traced one is a publish like the millions after it.
        writer.write(_publish(b"warm-up"))
        assert isinstance(await _read_until(reader, buffer, commands.Basic.Ack), commands.Basic.Ack)

        calls: list[Call] = []
        files: dict[str, None] = {}
        tracing = False

        def profile(frame_, event, _arg):  # noqa: ANN001
            if event != "call":
                return
            layer = _layer(frame_.f_code.co_filename)
            if layer is None:
                return
            code = frame_.f_code
            files.setdefault(str(Path(code.co_filename).resolve().relative_to(ROOT)), None)
            caller_frame = frame_.f_back
            while caller_frame is not None and _layer(caller_frame.f_code.co_filename) is None:
                caller_frame = caller_frame.f_back
            caller = None
            if caller_frame is not None:
                caller_code = caller_frame.f_code
                caller = (_layer(caller_code.co_filename), Path(caller_code.co_filename).name, caller_code.co_qualname)
            stack, in_read = _stack_of(frame_)
            calls.append(Call(caller, (layer, Path(code.co_filename).name, code.co_qualname), stack, in_read))

        read = asyncio.Event()
        protocol_class = type(next(iter(server.protocols)))
        real_data_received = protocol_class.data_received

        def traced_data_received(protocol, data):  # noqa: ANN001
            nonlocal tracing
            if not tracing:
                tracing = True
                sys.setprofile(profile)
            real_data_received(protocol, data)
            read.set()

        protocol_class.data_received = traced_data_received
        try:
            # The trace starts in the broker's data_received and ends when the ack has arrived.
            wire = _publish(b"traced")
            if apart:
                body_at = len(wire) - len(b"traced") - 8  # the body frame: 7-byte header, body, end byte
                writer.write(wire[:body_at])
                await read.wait()
                writer.write(wire[body_at:])
            else:
                writer.write(wire)
            ack = await _read_until(reader, buffer, commands.Basic.Ack)
        finally:
            sys.setprofile(None)
            protocol_class.data_received = real_data_received
        assert ack.delivery_tag == 2
        writer.close()
        return Trace(tuple(calls), tuple(files))
    finally:
        await server.stop()
        await broker.close()


@functools.cache
def trace_of_one_confirmed_publish(apart: bool = False) -> Trace:
    """`apart`: its body frame is written only once the broker has read the frames before it."""
    with tempfile.TemporaryDirectory() as directory:
        return asyncio.run(_trace_one_confirmed_publish(Path(directory), apart))


def way_down(trace: Trace) -> list[tuple[str, ...]]:
    """The longest runs of descending layers on the read's stacks, in the order they first happen."""
    runs: dict[tuple[str, ...], None] = {}
    for call in trace.calls:
        if not call.in_read:
            continue
        run = call.stack[:1]
        for layer in call.stack[1:]:
            if _rank(layer) >= _rank(run[-1]):
                break
            run += (layer,)
        runs.setdefault(run, None)
    return [run for run in runs if not any(other[: len(run)] == run and other != run for other in runs)]


def _described(call: Call) -> str:
    caller = "the event loop" if call.caller is None else f"{call.caller[1]} {call.caller[2]}"
    return f"{caller} ({call.caller[0] if call.caller else '-'}) -> {call.callee[1]} {call.callee[2]} ({call.callee[0]})"


@pytest.mark.parametrize("apart", [False, True], ids=["one read", "frames in separate reads"])
def test_every_call_goes_down_but_the_callbacks_handed_down(apart: bool) -> None:
    trace = trace_of_one_confirmed_publish(apart)
    upward = {(call.callee[0], call.callee[2]): call for call in trace.calls if call.upward}
    assert sorted(_described(call) for key, call in upward.items() if key not in HANDED_DOWN) == []
    assert sorted(set(HANDED_DOWN) - set(upward)) == [], "a callback named in HANDED_DOWN is no longer called"


@pytest.mark.parametrize("apart", [False, True], ids=["one read", "frames in separate reads"])
def test_the_publish_enters_the_layers_on_its_way_down_in_this_order(apart: bool) -> None:
    assert way_down(trace_of_one_confirmed_publish(apart)) == WAY_DOWN


def test_a_publish_whose_frames_come_in_separate_reads_adds_only_content_assembly() -> None:
    whole, apart = trace_of_one_confirmed_publish(), trace_of_one_confirmed_publish(apart=True)
    assert sorted(apart.files) == sorted([*whole.files, "amqp_server/wire/content_assembly.py"]), "\n".join(apart.files)


def described_layers() -> list[tuple[str, ...]]:
    """The chains of layers amqp_server/runtime/server.py's docstring lists ("runtime -> connection ...")."""
    import amqp_server.runtime.server

    found = re.findall(r"^ *([a-z]+(?: -> [a-z]+)+)\b", amqp_server.runtime.server.__doc__, re.MULTILINE)
    return [tuple(chain.split(" -> ")) for chain in found]


def test_server_docstring_describes_the_layers_a_publish_crosses() -> None:
    trace = trace_of_one_confirmed_publish()
    chains = described_layers()
    down = [chain for chain in chains if all(_rank(a) > _rank(b) for a, b in zip(chain, chain[1:]))]
    up = [chain for chain in chains if all(_rank(a) < _rank(b) for a, b in zip(chain, chain[1:]))]
    assert len(down) + len(up) == len(chains), "each chain in server.py's docstring goes either down or up"
    assert down == way_down(trace), "update the way down in amqp_server/runtime/server.py's docstring"
    steps_up = {(call.caller[0], call.callee[0]) for call in trace.calls if call.upward}
    assert {step for chain in up for step in zip(chain, chain[1:])} == steps_up, (
        "update the way back up in amqp_server/runtime/server.py's docstring")


if __name__ == "__main__":  # python -m tests.test_publish_path_files: print the way down and the callbacks up
    for chain in way_down(trace_of_one_confirmed_publish()):
        print(" -> ".join(chain))
    for call in trace_of_one_confirmed_publish().calls:
        if call.upward:
            print("up:", _described(call))
