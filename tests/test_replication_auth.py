"""The replication stream proves the cluster secret before anything else (wire.Handshake): a peer
without it, or with another one, reads no record and changes nothing of the group; one that
sends nothing, or too much, is closed. The handshake alone (sans-I/O), then three replicas in one
event loop over real TCP streams (tests/test_replication_replica.py's nodes)."""

from __future__ import annotations

import asyncio
import logging
import secrets

import pytest

from cluster.replication.replica import ReplicationListener, Role
from cluster.replication.wire import (
    CHALLENGE_SIZE, HANDSHAKE_MAGIC, NONCE_SIZE, PROTOCOL_VERSION, RESPONSE_SIZE, AuthenticationFailed, Handshake,
    HandshakeState, encode_hello,
)
from tests.memory_coordinator import MemoryService
from interop_tests.waiting import wait_until_async
from tests.test_replication_replica import MEMBERS, SECRET, Node, leader_of, start_group


def _run(listener: Handshake, connector: Handshake) -> None:
    """Carry the handshake's messages between the two sides until neither has one to send."""
    to_connector = listener.opening()
    assert connector.opening() == b""
    while to_connector:
        to_listener = connector.feed(to_connector)
        to_connector = listener.feed(to_listener) if to_listener else b""


# ---- the handshake, sans-I/O ----------------------------------------------------------------------


def test_both_sides_with_the_same_secret_open_the_stream():
    listener, connector = Handshake.listening(b"k"), Handshake.connecting(b"k")
    _run(listener, connector)
    assert listener.is_open and connector.is_open


def test_a_connector_with_another_secret_is_refused_and_gets_no_proof():
    listener, connector = Handshake.listening(b"right"), Handshake.connecting(b"wrong")
    response = connector.feed(listener.opening())
    with pytest.raises(AuthenticationFailed):
        listener.feed(response)
    assert listener.state is HandshakeState.FAILED and not connector.is_open


def test_a_listener_without_the_secret_is_refused_by_the_connector():
    """An impostor listener (without the secret) cannot make the proof: neither random bytes nor
    the connector's own HMAC sent back (the labels differ) pass."""
    for forged in (lambda response: secrets.token_bytes(32), lambda response: response[NONCE_SIZE:]):
        connector = Handshake.connecting(b"k")
        challenge = HANDSHAKE_MAGIC + PROTOCOL_VERSION.to_bytes(2, "big") + secrets.token_bytes(NONCE_SIZE)
        response = connector.feed(challenge)
        with pytest.raises(AuthenticationFailed):
            connector.feed(forged(response))
        assert not connector.is_open


def test_another_protocol_or_version_is_refused():
    for challenge, reason in ((b"HTTP/1.1 200 OK\r\n".ljust(CHALLENGE_SIZE, b"x"), "not a replication listener"),
                              (HANDSHAKE_MAGIC + (1).to_bytes(2, "big") + bytes(NONCE_SIZE), "protocol 1")):
        with pytest.raises(AuthenticationFailed, match=reason):
            Handshake.connecting(b"k").feed(challenge)


def test_more_than_the_handshake_message_is_refused_and_less_waits():
    listener = Handshake.listening(b"k")
    listener.opening()
    assert listener.feed(bytes(RESPONSE_SIZE - 1)) == b""  # an incomplete response: it waits
    with pytest.raises(AuthenticationFailed, match="where the handshake waits"):
        listener.feed(bytes(2))
    # a version 1 follower's HELLO and APPEND-sized junk
    with pytest.raises(AuthenticationFailed, match="where the handshake waits"):
        Handshake.listening(b"k").feed(encode_hello(0, 0, 0, "b", "/:q") + bytes(100))


def test_no_secret_is_no_stream():
    with pytest.raises(ValueError):
        ReplicationListener(b"")
    with pytest.raises(ValueError):
        Handshake.connecting(b"")


# ---- over TCP, against a group's leader ----------------------------------------------------------------


async def _talk(address: str, send_after_challenge: bytes | None, within: float) -> tuple[bytes, bool]:
    """Connect to a replication port, read its first bytes, send `send_after_challenge` (None:
    the response of a handshake with another secret), and read until the stream ends.
    (everything received, the stream was closed by the other side within `within`)."""
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    received = bytearray()
    try:
        received += await asyncio.wait_for(reader.readexactly(CHALLENGE_SIZE), 5)
        if send_after_challenge is None:
            writer.write(Handshake.connecting(b"not the cluster's secret").feed(bytes(received)))
        else:
            writer.write(send_after_challenge)
        try:
            while chunk := await asyncio.wait_for(reader.read(65536), within):
                received += chunk
        except asyncio.TimeoutError:
            return bytes(received), False
        except ConnectionResetError:
            pass
        return bytes(received), True
    finally:
        writer.close()


