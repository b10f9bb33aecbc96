"""A follower's side of one queue's replication, sans-I/O.

`FollowerReplication.on_append` applies one APPEND frame to the local log:

* a frame of a term below the one this replica promised is refused (REFUSE carries the
  promised term): a stale leader never gets an acknowledgement from it;
* a newer term is promised durably first (the log's term file is fsynced);
* the entry before the frame's run must be the leader's (same index and term), otherwise the
  answer is MISMATCH with the index to resend from: after a different leader's term, the
  follower skips back over that whole term at once;
* entries it already has with the same term are kept; at the first entry whose term differs
  the follower truncates its log there (a suffix the new leader does not have) and appends the
  rest verbatim;
* entries at or below its snapshot (compacted away: committed, so the same in every leader's
  log) are taken as matching and skipped.

A RESET (``on_reset``: the leader no longer stores the entries this log lacks: a stream's
retention or a queue's compaction dropped them) replaces the whole log by the leader's
snapshot, an empty log that goes on after the leader's base entry.

The follower acknowledges (``ack()``) the highest index that is both fsynced (the log's
``durable_index``, raised by the group committer) and verified against this leader's log, so an
ACK never vouches for a stale suffix the leader has not checked yet. Every APPEND it applied is
answered by an ACK: one that brought something when it is fsynced (``ack()``), one that brought
nothing to fsync (the leader's heartbeat) at once (``answer_heartbeat()``): the ACK proves to the
leader's check-quorum that this follower hears it and is heard.
"""

from __future__ import annotations

from cluster.replication.entries import BadEntry, scan_entries
from cluster.replication.log import ReplicaLog
from cluster.replication.wire import (
    Append, ProtocolError, Reset, encode_ack, encode_hello, encode_mismatch, encode_refuse,
)


class FollowerReplication:
    """Applies a leader's APPEND frames to ``log``; see the module docstring."""

    def __init__(self, node: str, queue: str, log: ReplicaLog) -> None:
        self.node = node
        self.queue = queue
        self.log = log
        self.leader_term = 0
        self.leader_commit_index = 0
        self._verified = 0  # entries up to here match the current leader's log
        self._acked = 0
        self._owed = False  # an APPEND was applied and not answered yet

    def hello(self) -> bytes:
        """The first frame on a new stream to the leader."""
        self._acked = 0
        log = self.log
        return encode_hello(log.promised_term, log.last_index, log.last_term, self.node, self.queue)

    def on_append(self, append: Append) -> bytes | None:
        """Apply ``append``; returns an immediate answer (REFUSE or MISMATCH) or None when entries
        may have been appended, to be acknowledged with ``ack()`` once the log is fsynced."""
        log = self.log
        if append.term < log.promised_term:
            return encode_refuse(log.promised_term)
        if append.term > log.promised_term:
            log.promise(append.term)
        if append.term != self.leader_term:
            self.leader_term = append.term
            self._verified = self._acked = 0
        prev = append.prev_index
        if prev > log.last_index:
            return encode_mismatch(append.term, log.last_index)
        base = log.first_index - 1
        if prev >= base and log.term_at(prev) != append.prev_term:
            # Everything of our entry's term from its first index on is suspect: skip it whole.
            return encode_mismatch(append.term, max(base, min(prev, log.first_index_of_term(log.term_at(prev))) - 1))
        try:
            heads, _ = scan_entries(append.entries, prev + 1)
        except BadEntry as error:
            raise ProtocolError(f"APPEND entries: {error}") from error
        if prev < base:
            # The run starts in what this log compacted away: committed entries, which every
            # leader's log holds as they are here (Raft's leader completeness). The rest goes on.
            heads = [head for head in heads if head.index > base]
            prev = base
        new_from = len(heads)
        for k, head in enumerate(heads):
            if head.index > log.last_index:
                new_from = k
                break
            if log.term_at(head.index) != head.term:
                log.truncate_after(head.index - 1)
                new_from = k
                break
        try:
            log.append_entries(append.entries, heads[new_from:])
        except ValueError as error:  # entries this log cannot take as they are (a stream's: not its next records)
            raise ProtocolError(f"APPEND entries: {error}") from error
        self._verified = max(self._verified, prev + len(heads))
        self.leader_commit_index = max(self.leader_commit_index, append.commit_index)
        self._owed = True
        return None

    @property
    def nothing_to_sync(self) -> bool:
        """Everything in the log is fsynced: an APPEND that brought nothing (a heartbeat) can be
        answered at once, without a group-commit round."""
        return self.log.durable_index >= self.log.last_index

    def on_reset(self, reset: Reset) -> bytes | None:
        """Apply RESET: the leader no longer stores the entries this log lacks, so the log starts
        over after the leader's entry ``base_index``; answers REFUSE to a stale leader, else None
        (``ack()`` then acknowledges the base once the log says it is durable)."""
        log = self.log
        if reset.term < log.promised_term:
            return encode_refuse(log.promised_term)
        if reset.term > log.promised_term:
            log.promise(reset.term)
        if reset.term != self.leader_term:
            self.leader_term = reset.term
        try:
            log.reset(reset.base_index, reset.base_term, reset.base_position, reset.document)
        except (NotImplementedError, ValueError) as error:
            raise ProtocolError(f"RESET: {error}") from error
        self._verified = reset.base_index
        self._acked = 0  # the leader waits for an ACK of the base, whatever was acknowledged before
        return None

    @property
    def committed_index(self) -> int:
        """What this replica knows to be committed and holds as the leader does: the leader's
        commit index, within what is fsynced here and checked against the leader's log (Raft's
        min(leaderCommit, last new entry))."""
        return min(self.leader_commit_index, self.log.durable_index, self._verified)

    def ack(self) -> bytes | None:
        """An ACK for what is fsynced and verified, if that is more than was acknowledged."""
        index = min(self.log.durable_index, self._verified)
        if index <= self._acked or self.leader_term == 0:
            return None
        self._acked = index
        self._owed = False
        return encode_ack(self.leader_term, index)

    def answer_heartbeat(self) -> bytes | None:
        """An ACK for an APPEND that brought nothing to fsync (the leader's heartbeat), even if
        it repeats the last one; None if no APPEND is owed an answer."""
        if not self._owed or self.leader_term == 0 or not self.nothing_to_sync:
            return None
        self._owed = False
        index = min(self.log.durable_index, self._verified)
        self._acked = max(self._acked, index)
        return encode_ack(self.leader_term, index)
