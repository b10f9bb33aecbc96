"""The socket itself moves (amqp_server/runtime/handover.py): one worker passes a client's descriptor to
another over its Unix socket; once the first closes its copy, the client's TCP connection is still
open (no FIN, no RST) and talks to the second. With asyncio's event loop and with uvloop's."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest

from amqp_server.runtime.handover import HandoverPlan, HandoverService, MovedConnection

LOOPS = ["asyncio"]
try:
    import uvloop

    LOOPS.append("uvloop")
except ImportError:  # the [fast] extra is not installed: asyncio's loop alone
    uvloop = None


class Holder(asyncio.Protocol):
    """A connection as a worker's shell holds it: the transport, and what was read."""

    def __init__(self) -> None:
        self.made: asyncio.Future = asyncio.get_running_loop().create_future()
        self.lost: asyncio.Future = asyncio.get_running_loop().create_future()
        self.received = b""
        self.more = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.made.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.received += data
        self.more.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.set_result(exc)


class Adopted:
    """What a worker's adopt gives: made before anything is read from the socket."""

    def __init__(self) -> None:
        self.protocol: Holder | None = None
        self.forgotten = False

    async def go_live(self, sock: socket.socket) -> None:
        _transport, self.protocol = await asyncio.get_running_loop().connect_accepted_socket(Holder, sock)

    def forget(self) -> None:
        self.forgotten = True


def _address(name: str) -> str:
    return f"\0amqp-server-handover-test-{os.getpid()}-{name}"


async def _scenario(refuse: bool) -> None:
    loop = asyncio.get_running_loop()
    offered: list[MovedConnection] = []
    adopted: list[Adopted] = []

    def adopt(sock: socket.socket, moved: MovedConnection) -> Adopted | None:
        offered.append(moved)
        if refuse:
            return None
        adopted.append(Adopted())
        return adopted[-1]

    def never(sock: socket.socket, moved: MovedConnection) -> None:
        raise AssertionError("the first worker is offered nothing")

    tag = "refuse" if refuse else "take"
    owner = HandoverService(HandoverPlan("w-2", _address(f"{tag}-2"), {}), adopt)
    first = HandoverService(HandoverPlan("w-1", _address(f"{tag}-1"), {"w-2": _address(f"{tag}-2")}), never)
    await owner.start()
    await first.start()
    holders: list[Holder] = []
    server = await loop.create_server(lambda: holders.append(Holder()) or holders[-1], "127.0.0.1", 0)
    client = socket.create_connection(server.sockets[0].getsockname())
    client.setblocking(False)
    try:
        while not holders:
            await asyncio.sleep(0.01)
        held = holders[0]
        await held.made
        await loop.sock_sendall(client, b"before")
        await held.more.wait()
        held.transport.pause_reading()
        await loop.sock_sendall(client, b"during")  # sent while the socket is offered: read by one worker only
        moved = MovedConnection(b"replay bytes", b"rest bytes", (1, 2), "q", "w-1")
        taken = await first.send("w-2", held.transport.get_extra_info("socket").fileno(), moved)
        assert offered == [moved]
        if refuse:
            # Refused: the owner closed its copy, and the first worker still has the client.
            assert taken is False
            held.transport.write(b"still the first")
            assert await asyncio.wait_for(loop.sock_recv(client, 100), 5) == b"still the first"
            held.more.clear()
            held.transport.resume_reading()
            await asyncio.wait_for(held.more.wait(), 5)
            assert held.received == b"beforeduring"
            return
        assert taken is True
        held.transport.close()  # the first worker forgets the connection
        await asyncio.wait_for(held.lost, 5)
        while adopted[0].protocol is None:  # the owner wraps the socket once it said yes
            await asyncio.sleep(0.01)
        # The client's connection is open, now to the owner: both ways, nothing lost or reset.
        owners = adopted[0].protocol
        owners.transport.write(b"from the owner")
        assert await asyncio.wait_for(loop.sock_recv(client, 100), 5) == b"from the owner"
        await loop.sock_sendall(client, b"to the owner")
        while owners.received != b"duringto the owner":
            owners.more.clear()
            await asyncio.wait_for(owners.more.wait(), 5)
        assert held.received == b"before"
        # Only the owner's close ends it, with a FIN.
        owners.transport.close()
        assert await asyncio.wait_for(loop.sock_recv(client, 100), 5) == b""
    finally:
        client.close()
        server.close()
        await owner.stop()
        await first.stop()


