"""The leader's side of one queue's replication, sans-I/O.

`LeaderReplication` owns the per-follower progress and the commit index for one term:

* ``append(payload)`` adds an entry to the local log; ``outgoing(node)`` gives the next APPEND
  frame for a follower (a run of the log, as stored), pipelined up to ``WINDOW`` entries ahead
  of what the follower acknowledged;
* a follower's ACK says up to which index its log is fsynced and matches ours; the local log's
  ``durable_index`` says the same for the leader;
* a follower that needs entries the log no longer stores (below its ``first_index``: a stream's
  retention or a queue's compaction dropped them, all committed) is sent RESET instead: it drops
  its log, which goes on after the last entry not stored, and ACKs that entry;
* ``commit_index`` is the highest index that a majority of the group (leader included) has
  fsynced, counted only once an entry of this term reaches it (as in Raft: an older term's entry
  is never committed by counting replicas). A confirm for an entry leaves only when
  ``commit_index`` reaches it;
* a follower that answers with a newer term (REFUSE) has promised that term to another
  candidate: the leader steps down and its commit index never moves again, so a stale leader
  cannot confirm anything.

A follower is *in sync* once its acknowledged index reached the commit index, and stops being
when its stream breaks; the shell publishes the set in the coordination service.

**Check-quorum.** A leader cut off from its followers (a partition, every stream silent) must not
keep its lease, or nobody serves the queue. The shell sends ``heartbeat(node)`` (an APPEND with no
entries, which a follower answers with an ACK) to every follower it has not written to lately,
calls ``heard_from(node, now)`` for every frame a follower sends, and asks ``has_quorum(now,
within)``: False once fewer than a majority (this node included) were heard within ``within``
seconds; the shell then steps down and gives up its lease, so the majority elects a new leader.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from cluster.replication.log import ReplicaLog
from cluster.replication.wire import MAX_APPEND_BYTES, Ack, Hello, Mismatch, Refuse, encode_append, encode_reset

WINDOW = 65536  # entries a follower may be sent beyond what it acknowledged


class LeaderRole(enum.Enum):
    LEADING = "leading"
    STEPPED_DOWN = "stepped_down"  # a newer term exists: nothing more is appended or committed


class NotLeader(RuntimeError):
    """This replica is no longer the leader of its term."""


class _Follower:
    __slots__ = ("next_index", "match_index", "window_base", "connected", "probing", "awaiting", "in_sync",
                 "heard_at", "told_commit")

    def __init__(self, next_index: int, heard_at: float = 0.0) -> None:
        self.next_index = next_index  # the first entry to send next
        self.match_index = 0  # fsynced there and known to match ours
        self.window_base = 0  # the in-flight window counts from here (or from match_index if higher)
        self.connected = False
        self.probing = True  # until an ACK confirms where its log matches, one APPEND at a time
        self.awaiting = False
        self.in_sync = False
        self.heard_at = heard_at  # when a frame from it last arrived (check-quorum; the shell's clock)
        self.told_commit = 0  # the commit index its last APPEND carried

    def heard(self, now: float) -> None:
        """A frame from this follower arrived at ``now``."""
        self.heard_at = max(self.heard_at, now)


class LeaderReplication:
    """One term of leadership over ``log``, for the group ``members`` (this node included)."""

    def __init__(self, node: str, term: int, log: ReplicaLog, members: Iterable[str], now: float = 0.0) -> None:
        """``now``: the shell's clock when the term starts; every follower counts as heard then,
        so each has the whole check-quorum interval to connect."""
        members = list(dict.fromkeys(members))
        if node not in members:
            raise ValueError(f"{node} is not a member of {members}")
        if term < log.promised_term:
            raise ValueError(f"term {term} is below the promised term {log.promised_term}")
        log.promise(term)
        self.node = node
        self.term = term
        self.log = log
        self.role = LeaderRole.LEADING
        self.newer_term = 0  # the term that made us step down
        self.commit_index = 0
        self.majority = len(members) // 2 + 1
        self._started_at = now
        self._followers = {m: _Follower(log.last_index + 1, now) for m in members if m != node}

    # ---- appending -------------------------------------------------------------------------

    def start_term(self) -> int:
        """Append the term's first entry, an empty no-op: committing it commits every earlier
        entry this leader inherited."""
        return self.append(b"")

    def append(self, payload: bytes) -> int:
        if self.role is not LeaderRole.LEADING:
            raise NotLeader(f"term {self.term} is over (term {self.newer_term} exists)")
        return self.log.append(self.term, payload)

    # ---- followers -------------------------------------------------------------------------

    def follower_connected(self, hello: Hello) -> bool:
        """A follower's stream opened; False if it is not a member or knows a newer term."""
        follower = self._followers.get(hello.node)
        if follower is None:
            return False
        if hello.term > self.term:
            self._step_down(hello.term)
            return False
        follower.connected = True
        follower.probing, follower.awaiting = True, False
        follower.next_index = min(hello.last_index, self.log.last_index) + 1
        follower.window_base = follower.next_index - 1
        # A follower that lost its disk has less than it acknowledged; count what it has now.
        follower.match_index = min(follower.match_index, hello.last_index)
        return True

    def change_members(self, members: Iterable[str]) -> None:
        """The group's members changed (one added or removed at a time, in the group record): a
        new follower starts probing from our log's end, a removed one no longer counts, and the
        majority is the new group's. One member at a time keeps every majority of the old group
        overlapping every majority of the new one."""
        wanted = [m for m in dict.fromkeys(members) if m != self.node]
        for node in [n for n in self._followers if n not in wanted]:
            del self._followers[node]
        for node in wanted:
            if node not in self._followers:
                # A new member has not been heard yet: it counts from the start of the term.
                self._followers[node] = _Follower(self.log.last_index + 1, self._started_at)
        self.majority = (len(wanted) + 1) // 2 + 1
        self._advance_commit()

    def follower_lost(self, node: str) -> None:
        follower = self._followers.get(node)
        if follower is None:
            return
        follower.connected = False
        follower.in_sync = False

    def outgoing(self, node: str) -> bytes | None:
        """The next APPEND for ``node``, or None when there is nothing to send now."""
        follower = self._followers[node]
        if self.role is not LeaderRole.LEADING or not follower.connected or follower.awaiting:
            return None
        first = follower.next_index
        if first < self.log.first_index:
            # The entries it lacks are no longer stored here (a stream's retention or a queue's
            # compaction dropped them, every one of them committed): it starts over after the
            # last entry not stored.
            base = self.log.first_index - 1
            follower.next_index = base + 1
            follower.window_base = base
            follower.awaiting = True  # its ACK of the base comes once its reset is durable
            return encode_reset(self.term, base, self.log.term_at(base), *self.log.reset_point(base))
        if first - 1 - max(follower.match_index, follower.window_base) >= WINDOW:
            return None
        if first > self.log.last_index and not follower.probing:
            if not (self.log.follows_commits and self.commit_index > follower.told_commit):
                return None
        # While probing, an APPEND without entries still checks where the logs match (and for
        # a log whose followers act on commits, one tells them the commit index moved).
        entries, last = self.log.read_entries(first, MAX_APPEND_BYTES)
        prev = first - 1
        frame = encode_append(self.term, prev, self.log.term_at(prev), self.commit_index, entries)
        follower.next_index = last + 1
        follower.awaiting = follower.probing
        follower.told_commit = self.commit_index
        return frame

    def heartbeat(self, node: str) -> bytes | None:
        """An APPEND without entries for ``node`` (the follower answers it with an ACK, which
        proves the stream works both ways), or None when the follower is not connected or an
        APPEND it must answer is outstanding anyway (a probe)."""
        follower = self._followers.get(node)
        if self.role is not LeaderRole.LEADING or follower is None or not follower.connected or follower.awaiting:
            return None
        prev = follower.next_index - 1
        return encode_append(self.term, prev, self.log.term_at(prev), self.commit_index, b"")

    def heard_from(self, node: str, now: float) -> None:
        """A frame from follower ``node`` arrived at ``now``."""
        follower = self._followers.get(node)
        if follower is not None:
            follower.heard(now)

    def heard_at(self, node: str) -> float:
        """When a frame from follower ``node`` last arrived (the term's start if none has)."""
        follower = self._followers.get(node)
        return follower.heard_at if follower is not None else self._started_at

    def has_quorum(self, now: float, within: float) -> bool:
        """Were a majority of the members, this node included, heard within ``within`` seconds
        of ``now``? (A stepped-down leader has none.)"""
        if self.role is not LeaderRole.LEADING:
            return False
        heard = 1 + sum(1 for f in self._followers.values() if now - f.heard_at <= within)
        return heard >= self.majority

    def on_ack(self, node: str, ack: Ack) -> bool:
        """True if the commit index moved."""
        follower = self._followers.get(node)
        if follower is None or ack.term != self.term:
            if ack.term > self.term:
                self._step_down(ack.term)
            return False
        follower.match_index = max(follower.match_index, ack.index)
        follower.probing = follower.awaiting = False
        follower.next_index = max(follower.next_index, follower.match_index + 1)
        moved = self._advance_commit()
        if not follower.in_sync and follower.connected and follower.match_index >= self.commit_index:
            follower.in_sync = True
        return moved

    def on_mismatch(self, node: str, mismatch: Mismatch) -> None:
        follower = self._followers.get(node)
        if mismatch.term > self.term:
            self._step_down(mismatch.term)
            return
        if follower is None:
            return
        follower.next_index = min(mismatch.hint, self.log.last_index) + 1
        follower.window_base = follower.next_index - 1
        follower.match_index = min(follower.match_index, mismatch.hint)
        follower.probing, follower.awaiting = True, False

    def on_refuse(self, node: str, refuse: Refuse) -> None:
        self._step_down(max(refuse.term, self.term + 1))

    def local_synced(self) -> bool:
        """The local log's durable index rose; True if the commit index moved."""
        return self._advance_commit()

    # ---- facts -----------------------------------------------------------------------------

    def in_sync_members(self) -> list[str]:
        """This node and every follower that has caught up, by name."""
        return sorted([self.node] + [n for n, f in self._followers.items() if f.in_sync])

    def progress(self) -> dict[str, tuple[bool, int, int]]:
        """Per follower: (connected, acknowledged index, next index to send)."""
        return {n: (f.connected, f.match_index, f.next_index) for n, f in sorted(self._followers.items())}

    # ---- internals -------------------------------------------------------------------------

    def _advance_commit(self) -> bool:
        if self.role is not LeaderRole.LEADING:
            return False
        acknowledged = sorted([self.log.durable_index] + [f.match_index for f in self._followers.values()],
                              reverse=True)
        candidate = acknowledged[self.majority - 1]
        if candidate > self.commit_index and self.log.term_at(candidate) == self.term:
            self.commit_index = candidate
            return True
        return False

    def _step_down(self, newer_term: int) -> None:
        self.role = LeaderRole.STEPPED_DOWN
        self.newer_term = max(self.newer_term, newer_term)
