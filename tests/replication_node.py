"""Test harness: one node's replica of one replicated queue, driven over a line protocol.

    python -m tests.replication_node --cluster etcd://127.0.0.1:2379/p --node n1 --members n1,n2,n3 \
        --data-dir DIR --client-port PORT [--confirm-before-replication]

It runs the real replication core (`cluster.replication`): a `QueueReplica` with a
`FileReplicaLog`, the group committer and the etcd coordinator. The payloads are real segment
records. The nodes of one test cluster share the cluster secret in the environment variable
REPLICATION_TEST_SECRET (`secret_environment`). Clients send one command a line and read one
answer a line:

    R              -> "R leader <term> <in-sync,...>" or "R follower"
    P <id>         -> "C <id>" once the message record is committed (majority fsynced), or "N"
    G              -> "M <seq> <id> <redelivered 0|1> <delivery count>" once the delivered record
                      is committed, or "E" (nothing ready), or "N"
    A <seq>        -> "K <seq>" once the acked record is committed, or "N"

A node that is not the leader answers "N"; a leader that steps down closes its clients.

``--confirm-before-replication`` is the deliberately broken build of the fault test: it
replicates asynchronously, as many brokers do: a confirm leaves at once, and the records are
handed to replication in batches every 50 ms, so no fsync and no follower has a record when its
confirm leaves. It exists here, in the test harness, and nowhere in the product.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import logging
import os
import secrets
import signal
import time
from collections import deque
from pathlib import Path

from cluster import connect, parse_cluster_address
from cluster.replication.leader import NotLeader
from cluster.replication.log import FileReplicaLog
from cluster.replication.queue_log import QueueState, message_payload, state_payload
from cluster.replication.replica import QueueReplica, ReplicationListener, Role
from persistence.group_commit import GroupCommitter
from persistence.record_format import MessageState

QUEUE = "/:replicated"
# The cluster secret the nodes' replication streams prove (an environment variable, not an
# argument: no other user sees it in the process list). `secret_environment` makes one.
SECRET_VARIABLE = "REPLICATION_TEST_SECRET"
BROKEN_BATCH_S = 0.05


def secret_environment() -> dict[str, str]:
    """The environment for a test cluster's harness nodes: this one's, and a new random secret."""
    return {**os.environ, SECRET_VARIABLE: secrets.token_urlsafe(32)}


def _now_ms() -> int:
    return int(time.time() * 1000)


class HarnessNode:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.state = QueueState()
        self.replica: QueueReplica | None = None
        self.clients: set[asyncio.StreamWriter] = set()
        # (log index, client, answer) in index order: answers leave when the index commits.
        self.waiting: deque[tuple[int, asyncio.StreamWriter, bytes]] = deque()
        # The broken build's confirmed records, handed to replication by the next batch.
        self.unreplicated: list[bytes] = []
        self.next_seq = 1

    async def run(self) -> None:
        args = self.args
        coordinator = await connect(parse_cluster_address(args.cluster), session_ttl=args.session_ttl)
        listener = ReplicationListener(os.environ[SECRET_VARIABLE].encode())
        await listener.start("127.0.0.1", 0)
        committer = GroupCommitter("always")
        log = FileReplicaLog(Path(args.data_dir))
        self.replica = QueueReplica(
            queue=QUEUE, node=args.node, members=args.members.split(","), log=log, coordinator=coordinator,
            listener=listener, committer=committer, on_commit=self.on_commit, on_role=self.on_role)
        self.replica.start()
        server = await asyncio.start_server(self.serve, "127.0.0.1", args.client_port)
        if args.confirm_before_replication:
            asyncio.get_running_loop().create_task(self.replicate_batches())
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        print("ready", flush=True)
        await stop.wait()
        server.close()
        await self.replica.stop()
        await coordinator.close()

    # ---- replication events --------------------------------------------------------------------

    async def replicate_batches(self) -> None:
        """The broken build replicates asynchronously: every 50 ms, what it already confirmed."""
        while True:
            await asyncio.sleep(BROKEN_BATCH_S)
            batch, self.unreplicated = self.unreplicated, []
            try:
                for payload in batch:
                    self._append(payload)
            except NotLeader:
                pass

    def on_role(self, role: Role) -> None:
        self.waiting.clear()
        self.unreplicated.clear()
        for client in list(self.clients):
            client.close()
        if role is Role.LEADER:
            replica = self.replica
            assert replica is not None
            self.state = QueueState.rebuild(payload for _, _, payload in replica.log.entries())
            for seq, count in self.state.held_at_failover():
                self._append(state_payload(seq, MessageState.REQUEUED, _now_ms(), delivery_count=count))

    def on_commit(self, commit_index: int) -> None:
        waiting = self.waiting
        while waiting and waiting[0][0] <= commit_index:
            _, client, answer = waiting.popleft()
            if not client.is_closing():
                client.write(answer)

    def _append(self, payload: bytes) -> int:
        assert self.replica is not None
        index = self.replica.publish(payload)
        self.state.apply(payload)
        return index

    # ---- clients ------------------------------------------------------------------------------

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.clients.add(writer)
        try:
            while line := await reader.readline():
                self.command(line.split(), writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.clients.discard(writer)
            writer.close()

    def command(self, words: list[bytes], client: asyncio.StreamWriter) -> None:
        replica = self.replica
        leading = replica is not None and replica.role is Role.LEADER and replica.leader is not None
        verb = words[0]
        if verb == b"R":
            if leading:
                record = replica.leader
                client.write(b"R leader %d %s commit=%d durable=%d last=%d %s\n" % (
                    record.term, ",".join(record.in_sync_members()).encode(), record.commit_index,
                    replica.log.durable_index, replica.log.last_index, repr(record.progress()).replace(" ", "").encode()))
            else:
                client.write(b"R follower\n")
            return
        if not leading:
            client.write(b"N\n")
            return
        try:
            self.queue_command(verb, words, client)
        except NotLeader:  # stepped down in this very iteration
            client.write(b"N\n")

    def queue_command(self, verb: bytes, words: list[bytes], client: asyncio.StreamWriter) -> None:
        if verb == b"P":
            seq = self.next_seq = max(self.next_seq, self.state.next_seq)
            self.next_seq += 1
            payload = message_payload(seq, _now_ms(), "", "replicated", b"", words[1])
            if self.args.confirm_before_replication:
                # The broken build: confirmed at once, replicated (and written) by the next batch.
                self.unreplicated.append(payload)
                client.write(b"C %s\n" % words[1])
            else:
                index = self._append(payload)
                self.waiting.append((index, client, b"C %s\n" % words[1]))
        elif verb == b"G":
            seq = self.state.next_ready()
            if seq is None:
                client.write(b"E\n")
                return
            count = self.state.delivery_count.get(seq, 0)
            body = self.state.messages[seq].body
            index = self._append(state_payload(seq, MessageState.DELIVERED, _now_ms(), delivery_count=count))
            self.waiting.append((index, client, b"M %d %s %d %d\n" % (seq, body, count > 0, count)))
        elif verb == b"A":
            seq = int(words[1])
            if self.state.held.get(seq) is None:
                client.write(b"K %d\n" % seq)  # settled already
                return
            index = self._append(state_payload(seq, MessageState.ACKED, _now_ms()))
            self.waiting.append((index, client, b"K %d\n" % seq))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("--members", required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--client-port", type=int, required=True)
    parser.add_argument("--session-ttl", type=float, default=2.0)
    parser.add_argument("--confirm-before-replication", action="store_true")
    args = parser.parse_args()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a stuck node's stacks, for debugging
    logging.basicConfig(level=logging.DEBUG if os.environ.get("REPLICATION_DEBUG") else logging.INFO, format=f"%(asctime)s {args.node} %(levelname)s %(name)s: %(message)s")
    asyncio.run(HarnessNode(args).run())


if __name__ == "__main__":
    main()