@pytest.mark.parametrize("loop_name", LOOPS)
@pytest.mark.parametrize("refuse", [False, True], ids=["taken", "refused"])
def test_a_passed_socket_stays_open_when_the_first_worker_closes_its_copy(loop_name, refuse):
    runner = uvloop.run if loop_name == "uvloop" else asyncio.run
    runner(asyncio.wait_for(_scenario(refuse), 20))


def test_an_offer_to_a_worker_that_is_not_listening_is_refused():
    async def scenario() -> bool:
        first = HandoverService(HandoverPlan("w-1", _address("lonely-1"), {"w-2": _address("nobody")}), None)
        with socket.socket() as some_socket:
            return await first.send("w-2", some_socket.fileno(), MovedConnection(b"r", b"r", (), "q", "w-1"))

    assert asyncio.run(scenario()) is False


def test_a_worker_whose_socket_is_taken_runs_on_without_taking_offers():
    async def scenario() -> bool:
        plan = HandoverPlan("w-2", _address("taken"), {})
        holder = HandoverService(plan, None)
        await holder.start()
        second = HandoverService(plan, None)
        await second.start()  # logged, not raised
        first = HandoverService(HandoverPlan("w-1", _address("taken-1"), {"w-2": _address("taken")}), None)
        await holder.stop()  # a stopped worker takes nothing: the offer says so
        try:
            with socket.socket() as some_socket:
                return await first.send("w-2", some_socket.fileno(), MovedConnection(b"r", b"r", (), "q", "w-1"))
        finally:
            await second.stop()

    assert asyncio.run(scenario()) is False


async def _offer_raw(name: str, announced: tuple[int, int, int], sent: bytes, cut: bool) -> bytes:
    """A process of the broker's user offers one end of a socket pair with a message announcing
    (header, replay, rest) sizes and carrying only `sent` after the prefix (then, if `cut`, no more
    bytes: its end shut); returns
    what the other end reads once that end's last copy in this process is closed (b"" when the
    owner closed its copy too)."""
    from amqp_server.runtime.handover import _MAGIC, _PREFIX

    loop = asyncio.get_running_loop()

    def never(sock: socket.socket, moved: MovedConnection) -> None:
        raise AssertionError("a broken offer is never adopted")

    address = _address(name)
    owner = HandoverService(HandoverPlan("w-2", address, {}), never)
    await owner.start()
    ours, theirs = socket.socketpair()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sibling:
            sibling.connect(address)
            socket.send_fds(sibling, [_PREFIX.pack(_MAGIC, *announced) + sent], [ours.fileno()])
            ours.close()  # the owner's copy is the last one now
            if cut:
                sibling.shutdown(socket.SHUT_WR)
            sibling.setblocking(False)
            # Refused at once (not after RECEIVE_TIMEOUT_S of waiting for a gigabyte).
            assert await asyncio.wait_for(loop.sock_recv(sibling, 1), 2) in (b"", b"N")
        theirs.setblocking(False)
        return await asyncio.wait_for(loop.sock_recv(theirs, 1), 2)
    finally:
        theirs.close()
        await owner.stop()


def test_an_offer_announcing_more_than_a_hand_over_holds_is_refused_at_once_and_its_socket_closed():
    # A replay is at most MAX_RECORDED bytes: the owner must not buffer a gigabyte for anyone.
    assert asyncio.run(_offer_raw("huge", (2, 1 << 30, 1), b"{}", cut=False)) == b""


def test_an_offer_cut_short_closes_the_owners_copy_of_the_socket():
    # The sibling closed in the middle of its message: the owner keeps no copy of the client's
    # socket (a leaked copy would keep the client's TCP connection open after the first worker closes it).
    assert asyncio.run(_offer_raw("short", (2, 10, 10), b"{}abc", cut=True)) == b""


