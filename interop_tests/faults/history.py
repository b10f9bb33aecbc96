"""The history a fault run records, and the checker that judges it (as Jepsen judges a broker).

A history is a list of events (dicts), each with ``t`` (seconds, the recorder's monotonic clock)
and ``type``:

- ``publish`` (``id``, ``node``): a publish of message ``id`` was sent to ``node``;
- ``ack`` / ``nack`` / ``timeout`` (``id``, ``node``): its confirm came, its nack came, or
  nothing came within the publisher's confirm timeout (the publisher then moves on; the message
  is indeterminate: it may or may not be in the queue);
- ``deliver`` (``id``, ``node``, ``redelivered``, ``consumer``): a consumer received it;
- ``observe`` (``observer``, ``role``, ``term``, ``commit_index``, ``leader``): what a node said
  of its own replica of the queue (and which leader it names);
- ``fault`` (``kind``, ``target``, ``start``, ``end``): a fault injected at ``start`` and
  healed at ``end``;
- ``stop-publishing``: the publishers stopped (the run drains the queue from here on).

A stream's run (``x-queue-type: stream``) records, besides: ``deliver`` with ``offset`` (the
delivery's ``x-stream-offset``; ``consumer`` names the reader, which reads the whole stream
from its first record, resuming at the next offset it has not seen after each reconnection);
``final`` (``node``, ``offset``, ``id``): the stream read from its first record to its end on
``node`` after the heal; ``replica-files`` (``node``, ``digest``): a digest of the records in
the node's copy of the stream's segment files (headers left out), once every copy has the
leader's commit index.

`check` returns a `Verdict`:

- every confirmed message was consumed at least once (``lost``);
- nothing consumed that was not published (``unexpected``);
- a message consumed again came with ``redelivered=true`` (``duplicates_unflagged``; flagged
  duplicates are allowed and counted);
- at most one node led and confirmed in each term (``terms_with_two_leaders``: two nodes that each
  said they led term T, with their commit index rising there).

`check_stream` returns a `StreamVerdict` for a stream's run:

- every confirmed message is in the stream after the heal, read from every node (``lost``:
  missing from some node's final read);
- each message at exactly one offset, whichever reader or node read it (``moved``);
- no offset holding two different messages across readers and nodes (``conflicts``);
- nothing read that was not published (``unexpected``);
- every reader saw offsets 0, 1, 2, ... with no hole and nothing twice (``gaps``), also across
  its reconnections;
- every node's copy holds the same records (``replicas_differ``);
- at most one node led and confirmed in each term, as above;
- given ``served_within``: after each fault confirms flowed again within it (``slow_faults``,
  `unavailability`), the kinds in ``not_single_node`` aside.

`fault_table` summarises a run per fault kind: confirms during the faults, losses and
duplicates among the messages published during them, and the unavailability (the longest time
without any confirm, median and maximum over the faults of that kind).
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class History:
    """Events recorded from several threads and tasks, in the order they happened."""

    def __init__(self) -> None:
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._start = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._start

    def add(self, type_: str, **fields: Any) -> dict[str, Any]:
        event = {"t": round(self.now(), 4), "type": type_, **fields}
        with self._lock:
            self._events.append(event)
        return event

    @property
    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._events)

    def save(self, path: Path) -> None:
        path.write_text("".join(json.dumps(event, sort_keys=True) + "\n" for event in self.events))

    @staticmethod
    def load(path: Path) -> list[dict[str, Any]]:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass
class Verdict:
    published: int = 0
    confirmed: int = 0
    consumed: int = 0  # distinct messages
    lost: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    duplicates: int = 0  # deliveries beyond the first, all flagged redelivered
    duplicates_unflagged: list[str] = field(default_factory=list)
    terms_with_two_leaders: dict[int, list[str]] = field(default_factory=dict)
    leaders_by_term: dict[int, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.unexpected or self.duplicates_unflagged or self.terms_with_two_leaders)

    def summary(self) -> str:
        return (f"published {self.published}, confirmed {self.confirmed}, consumed {self.consumed}, "
                f"confirmed lost {len(self.lost)}, consumed unpublished {len(self.unexpected)}, "
                f"duplicates {self.duplicates} (unflagged {len(self.duplicates_unflagged)}), "
                f"terms with two confirming leaders {len(self.terms_with_two_leaders)}"
                + (f" {self.terms_with_two_leaders}" if self.terms_with_two_leaders else "")
                + f" -> {'ok' if self.ok else 'VIOLATIONS'}")


def check(events: Iterable[dict[str, Any]]) -> Verdict:
    """Judge a history (see the module docstring)."""
    verdict = Verdict()
    tally = _Tally()
    seen: dict[str, int] = defaultdict(int)
    for event in events:
        if tally.take(event):
            continue
        if event["type"] == "deliver":
            message = event["id"]
            if seen[message] and not event.get("redelivered"):
                verdict.duplicates_unflagged.append(message)
            elif seen[message]:
                verdict.duplicates += 1
            seen[message] += 1
    verdict.published = len(tally.published)
    verdict.confirmed = len(tally.confirmed)
    verdict.consumed = len(seen)
    verdict.lost = sorted(tally.confirmed - set(seen))
    verdict.unexpected = sorted(set(seen) - tally.published)
    verdict.leaders_by_term, verdict.terms_with_two_leaders = tally.leaders()
    return verdict


class _Tally:
    """What both checkers take from a history alike: the messages published and confirmed, and
    the commit indexes each node showed while it said it led a term."""

    def __init__(self) -> None:
        self.published: set[str] = set()
        self.confirmed: set[str] = set()
        self.claims: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))  # term -> node -> commits

    def take(self, event: dict[str, Any]) -> bool:
        """Count `event` if it is one of those; False when it is not."""
        kind = event["type"]
        if kind == "publish":
            self.published.add(event["id"])
        elif kind == "ack":
            self.confirmed.add(event["id"])
        elif kind == "observe":
            if event.get("role") == "leader":
                self.claims[int(event["term"])][event["observer"]].append(int(event.get("commit_index", 0)))
        else:
            return False
        return True

    def leaders(self) -> tuple[dict[int, list[str]], dict[int, list[str]]]:
        """Who said it led each term, and the terms two nodes led while confirming."""
        leaders: dict[int, list[str]] = {}
        two: dict[int, list[str]] = {}
        for term, by_node in sorted(self.claims.items()):
            leaders[term] = sorted(by_node)
            # A node confirms in a term when its commit index moved while it said it led that term.
            confirming = sorted(node for node, commits in by_node.items()
                                if len(commits) > 1 and max(commits) > min(commits))
            if len(confirming) > 1:
                two[term] = confirming
        return leaders, two


@dataclass
class StreamVerdict:
    published: int = 0
    confirmed: int = 0
    length: int = 0  # the longest final read
    read: int = 0  # distinct messages read, by any reader or final read
    lost: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    moved: dict[str, list[int]] = field(default_factory=dict)  # message -> the offsets it was read at
    conflicts: dict[int, list[str]] = field(default_factory=dict)  # offset -> the messages read there
    gaps: list[str] = field(default_factory=list)
    replicas_differ: dict[str, str] = field(default_factory=dict)  # node -> digest, when they are not all equal
    terms_with_two_leaders: dict[int, list[str]] = field(default_factory=dict)
    leaders_by_term: dict[int, list[str]] = field(default_factory=dict)
    slow_faults: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.unexpected or self.moved or self.conflicts or self.gaps
                    or self.replicas_differ or self.terms_with_two_leaders or self.slow_faults)

    def summary(self) -> str:
        def some(items: Iterable[Any]) -> str:
            shown = list(items)[:3]
            return f" {shown}" if shown else ""
        return (f"published {self.published}, confirmed {self.confirmed}, stream length {self.length}, "
                f"read {self.read}, confirmed lost {len(self.lost)}{some(self.lost)}, "
                f"read unpublished {len(self.unexpected)}, at two offsets {len(self.moved)}"
                f"{some(self.moved.items())}, offsets with two messages {len(self.conflicts)}"
                f"{some(self.conflicts.items())}, readers with gaps {len(self.gaps)}{some(self.gaps)}, "
                f"replicas differing {len(self.replicas_differ)}, "
                f"terms with two confirming leaders {len(self.terms_with_two_leaders)}, "
                f"faults served late {len(self.slow_faults)}{some(self.slow_faults)}"
                f" -> {'ok' if self.ok else 'VIOLATIONS'}")


# Not single-node faults in the sense of the target "served again within TTL + 5 s": a full
# leader disk blocks the publishers for as long as it lasts (the disk alarm), flapping keeps
# cutting the leader off (docs/reliability.md, "Targets").
NOT_SINGLE_NODE = frozenset({"disk-full-leader", "flapping"})


def check_stream(events: Iterable[dict[str, Any]], *, served_within: float | None = None,
                 recovery_s: float = 10.0, not_single_node: frozenset[str] = NOT_SINGLE_NODE) -> StreamVerdict:
    """Judge a stream's history (see the module docstring)."""
    events = list(events)
    verdict = StreamVerdict()
    tally = _Tally()
    offsets_of: dict[str, set[int]] = defaultdict(set)
    at_offset: dict[int, set[str]] = defaultdict(set)
    finals: dict[str, set[str]] = defaultdict(set)
    next_offset: dict[str, int] = {}  # reader -> the offset it should see next
    digests: dict[str, str] = {}
    for event in events:
        if tally.take(event):
            continue
        kind = event["type"]
        if kind in ("deliver", "final"):
            message, offset = event["id"], int(event["offset"])
            offsets_of[message].add(offset)
            at_offset[offset].add(message)
            reader = f"consumer {event['consumer']}" if kind == "deliver" else f"final read on {event['node']}"
            if kind == "final":
                finals[event["node"]].add(message)
            expected = next_offset.get(reader, 0)
            if offset != expected:
                what = "a hole" if offset > expected else "again"
                verdict.gaps.append(f"{reader}: offset {offset} after {expected - 1} ({what})")
            next_offset[reader] = max(expected, offset + 1)
        elif kind == "replica-files":
            digests[event["node"]] = event["digest"]
    published, confirmed = tally.published, tally.confirmed
    verdict.published = len(published)
    verdict.confirmed = len(confirmed)
    verdict.read = len(offsets_of)
    verdict.length = max(next_offset.get(f"final read on {node}", 0) for node in finals) if finals else 0
    if finals:
        everywhere = set.intersection(*finals.values())
        verdict.lost = sorted(confirmed - everywhere)
    else:
        verdict.lost = sorted(confirmed)
    verdict.unexpected = sorted(set(offsets_of) - published)
    verdict.moved = {m: sorted(o) for m, o in sorted(offsets_of.items()) if len(o) > 1}
    verdict.conflicts = {o: sorted(m) for o, m in sorted(at_offset.items()) if len(m) > 1}
    if len(set(digests.values())) > 1:
        verdict.replicas_differ = dict(sorted(digests.items()))
    verdict.leaders_by_term, verdict.terms_with_two_leaders = tally.leaders()
    if served_within is not None:
        for fault, seconds in fault_unavailability(events, recovery_s):
            if fault["kind"] not in not_single_node and seconds > served_within:
                verdict.slow_faults.append(f"{fault['kind']} at {fault['start']:.1f} s: {seconds:.1f} s")
    return verdict