def _group_unaffected(leader: Node) -> bool:
    return (leader.replica.role is Role.LEADER
            and leader.replica.leader.in_sync_members() == list(MEMBERS)
            and all(connected for connected, _, _ in leader.replica.leader.progress().values()))


INTRUDERS = {  # what it sends after the challenge, and the reason its refusal gives
    "hello-without-handshake": (encode_hello(0, 0, 0, "b", "/:q") + bytes(64), "where the handshake waits"),
    "wrong-secret": (None, "did not prove the cluster secret"),
    "junk": (secrets.token_bytes(4096), "where the handshake waits"),
}


@pytest.mark.parametrize("intruder", sorted(INTRUDERS))
def test_a_peer_without_the_secret_reads_no_record_and_the_group_goes_on(tmp_path, intruder, caplog):
    """A version 1 follower's HELLO naming member b (which would have it sent the whole log), a
    follower with another secret, and junk are each closed having read nothing but the
    challenge; b and c stay connected and in sync, and the next record commits."""
    async def scenario():
        _, nodes, leader = await start_group(tmp_path)
        index = 0
        for k in range(20):
            index = leader.replica.publish(b"confidential record %d" % k)
        await wait_until_async(lambda: leader.commits and leader.commits[-1] >= index, "the 20 records committed")
        streams_before = dict(leader.replica._followers)
        send, reason = INTRUDERS[intruder]
        with caplog.at_level(logging.WARNING, logger="cluster.replication.replica"):
            received, closed = await _talk(leader.listener.address, send, within=3.0)
        assert closed, "the stream stayed open"
        assert received[:len(HANDSHAKE_MAGIC)] == HANDSHAKE_MAGIC and len(received) == CHALLENGE_SIZE, received
        assert b"confidential" not in received
        refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
        assert len(refused) == 1 and "127.0.0.1:" in refused[0] and reason in refused[0], refused
        assert leader.replica._followers == streams_before  # nobody replaced member b's stream
        assert _group_unaffected(leader)
        more = leader.replica.publish(b"after the intruder")
        await wait_until_async(lambda: leader.commits[-1] >= more, "the record after the intruder committed")
        for node in nodes.values():
            await node.replica.stop()
    asyncio.run(scenario())


def test_a_peer_that_sends_nothing_is_closed_after_the_handshake_timeout(tmp_path):
    async def scenario():
        listener = ReplicationListener(SECRET, handshake_timeout=0.3)
        await listener.start("127.0.0.1", 0)
        received, closed = await _talk(listener.address, b"", within=3.0)
        assert closed and len(received) == CHALLENGE_SIZE
        await listener.close()
    asyncio.run(scenario())


def test_a_member_with_another_secret_gets_no_entry_and_the_majority_goes_on(tmp_path, caplog):
    """Member c is configured with another secret: a and b elect and commit; c's stream to the
    leader is refused at each attempt and its log stays empty."""
    async def scenario():
        store = MemoryService()
        nodes = {n: Node(n, store, tmp_path / n) for n in ("a", "b")}
        for node in nodes.values():
            await node.start()
        await wait_until_async(lambda: leader_of(nodes) is not None, "one leader")
        leader = leader_of(nodes)
        outsider = Node("c", store, tmp_path / "c", secret=b"another secret")
        with caplog.at_level(logging.WARNING, logger="cluster.replication.replica"):
            await outsider.start()
            index = leader.replica.publish(b"confidential")
            await wait_until_async(lambda: leader.commits and leader.commits[-1] >= index,
                                   "the record committed without c")
            await wait_until_async(lambda: sum("refused" in r.getMessage() for r in caplog.records) >= 2,
                                   "c's stream refused twice")
        assert outsider.replica.log.last_index == 0
        assert leader.replica.leader.progress()["c"][0] is False  # never connected
        assert "c" not in leader.replica.leader.in_sync_members()
        for node in (*nodes.values(), outsider):
            await node.replica.stop()
    asyncio.run(scenario())
