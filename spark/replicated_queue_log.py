"""Replicated (quorum) queues read by the streaming source from their replica logs, once for all copies.

On a cluster every member of a quorum queue's group keeps the queue's whole history as a log in
``<data_dir>/replicas/<group>/`` (docs/replication.md "On disk"): entries (index, term, payload),
each payload one segment record of docs/queue-files.md section 3, a message or a state record. A
committed entry is the same on every copy at the same index, and is never cut from any copy. The
queue's own files on its leader are not read by a streaming query: a new leader rewrites them and
gives the seq of a record the old leader wrote but never replicated to another message.

Each copy's commit mark (``committed``: ``persistence.replica_files.read_queue_commit_mark``)
names the highest index committed and fsynced on that copy (a follower's: min(leader's commit,
its own durable index, what it matched with the leader)), so entries up to it are the group's,
whatever happens next. The streaming source reads a replicated queue by log index: its offset
(one per queue, under ``"replicated"`` in the checkpoint, ``created`` being the group's
incarnation) is the next index to read, and a batch reads indices ``start.next .. end.next - 1``
from any copy whose mark covers them (the one with the most of that range still in its
segments first), keeping the message records: one row each, ``seq`` the message's seq.

Compaction removes a copy's oldest segments once their messages are settled; the unsettled
messages' records (those at or below the snapshot's index) are carried in its ``snapshot``. So a
range at or below a copy's snapshot index is read from the snapshot: its live messages are rows,
the settled ones are gone. Gone before the query read them is data loss (``failOnDataLoss``),
except for a query that starts at ``earliest`` before it has read anything: it starts with what
is stored (the live messages of the snapshot, then every entry still in a segment), as a stream's
earliest starts after what retention removed.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import NamedTuple

from persistence.record_format import RECORD_HEAD, RecordType
from persistence.replica_files import (
    QUEUE_LOG_FILE,
    DamagedQueueCommitMark,
    LogGap,
    UnsupportedReplicaFormat,
    group_directory,
    incarnation_number,
    queue_log_entries,
    queue_snapshot_index,
    read_incarnation,
    read_queue_commit_mark,
    read_queue_snapshot,
)
from persistence.segment_layout import QUEUE_META, queue_path
from spark.queue_snapshot import plan
from spark.replicated_queues import is_replicated

log = logging.getLogger("spark.amqp_queue")

_MESSAGE = int(RecordType.MESSAGE)
_ATTEMPTS = 3  # a copy compacting (or reset) while a task reads it: the task looks again
_SCAN_ENTRIES = 65536  # entries read at a time when looking for a timestamp


class QueueCopy(NamedTuple):
    """One node's replica of a queue as it is now."""

    label: str
    directory: str  # the group directory
    marked: int  # its commit mark: entries up to it are committed and durable here
    base: int  # its snapshot's index: entries up to it are no longer in its segments


class ReplicatedQueue(NamedTuple):
    """A replicated queue and its copies that have a commit mark, the furthest mark first."""

    vhost: str
    queue: str
    identity: int  # its group's incarnation, as a number (the offsets' ``created``)
    copies: tuple[QueueCopy, ...]

    @property
    def next(self) -> int:
        """One past the highest index a copy marks committed."""
        return self.copies[0].marked + 1

    @property
    def stored_from(self) -> int:
        """The first index some copy still holds in its segments."""
        return min(c.base for c in self.copies) + 1


def plan_replicated_queues(nodes: tuple[tuple[str, str], ...], vhost: str | None, queue: str | None,
                           include_internal: bool, identity: int | None = None
                           ) -> tuple[list[ReplicatedQueue], list[tuple[str, str]]]:
    """The matching replicated queues of ``nodes`` ((label, data directory) pairs): those with a
    copy that has a commit mark, and (vhost, name) of those without one (a broker that writes no
    marks yet, or a group with no commit yet). A queue is found by its queue directory on some
    node (every leader writes one); of copies of two incarnations (a queue deleted and declared
    again while a node was away), those of the node whose ``queue.json`` is newest are read."""
    names: dict[tuple[str, str], tuple[int, str]] = {}  # -> (newest queue.json time, its incarnation)
    for _, directory in nodes:
        for snapshot in plan(directory, vhost, queue, include_internal):
            if not is_replicated(directory, snapshot.vhost, snapshot.queue):
                continue
            key = (snapshot.vhost, snapshot.queue)
            held = read_incarnation(group_directory(directory, *key, stream=False)) or ""
            created = _created(directory, *key)
            if key not in names or (created, held) > names[key]:
                names[key] = (created, held)
    found, unmarked = [], []
    for (vhost_name, name), (_, owner_incarnation) in sorted(names.items()):
        copies = []
        number = None
        for label, directory in nodes:
            group = group_directory(directory, vhost_name, name, stream=False)
            incarnation = read_incarnation(group)
            if incarnation is None or (owner_incarnation and incarnation != owner_incarnation):
                continue
            if identity is not None and incarnation_number(incarnation) != identity:
                continue
            try:
                mark = read_queue_commit_mark(group)
                base = queue_snapshot_index(group)
            except (DamagedQueueCommitMark, UnsupportedReplicaFormat, ValueError) as error:
                log.warning("amqp-queue: the replica of queue %r in %s is not read: %s", name, directory, error)
                continue
            if mark is None or not (group / QUEUE_LOG_FILE).exists():
                continue
            number = incarnation_number(incarnation)
            copies.append(QueueCopy(label, str(group), mark.index, min(base, mark.index)))
        if not copies or number is None:
            unmarked.append((vhost_name, name))
            continue
        copies.sort(key=lambda c: (-c.marked, c.label))
        found.append(ReplicatedQueue(vhost_name, name, number, tuple(copies)))
    return found, unmarked