@dataclass
class FaultRow:
    kind: str
    faults: int = 0
    confirms: int = 0
    lost: int = 0
    duplicates: int = 0
    unavailable: list[float] = field(default_factory=list)

    def cells(self) -> list[str]:
        median = statistics.median(self.unavailable) if self.unavailable else 0.0
        worst = max(self.unavailable) if self.unavailable else 0.0
        return [self.kind, str(self.faults), f"{self.confirms:,}", str(self.lost), str(self.duplicates),
                f"{median:.1f}", f"{worst:.1f}"]


def unavailability(ack_times: list[float], start: float, end: float) -> float:
    """The longest time without a confirm from `start` on (`ack_times` sorted): from `start` to
    the first confirm, between confirms, and from the last to `end`; when no confirm came within
    [start, end] at all, from `start` to the first confirm after `end` (the outage outlasted the
    window)."""
    within = [t for t in ack_times if start < t <= end]
    if not within:
        after = [t for t in ack_times if t > end]
        return (after[0] if after else end) - start
    points = [start, *within, end]
    return max(b - a for a, b in zip(points, points[1:]))


def _fault_windows(events: list[dict[str, Any]], recovery_s: float) -> list[tuple[dict[str, Any], float, float]]:
    """Each fault with its window: from its injection to `recovery_s` after its heal, or to
    where the next fault begins (or the publishers stopped)."""
    faults = [e for e in events if e["type"] == "fault"]
    stopped = min((e["t"] for e in events if e["type"] == "stop-publishing"), default=float("inf"))
    windows = []
    for number, fault in enumerate(faults):
        following = faults[number + 1]["start"] if number + 1 < len(faults) else stopped
        windows.append((fault, fault["start"], min(fault["end"] + recovery_s, following)))
    return windows


