"""A replicated queue's leadership, terms and in-sync set in the coordination service.

Keys, under the cluster's prefix (``<q>`` is the queue's id as a `leaf_name`):

``replicas/<q>``
    JSON `GroupRecord`: term, leader, the leader's replication address, members, in_sync.
    Only ever changed by compare-and-set on its version: a term is claimed at most once.
``replica-leases/<q>``
    The leader's lease, ephemeral (it vanishes within the session TTL when the leader dies):
    ``{"term": T, "leader": name}``. Created only if absent, so it is also the lock that lets
    one candidate, and only one, claim the next term.
``replica-votes/<q>/<term>.<node>``
    A member's vote for an election of ``term``, ephemeral: its log's last term and index.
    A member writes it only after durably promising ``term`` (it then refuses every older
    leader), so once a majority has voted the old leader can no longer commit anything.

The winner of an election is the voter whose log is the most up to date (last term, then last
index; on a tie the member a leadership transfer names, then the record's leader, which before
term 1 is the node that created the group, then in-sync members, then the name, to make it
deterministic). Because every committed
entry is on a majority and the winner is chosen from a majority of votes, the winner's log holds
every committed entry: this is Raft's election restriction with the coordination service
counting the votes (`choose_leader`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from cluster.coordinator import Coordinator, VersionConflict, leaf_name

GROUPS = "replicas"
LEASES = "replica-leases"
VOTES = "replica-votes"


@dataclass(frozen=True)
class GroupRecord:
    queue: str  # the queue's id, as the broker names it
    term: int
    leader: str
    leader_address: str  # host:port of the leader's replication listener
    members: tuple[str, ...]
    in_sync: tuple[str, ...]
    # A member an operator asked to lead (ctl transfer_leadership): the leader hands over once
    # it has every entry, and the election prefers it among equally complete logs. "" when none.
    transfer_to: str = ""
    # Names this group apart from an earlier one of the same queue name (deleted, declared
    # again): a replica of another incarnation must not pass for a member of this one.
    incarnation: str = ""

    def encode(self) -> bytes:
        fields = {"queue": self.queue, "term": self.term, "leader": self.leader,
                  "leader_address": self.leader_address, "members": list(self.members),
                  "in_sync": list(self.in_sync)}
        if self.transfer_to:
            fields["transfer_to"] = self.transfer_to
        if self.incarnation:
            fields["incarnation"] = self.incarnation
        return json.dumps(fields, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> "GroupRecord":
        fields = json.loads(data)
        return cls(str(fields["queue"]), int(fields["term"]), str(fields["leader"]), str(fields["leader_address"]),
                   tuple(fields["members"]), tuple(fields["in_sync"]), str(fields.get("transfer_to", "")),
                   str(fields.get("incarnation", "")))

    @property
    def majority(self) -> int:
        return len(self.members) // 2 + 1


@dataclass(frozen=True)
class Lease:
    term: int
    leader: str


@dataclass(frozen=True)
class Vote:
    node: str
    last_term: int
    last_index: int


def choose_leader(votes: Iterable[Vote], record: GroupRecord) -> str | None:
    """The winner once a majority of the members has voted, else None."""
    ballots = [v for v in votes if v.node in record.members]
    if len(ballots) < record.majority:
        return None
    best = max(ballots, key=lambda v: (v.last_term, v.last_index, v.node == record.transfer_to,
                                       v.node == record.leader, v.node in record.in_sync, v.node))
    return best.node


class GroupKeys:
    """The coordination-service keys of one replicated queue, seen from one node."""

    def __init__(self, coordinator: Coordinator, queue_id: str) -> None:
        self._coordinator = coordinator
        leaf = leaf_name(queue_id)
        self._group_key = f"{GROUPS}/{leaf}"
        self._lease_key = f"{LEASES}/{leaf}"
        self._votes_directory = f"{VOTES}/{leaf}"

    async def read(self) -> tuple[GroupRecord | None, int | None]:
        """The group record and its version (None, None when the group does not exist)."""
        item = await self._coordinator.get(self._group_key)
        if item is None:
            return None, None
        return GroupRecord.decode(item.value), item.version

    async def create(self, record: GroupRecord) -> int | None:
        """Create the group; its version, or None if it already exists."""
        try:
            return await self._coordinator.compare_and_set(self._group_key, record.encode(), None)
        except VersionConflict:
            return None

    async def replace(self, record: GroupRecord, version: int) -> int | None:
        """Compare-and-set the record; its new version, or None if it changed meanwhile."""
        try:
            return await self._coordinator.compare_and_set(self._group_key, record.encode(), version)
        except VersionConflict:
            return None

    async def lease(self) -> Lease | None:
        return (await self.lease_and_version())[0]

    async def lease_and_version(self) -> tuple[Lease | None, int | None]:
        """The leader's lease and its version (None, None when nobody holds it)."""
        item = await self._coordinator.get(self._lease_key)
        if item is None:
            return None, None
        fields = json.loads(item.value)
        return Lease(int(fields["term"]), str(fields["leader"])), item.version

    async def take_lease(self, lease: Lease) -> bool:
        """Hold the leader's lease (ephemeral), only if nobody holds it."""
        value = json.dumps({"term": lease.term, "leader": lease.leader}).encode()
        try:
            await self._coordinator.compare_and_set(self._lease_key, value, None, ephemeral=True)
        except VersionConflict:
            return False
        return True

    async def release_lease(self, version: int | None = None) -> None:
        """Delete the lease (only at ``version`` when given: a lease taken since stays)."""
        try:
            await self._coordinator.delete(self._lease_key, version)
        except VersionConflict:
            pass

    async def delete(self) -> None:
        """Remove the group: its record, lease and votes."""
        await self._coordinator.delete(self._group_key)
        await self._coordinator.delete(self._lease_key)
        await self.forget_votes_below(1 << 62)

    async def vote(self, term: int, vote: Vote) -> None:
        value = json.dumps({"last_term": vote.last_term, "last_index": vote.last_index}).encode()
        await self._coordinator.put(f"{self._votes_directory}/{term:020d}.{leaf_name(vote.node)}", value,
                                    ephemeral=True)

    async def votes(self, term: int, members: Iterable[str]) -> list[Vote]:
        by_leaf = {leaf_name(m): m for m in members}
        prefix = f"{self._votes_directory}/{term:020d}."
        items, _ = await self._coordinator.list(self._votes_directory)
        votes = []
        for item in items:
            if not item.key.startswith(prefix):
                continue
            node = by_leaf.get(item.key[len(prefix):])
            if node is not None:
                fields = json.loads(item.value)
                votes.append(Vote(node, int(fields["last_term"]), int(fields["last_index"])))
        return votes

    async def forget_votes_below(self, term: int) -> None:
        """Remove the votes of elections before ``term`` (tidying; they are ephemeral anyway)."""
        items, _ = await self._coordinator.list(self._votes_directory)
        for item in items:
            leaf = item.key.rsplit("/", 1)[-1]
            if leaf[:20].isdigit() and int(leaf[:20]) < term:
                await self._coordinator.delete(item.key)