def test_an_offer_from_a_process_that_is_no_sibling_worker_is_not_heard():
    """Same user, but not a child of this worker's parent (the supervisor): its socket is never
    adopted. The workers' Unix sockets are abstract, reachable from the whole network namespace."""
    import sys

    address = _address("strangers")
    script = f"""
import asyncio, socket
from amqp_server.runtime.handover import HandoverPlan, HandoverService, MovedConnection
async def main():
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    first = HandoverService(HandoverPlan("w-1", "\\0unused", {{"w-2": {address!r}}}), None)
    print(await first.send("w-2", client.fileno(), MovedConnection(b"r", b"r", (1,), "q", "w-1")))
asyncio.run(main())
"""

    async def scenario() -> tuple[list[MovedConnection], bytes]:
        offered: list[MovedConnection] = []

        def adopt(sock: socket.socket, moved: MovedConnection) -> None:
            offered.append(moved)
            return None

        owner = HandoverService(HandoverPlan("w-2", address, {}), adopt)
        await owner.start()
        try:
            stranger = await asyncio.create_subprocess_exec(sys.executable, "-c", script,
                                                            stdout=asyncio.subprocess.PIPE)
            out, _ = await asyncio.wait_for(stranger.communicate(), 20)
        finally:
            await owner.stop()
        return offered, out

    offered, out = asyncio.run(scenario())
    assert out.strip() == b"False"
    assert offered == []


def test_an_owner_that_does_not_answer_leaves_the_connection_with_the_first_worker(monkeypatch):
    """A sibling that accepted (its kernel did) but never answers: a frozen or stopped process.
    The first worker must not wait for ever with its client's connection paused."""
    from amqp_server.runtime import handover

    monkeypatch.setattr(handover, "ANSWER_TIMEOUT_S", 0.3)
    address = _address("mute")

    async def scenario() -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as mute:
            mute.bind(address)
            mute.listen(1)
            first = HandoverService(HandoverPlan("w-1", _address("mute-1"), {"w-2": address}), None)
            with socket.socket() as some_socket:
                return await asyncio.wait_for(
                    first.send("w-2", some_socket.fileno(), MovedConnection(b"r", b"r", (), "q", "w-1")), 5)

    assert asyncio.run(scenario()) is False


def test_a_late_yes_either_arrives_before_the_first_worker_gives_up_or_fails_for_the_owner():
    """Giving up on an answer and the owner's yes cannot cross: a yes already sent is read
    (the connection moved), and after giving up the owner's yes fails (it forgets the connection)."""
    from amqp_server.runtime.handover import _last_word

    first, owner = socket.socketpair()
    with first, owner:
        owner.send(b"Y")
        assert _last_word(first) == b"Y"
    first, owner = socket.socketpair()
    with first, owner:
        first.setblocking(False)
        assert _last_word(first) == b""
        with pytest.raises(BrokenPipeError):
            owner.send(b"Y")


def test_an_offer_made_before_the_owner_answers_waits_and_is_taken_once_it_does():
    """A worker registers in the cluster before it serves (it joins first); a sibling that offers
    a connection in that gap waits in the backlog instead of being refused and forwarding to a
    worker whose links are not served yet either."""
    async def scenario() -> None:
        adopted: list[Adopted] = []

        def adopt(sock: socket.socket, moved: MovedConnection) -> Adopted:
            adopted.append(Adopted())
            return adopted[-1]

        owner = HandoverService(HandoverPlan("w-2", _address("early-2"), {}), adopt)
        first = HandoverService(HandoverPlan("w-1", _address("early-1"), {"w-2": _address("early-2")}), None)
        owner.listen()  # bound while joining: not answering yet
        listener = socket.create_server(("127.0.0.1", 0))
        other_end = socket.create_connection(listener.getsockname())
        client, _ = listener.accept()  # a client's TCP socket, as a worker holds it
        listener.close()
        try:
            offer = asyncio.create_task(first.send("w-2", client.fileno(), MovedConnection(b"r", b"r", (), "q", "w-1")))
            await asyncio.sleep(0.2)
            assert not offer.done() and not adopted  # waiting, not refused
            await owner.start()
            assert await asyncio.wait_for(offer, 5) is True
            assert len(adopted) == 1
        finally:
            client.close()
            other_end.close()
            await owner.stop()
            await first.stop()

    asyncio.run(scenario())