def fault_unavailability(events: list[dict[str, Any]], recovery_s: float = 10.0) -> list[tuple[dict[str, Any], float]]:
    """Each fault and its `unavailability` over its window."""
    acks = sorted(e["t"] for e in events if e["type"] == "ack")
    return [(fault, unavailability(acks, start, end)) for fault, start, end in _fault_windows(events, recovery_s)]


def fault_table(events: list[dict[str, Any]], recovery_s: float = 10.0, *,
                stream: StreamVerdict | None = None) -> list[FaultRow]:
    """Per fault kind (in the order first injected): see the module docstring. A fault's window
    runs from its injection to `recovery_s` after its heal (at most to the next fault's start).
    For a stream's run (`stream`, its verdict): the losses are its, and a duplicate is a message
    at two offsets (every reader reads every message, which is no duplicate)."""
    acks = sorted(e["t"] for e in events if e["type"] == "ack")
    published_at = {e["id"]: e["t"] for e in events if e["type"] == "publish"}
    lost = check(events).lost if stream is None else stream.lost
    lost_at = [published_at[m] for m in lost if m in published_at]
    duplicate_at = []
    if stream is None:
        seen: set[str] = set()
        for e in events:
            if e["type"] == "deliver":
                if e["id"] in seen and e["id"] in published_at:
                    duplicate_at.append(published_at[e["id"]])
                seen.add(e["id"])
    else:
        duplicate_at = [published_at[m] for m in stream.moved if m in published_at]
    rows: dict[str, FaultRow] = {}
    for fault, start, end in _fault_windows(events, recovery_s):
        row = rows.setdefault(fault["kind"], FaultRow(fault["kind"]))
        row.faults += 1
        row.confirms += sum(1 for t in acks if start <= t <= end)
        row.lost += sum(1 for t in lost_at if start <= t <= end)
        row.duplicates += sum(1 for t in duplicate_at if start <= t <= end)
        row.unavailable.append(unavailability(acks, start, end))
    return list(rows.values())


def markdown_table(rows: list[FaultRow], *, stream: bool = False) -> str:
    """The rows as docs/reliability.md shows them (`stream`: a stream's, whose duplicates are
    messages at two offsets)."""
    duplicates = "duplicates (at two offsets)" if stream else "duplicates (redelivered)"
    header = ["fault", "injected", "confirms", "confirmed lost", duplicates,
              "unavailable median (s)", "unavailable max (s)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row.cells()) + " |" for row in rows]
    return "\n".join(lines)
