"""The offsets of the ``amqp-queue`` streaming source: where each queue and stream is read up to.

Spark keeps a source's offsets as the JSON text the source returns, writes it to the query's
checkpoint (``offsets/<batch>``) and decides whether there is new data by comparing two such
texts. So the JSON must be the same text for the same position: every object here is built
with its keys in sorted order (``json.dumps`` keeps insertion order), at every level.

    {"format": 1,
     "nodes": {"/var/lib/amqp-server": {
        "queues": {"/": {"orders-eu": {"created": 1700000000000, "first": 0, "lost": 0,
                                       "next": 5001, "position": 1048616, "segment": 4001}}},
        "streams": {"/": {"events": {"created": 1700000000123, "first": 0, "lost": 0,
                                     "next": 90210, "position": 524328, "segment": 88000}}}}}}

A *node* is one broker data directory (the ``path`` of ``load``; several, comma-separated, for a
cluster whose nodes each hold their own queues: docs/spark.md). A replicated stream (a stream of a
cluster, with a copy on several nodes: ``spark.replicated_streams``) is not a node's: its offsets
are the same on every copy, so it has one entry, under ``"replicated"``
(``{"format": 1, "nodes": {...}, "replicated": {"streams": {"/": {"orders": {...}}}}}``), whose
``created`` is its group's incarnation (the same on every copy). A replicated (quorum) queue
likewise (``"replicated": {"queues": ...}``), its positions being log indices: ``next`` the next
entry to read, ``segment`` the same index, ``position`` 0, ``cuts`` ``[index, 0, index]``
(``spark.replicated_queue_log``). Per queue or stream:

* ``next``: every record with a ``seq`` (a stream's offset) below it has been read, or counted
  as lost; the next batch reads records from ``next`` on;
* ``segment``, ``position``: where in the files the record at ``next`` starts (the segment's id
  and a byte position in it; 0 is the first record after the header), so a batch reads from
  there and not from the start of a segment. For a queue it is a hint, checked before use (its
  ``seq`` filter is exact either way);
* ``created``: the ``created_at_ms`` of the queue's or stream's meta file, which tells it from
  one deleted and declared again under the same name;
* ``first``: the ``seq`` from which this query reads it (where it started, or where it was found
  when it appeared during the query), so that any batch can be planned again from its offsets;
* ``lost``: how many records this query never read because they were gone (retention,
  deletion) when it got to them, with ``failOnDataLoss=false`` (a count that only grows);
* ``cuts``: where the batch that ends here is cut into partitions, ``[segment, position, seq]``
  each: every segment start inside the batch, and points about every ``partition_bytes`` inside
  a segment. Chosen when the end is, and kept with it, so a batch planned again after a restart
  has the same partitions, in the same order, whatever the files hold by then: what a sink that
  derives message ids from the partition and row (``amqp_sink``) needs to be idempotent.
"""

from __future__ import annotations

import datetime
import json
import math
from typing import Any, NamedTuple

FORMAT = 1
QUEUE, STREAM = "queue", "stream"
_GROUP = {QUEUE: "queues", STREAM: "streams"}
_KIND = {group: kind for kind, group in _GROUP.items()}
EARLIEST, LATEST = -2, -1  # in startingOffsets JSON, as in Spark's Kafka source


REPLICATED = ""  # the node of a replicated stream's key: all of them (no label is empty: spark.options.parse_nodes)


class SourceKey(NamedTuple):
    """One queue or stream of one node (data directory), or a replicated stream (``node`` is
    ``REPLICATED``: one key for all its copies, whose offsets are the same)."""

    node: str
    kind: str  # QUEUE or STREAM
    vhost: str
    name: str

    def describe(self) -> str:
        if self.node == REPLICATED:
            return f"replicated {self.kind} {self.name!r} in vhost {self.vhost!r}"
        return f"{self.kind} {self.name!r} in vhost {self.vhost!r} of {self.node}"


class Position(NamedTuple):
    """How far one queue or stream has been read; see the module docstring."""

    created: int
    first: int
    next: int
    segment: int
    position: int
    lost: int = 0
    cuts: tuple[tuple[int, int, int], ...] = ()


Offsets = dict[SourceKey, Position]
_FIELDS = sorted(Position._fields)


