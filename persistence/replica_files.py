"""Where a cluster node keeps its replicas, for readers of the files (the Spark data source).

A node's replicated queues and streams (docs/replication.md) live in
``<data_dir>/replicas/<group-dir>/``, ``<group-dir>`` being the lowercase hex SHA-1 of the
group's name in UTF-8: the JSON ``["<vhost>","<name>"]`` for a quorum queue,
``["<vhost>","<name>","stream"]`` for a stream (no spaces, ``\\uXXXX`` for characters outside
ASCII). Each holds ``term.json`` (the highest term this replica promised) and ``incarnation``
(the group's random identity, the same text on every member: a queue or stream deleted and
declared again under its name is a new group with another one). A stream's group also holds
``stream/``, the stream's own directory (docs/stream-files.md), whose records, offsets and
segment names are those of every other copy; a queue's holds ``replica.log``.

The writers are cluster/replication (``ReplicaManager``, ``StreamReplicaLog``, ``FileReplicaLog``);
this module only reads, and names the same files (tests/test_spark_replicas.py checks that it
names what the writers write). It imports nothing of the cluster, so the Spark data source,
which may import only ``persistence``, can find the replicas.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import NamedTuple

REPLICAS_DIR = "replicas"
STREAM_DIR = "stream"
INCARNATION_FILE = "incarnation"
TERM_FILE = "term.json"
QUEUE_LOG_FILE = "replica.log"
STREAM_KIND = "stream"


def group_name(vhost: str, name: str, stream: bool) -> str:
    """The name of the replication group of queue or stream ``name`` of ``vhost``."""
    parts = [vhost, name, STREAM_KIND] if stream else [vhost, name]
    return json.dumps(parts, separators=(",", ":"))


def group_directory(data_dir: str | Path, vhost: str, name: str, stream: bool) -> Path:
    """The directory a node keeps its replica of that group in (it may not exist)."""
    digest = hashlib.sha1(group_name(vhost, name, stream).encode("utf-8")).hexdigest()
    return Path(data_dir) / REPLICAS_DIR / digest


class StreamCopy(NamedTuple):
    """One node's copy of a replicated stream: its stream directory and its group's incarnation."""

    directory: Path  # <group-dir>/stream
    incarnation: str


def stream_copies(data_dir: str | Path) -> list[StreamCopy]:
    """The replicated streams' directories under ``data_dir``, in directory order; a group
    directory without a stream directory is a queue's, and one without its ``incarnation`` yet
    (a replica being made) is left out: it cannot be told from another group of the same name."""
    root = Path(data_dir) / REPLICAS_DIR
    try:
        groups = sorted(os.listdir(root))
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for group in groups:
        stream = root / group / STREAM_DIR
        incarnation = read_incarnation(root / group)
        if incarnation and stream.is_dir():
            found.append(StreamCopy(stream, incarnation))
    return found


def read_incarnation(group_dir: Path) -> str | None:
    try:
        return (Path(group_dir) / INCARNATION_FILE).read_text().strip() or None
    except (FileNotFoundError, NotADirectoryError):
        return None


def promised_term(group_dir: Path) -> int | None:
    """The highest term this replica promised; None when it has no term file (or no replica)."""
    try:
        return int(json.loads((Path(group_dir) / TERM_FILE).read_text())["promised_term"])
    except (FileNotFoundError, NotADirectoryError, ValueError, KeyError, TypeError):
        return None


def incarnation_number(incarnation: str) -> int:
    """The incarnation as a number below 2**63 (a JSON integer any reader takes): its first 15
    hex digits (60 random bits), or, for text that is not hex, a hash of it."""
    try:
        return int(incarnation[:15], 16)
    except ValueError:
        return int(hashlib.sha1(incarnation.encode()).hexdigest()[:15], 16)


__all__ = ["REPLICAS_DIR", "STREAM_DIR", "INCARNATION_FILE", "TERM_FILE", "QUEUE_LOG_FILE", "StreamCopy",
           "group_name", "group_directory", "stream_copies", "read_incarnation", "promised_term",
           "incarnation_number"]