def _created(directory: str, vhost: str, queue: str) -> int:
    try:
        return int(json.loads((queue_path(Path(directory), vhost, queue) / QUEUE_META).read_bytes())
                   .get("created_at_ms", 0))
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return 0


# ---- reading committed entries ------------------------------------------------------------------


class CommittedRecords(NamedTuple):
    """The message records of a range of a replicated queue's log, as one copy holds them."""

    records: list[tuple[int, bytes]]  # (log index, message record), in index order
    gone: tuple[int, int] | None  # (first, last) index of entries compacted away, not carried
    copy: str  # the group directory they were read from


class NotCommitted(Exception):
    """No copy holds the range committed (any more)."""


def message_records(copies: tuple[str, ...], low: int, high: int) -> CommittedRecords:
    """The message records of entries ``low`` .. ``high``, from a copy (of the group directories
    ``copies``) whose mark covers ``high`` now: the one whose snapshot is lowest (most of the
    range in its segments). Entries at or below its snapshot's index give the messages it carries
    and ``gone`` for the rest. ``NotCommitted`` when no copy's mark reaches ``high``; ValueError
    for damage."""
    for _ in range(_ATTEMPTS):
        holders = []
        for directory in copies:
            try:
                mark = read_queue_commit_mark(Path(directory))
                if mark is not None and mark.index >= high:
                    holders.append((queue_snapshot_index(Path(directory)), directory))
            except (DamagedQueueCommitMark, UnsupportedReplicaFormat, ValueError) as error:
                log.warning("amqp-queue: %s is not read: %s", directory, error)
        if not holders:
            raise NotCommitted(f"no copy holds entries {low}..{high} committed")
        _, directory = min(holders)
        try:
            return _read_copy(Path(directory), low, high)
        except LogGap:
            continue  # compacted (or reset) while it was read: look at the copies again
    raise NotCommitted(f"entries {low}..{high}: every copy was compacted while this read it")


def _read_copy(directory: Path, low: int, high: int) -> CommittedRecords:
    records: list[tuple[int, bytes]] = []
    gone = None
    first_in_log = low
    if low <= queue_snapshot_index(directory):
        snapshot = read_queue_snapshot(directory)
        top = min(high, snapshot.index)
        carried = sorted((i, r) for i, r in snapshot.carried.items() if low <= i <= top)
        records.extend(carried)
        if top - low + 1 > len(carried):
            gone = (low, top)
        first_in_log = snapshot.index + 1
    if first_in_log <= high:
        for index, _, payload in queue_log_entries(directory, first_in_log, high):
            if _is_message(payload):
                records.append((index, payload))
    return CommittedRecords(records, gone, str(directory))


def _is_message(payload: bytes) -> bool:
    """A message record (not a state record, the empty no-op or a delivery horizon, whose length
    field is 0: cluster/replication/queue_log.py)."""
    return len(payload) >= RECORD_HEAD.size and payload[RECORD_HEAD.size - 1] == _MESSAGE \
        and int.from_bytes(payload[:4], "big") != 0


def first_published_at(queue: ReplicatedQueue, timestamp_ms: int) -> int:
    """The index of the first message record (in log order) published at or after
    ``timestamp_ms``, among what the copy with the furthest mark holds (its snapshot's live
    messages, then its segments); ``queue.next`` when there is none. Read a window of entries at a
    time, not the whole log at once: the first window ends ``_SCAN_ENTRIES`` past the snapshot."""
    copy = queue.copies[0]
    low = 1
    while low <= copy.marked:
        high = min(copy.marked, max(low, copy.base) + _SCAN_ENTRIES)
        try:
            found = message_records((copy.directory,), low, high)
        except NotCommitted:
            return queue.next
        for index, record in found.records:
            if int.from_bytes(record[RECORD_HEAD.size + 8:RECORD_HEAD.size + 16], "big") >= timestamp_ms:
                return index
        low = high + 1
    return queue.next