def encode(offsets: Offsets) -> dict[str, Any]:
    """The JSON document (as dicts with sorted keys) of ``offsets``."""
    nodes: dict[str, Any] = {}
    replicated: dict[str, Any] = {}
    for key in sorted(offsets):
        groups = replicated if key.node == REPLICATED else nodes.setdefault(key.node, {})
        vhosts = groups.setdefault(_GROUP[key.kind], {})
        position = offsets[key]
        entry: dict[str, Any] = {field: getattr(position, field) for field in _FIELDS}
        entry["cuts"] = [list(cut) for cut in position.cuts]
        vhosts.setdefault(key.vhost, {})[key.name] = entry
    document = {"format": FORMAT, "nodes": _sorted(nodes)}
    if replicated:
        document["replicated"] = _sorted(replicated)
    return document


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    return value


def decode(document: Any) -> Offsets:
    """The offsets in a JSON document ``encode`` made (read back from a checkpoint)."""
    if not isinstance(document, dict) or document.get("format") != FORMAT or not isinstance(document.get("nodes"), dict):
        raise ValueError(f"amqp-queue: not offsets of this source (format {FORMAT}): {json.dumps(document)[:200]}")
    offsets: Offsets = {}
    places = [*document["nodes"].items(), *([(REPLICATED, document["replicated"])] if "replicated" in document else [])]
    for node, groups in places:
        for group, vhosts in groups.items():
            for vhost, names in vhosts.items():
                for name, fields in names.items():
                    cuts = tuple((int(a), int(b), int(c)) for a, b, c in fields.get("cuts", ()))
                    offsets[SourceKey(node, _KIND[group], vhost, name)] = Position(
                        **{f: int(fields[f]) for f in _FIELDS if f != "cuts"}, cuts=cuts)
    return offsets


def dumps(offsets: Offsets) -> str:
    """The offsets as Spark stores them (for logs and tests; Spark does its own ``json.dumps``)."""
    return json.dumps(encode(offsets))


# ---- startingOffsets ---------------------------------------------------------------------------


class Starting(NamedTuple):
    """Where a query without a checkpoint starts: ``mode`` is "earliest", "latest", "timestamp"
    (records published at or after ``timestamp_ms``) or "specific" (``specific``: per vhost or
    None for any vhost, per queue name, a seq or EARLIEST / LATEST; others start at latest)."""

    mode: str
    timestamp_ms: int = 0
    specific: dict[tuple[str | None, str], int] | None = None

    def for_source(self, vhost: str, name: str) -> tuple[str, int]:
        """("earliest" | "latest" | "seq" | "timestamp", value) for one queue or stream."""
        if self.mode == "specific":
            assert self.specific is not None
            value = self.specific.get((vhost, name), self.specific.get((None, name), LATEST))
            if value == EARLIEST:
                return "earliest", 0
            if value == LATEST:
                return "latest", 0
            return "seq", value
        return self.mode, self.timestamp_ms


def parse_starting(value: object) -> Starting:
    """The ``startingOffsets`` option: ``earliest``, ``latest``, a JSON object of queue names to
    offsets (``{"orders": 1200, "events": -2}``, or per vhost: ``{"eu": {"orders": 1200}}``; -2
    earliest, -1 latest, unlisted queues latest), or a timestamp: ISO 8601 (a time without a zone
    is UTC) or epoch milliseconds. Anything else is an error naming the option."""
    text = str(value).strip()
    lowered = text.lower()
    if lowered in ("earliest", "latest"):
        return Starting(lowered)
    if text.startswith("{"):
        return Starting("specific", specific=_specific(text))
    if text.isdigit():
        return Starting("timestamp", timestamp_ms=int(text))
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"amqp-queue option startingOffsets must be earliest, latest, a JSON object of queue "
                         f"offsets or a timestamp (ISO 8601 or epoch milliseconds), not {value!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return Starting("timestamp", timestamp_ms=math.floor(moment.timestamp() * 1000))


def _specific(text: str) -> dict[tuple[str | None, str], int]:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"amqp-queue option startingOffsets is not valid JSON: {err}") from None
    found: dict[tuple[str | None, str], int] = {}

    def offset_of(where: str, raw: object) -> int:
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < EARLIEST:
            raise ValueError(f"amqp-queue option startingOffsets: the offset of {where} must be a whole number "
                             f">= 0, or -2 (earliest) or -1 (latest), not {json.dumps(raw)}")
        return raw

    if not isinstance(document, dict):
        raise ValueError("amqp-queue option startingOffsets: the JSON must be an object of queue names")
    for name, raw in document.items():
        if isinstance(raw, dict):  # a vhost and its queues
            for queue, inner in raw.items():
                found[(name, queue)] = offset_of(f"{queue!r} in vhost {name!r}", inner)
        else:
            found[(None, name)] = offset_of(repr(name), raw)
    return found
