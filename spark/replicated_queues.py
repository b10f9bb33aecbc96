"""Replicated (quorum) queues on a cluster: where their records are, and which node's files to read.

On a cluster a durable quorum queue's records are in two places (docs/replication.md):

* on its **leader**, in the queue's own segment files (``<data_dir>/queues/...``, as a classic
  durable queue's), written when journaled, before a majority of the group holds them;
* on **every member**, leader included, in ``<data_dir>/replicas/<group>/``: every record of the
  queue's history (messages and state records) as log entries, in segments, with a snapshot for
  the entries compacted away, and ``committed``, the copy's commit mark (docs/replication.md).

At a failover the new leader deletes its own queue files and writes them anew from its log: the
messages not settled, under their old seqs, and from then on new messages with the seqs after the
last one *its log* holds. A record the old leader wrote to its files but never replicated is not
in that log: its seq goes to another message. The old leader's files stay where they were until
its node drops them (a killed node's, until it comes back and hands the queue over).

So the batch source reads, of each replicated queue found in several node directories, the files
of the node that took it over last (``owner``: the highest term its replica promised, then the
newest ``queue.json``), never a copy left behind. The streaming source reads the replica logs
instead, up to each copy's commit mark (``spark.replicated_queue_log``); it refuses
(``streaming_refusal``) only a queue none of whose copies has a mark (a broker from before marks).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from persistence.replica_files import group_directory, promised_term
from persistence.segment_layout import QUEUE_META, queue_path
from spark.queue_snapshot import QueueSnapshot, plan


class NodeQueue(NamedTuple):
    """A queue found in one node's data directory."""

    label: str
    directory: str
    snapshot: QueueSnapshot
    replicated: bool


def is_replicated(data_dir: str | Path, vhost: str, queue: str) -> bool:
    """The node keeps a replica of the queue: it is a quorum queue of a cluster."""
    return group_directory(data_dir, vhost, queue, stream=False).is_dir()


def node_queues(nodes: tuple[tuple[str, str], ...], vhost: str | None, queue: str | None,
                include_internal: bool) -> list[NodeQueue]:
    """The queues of every node, each replicated queue once: from its ``owner``'s directory."""
    found: list[NodeQueue] = []
    owners: dict[tuple[str, str], tuple[tuple[int, int], NodeQueue]] = {}
    for label, directory in nodes:
        for snapshot in plan(directory, vhost, queue, include_internal):
            entry = NodeQueue(label, directory, snapshot, is_replicated(directory, snapshot.vhost, snapshot.queue))
            if not entry.replicated:
                found.append(entry)
                continue
            rank = owner_rank(directory, snapshot.vhost, snapshot.queue)
            key = (snapshot.vhost, snapshot.queue)
            if key not in owners or rank > owners[key][0]:
                owners[key] = (rank, entry)
    found.extend(entry for _, entry in owners.values())
    return sorted(found, key=lambda e: (e.snapshot.vhost, e.snapshot.queue, e.label))


def owner_rank(data_dir: str | Path, vhost: str, queue: str) -> tuple[int, int]:
    """How recently this node took the queue over: the term its replica promised (a node that
    led an older term and was left behind promised less), then its ``queue.json``'s time (a new
    leader writes the queue's files anew)."""
    term = promised_term(group_directory(data_dir, vhost, queue, stream=False)) or 0
    try:
        meta = json.loads((queue_path(Path(data_dir), vhost, queue) / QUEUE_META).read_bytes())
        created = int(meta.get("created_at_ms", 0))
    except (FileNotFoundError, NotADirectoryError, ValueError):
        created = 0
    return term, created


def streaming_refusal(vhost: str, queue: str) -> str:
    """Why a streaming query does not read a replicated queue without commit marks, and what to do."""
    return (f"amqp-queue: queue {queue!r} in vhost {vhost!r} is a replicated (quorum) queue of a cluster and none "
            f"of its copies in the listed directories has a commit mark (replicas/<group>/committed, written by "
            f"brokers since commit marks), so nothing says which of its records a majority of its replicas "
            f"holds, and a query reading it could skip a confirmed message or read one twice. Let its broker "
            f"commit once (publish or settle a message), list the directories of its members, or read it with a "
            f"batch query; option replicatedQueues=skip leaves such queues out of this query (docs/spark.md, "
            f"\"Replicated streams and queues\")")
