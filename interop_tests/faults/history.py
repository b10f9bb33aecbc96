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

`check` returns a `Verdict`:

- every confirmed message was consumed at least once (``lost``);
- nothing consumed that was not published (``unexpected``);
- a message consumed again came with ``redelivered=true`` (``duplicates_unflagged``; flagged
  duplicates are allowed and counted);
- at most one node led and confirmed in each term (``terms_with_two_leaders``: two nodes that each
  said they led term T, with their commit index rising there).

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
    published: set[str] = set()
    confirmed: set[str] = set()
    seen: dict[str, int] = defaultdict(int)
    claims: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))  # term -> node -> commits
    for event in events:
        kind = event["type"]
        if kind == "publish":
            published.add(event["id"])
        elif kind == "ack":
            confirmed.add(event["id"])
        elif kind == "deliver":
            message = event["id"]
            if seen[message] and not event.get("redelivered"):
                verdict.duplicates_unflagged.append(message)
            elif seen[message]:
                verdict.duplicates += 1
            seen[message] += 1
        elif kind == "observe" and event.get("role") == "leader":
            claims[int(event["term"])][event["observer"]].append(int(event.get("commit_index", 0)))
    verdict.published = len(published)
    verdict.confirmed = len(confirmed)
    verdict.consumed = len(seen)
    verdict.lost = sorted(confirmed - set(seen))
    verdict.unexpected = sorted(set(seen) - published)
    for term, by_node in sorted(claims.items()):
        verdict.leaders_by_term[term] = sorted(by_node)
        # A node confirms in a term when its commit index moved while it said it led that term.
        confirming = sorted(node for node, commits in by_node.items() if len(commits) > 1 and max(commits) > min(commits))
        if len(confirming) > 1:
            verdict.terms_with_two_leaders[term] = confirming
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


def fault_table(events: list[dict[str, Any]], recovery_s: float = 10.0) -> list[FaultRow]:
    """Per fault kind (in the order first injected): see the module docstring. A fault's window
    runs from its injection to `recovery_s` after its heal (at most to the next fault's start)."""
    acks = sorted(e["t"] for e in events if e["type"] == "ack")
    published_at = {e["id"]: e["t"] for e in events if e["type"] == "publish"}
    verdict = check(events)
    lost_at = [published_at[m] for m in verdict.lost if m in published_at]
    duplicate_at = []
    seen: set[str] = set()
    for e in events:
        if e["type"] == "deliver":
            if e["id"] in seen and e["id"] in published_at:
                duplicate_at.append(published_at[e["id"]])
            seen.add(e["id"])
    rows: dict[str, FaultRow] = {}
    faults = [e for e in events if e["type"] == "fault"]
    stopped = min((e["t"] for e in events if e["type"] == "stop-publishing"), default=float("inf"))
    for number, fault in enumerate(faults):
        row = rows.setdefault(fault["kind"], FaultRow(fault["kind"]))
        # A fault's window ends `recovery_s` after its heal, or where the next fault begins.
        following = faults[number + 1]["start"] if number + 1 < len(faults) else stopped
        start, end = fault["start"], min(fault["end"] + recovery_s, following)
        row.faults += 1
        row.confirms += sum(1 for t in acks if start <= t <= end)
        row.lost += sum(1 for t in lost_at if start <= t <= end)
        row.duplicates += sum(1 for t in duplicate_at if start <= t <= end)
        row.unavailable.append(unavailability(acks, fault["start"], end))
    return list(rows.values())


def markdown_table(rows: list[FaultRow]) -> str:
    header = ["fault", "injected", "confirms", "confirmed lost", "duplicates (redelivered)",
              "unavailable median (s)", "unavailable max (s)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row.cells()) + " |" for row in rows]
    return "\n".join(lines)
