"""Where each shared definition lives in the coordination service, and how its value is written.

One key per object, in one directory per kind, under the cluster's prefix:

    definitions/vhosts/<vhost>                     {"entry": {...}, "by": node, "seq": n}
    definitions/users/<user>                       (the password hash only, never a password)
    definitions/permissions/<vhost>,<user>
    definitions/exchanges/<vhost>,<exchange>
    definitions/queues/<vhost>,<queue>             + "home": the owner node, "exclusive": bool
    definitions/bindings/<sha256 of the binding>   one key per binding, so 10,000 bindings on
                                                   one exchange are 10,000 small values
    definitions/policies/<vhost>,<policy>          (and operator_policies/ the same way)
    definitions/vhost_limits/<vhost>
    definitions/user_limits/<user>
    definitions/runtime_parameters/<vhost>,<component>,<name>
    queue-owners/<vhost>,<queue>                   {"node": owner}: ephemeral, in the owner's session

Names are made safe key segments by `leaf_name` (percent-encoding, so "," never appears inside
one). "entry" is the object in RabbitMQ's definitions-export shape with AMQP argument values in
the definitions file's tagged encoding (persistence/definitions_codec.py). "by" and "seq" name the
write (the writing process and its write counter), so a node recognises the echo of its own change.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from cluster.coordinator import leaf_name
from persistence.definitions_codec import ENTITIES, decode_value, encode_value, normalise_entry

DEFINITIONS = "definitions"
OWNERS = "queue-owners"
# In the order a node applies a listing: what an object needs exists before it.
KINDS = ("users", "vhosts", "permissions", "policies", "operator_policies", "exchanges", "queues", "bindings",
         "vhost_limits", "user_limits", "runtime_parameters")
# Set by the management API and ctl, applied to what exists (policies.py, resource_limits.py,
# runtime_parameters.py).
SETTINGS = ("policies", "operator_policies", "vhost_limits", "user_limits", "runtime_parameters")
DIRECTORIES = {kind: f"{DEFINITIONS}/{kind}" for kind in KINDS}
KIND_OF_DIRECTORY = {directory: kind for kind, directory in DIRECTORIES.items()}
WITH_ARGUMENTS = ("exchanges", "queues", "bindings")
# Written once, by the node that first fills an empty cluster with its own definitions.
SEEDED_MARKER = f"{DEFINITIONS}/seeded"


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def entry_key(kind: str, entry: dict[str, Any]) -> str:
    """The key of the object `entry` (decoded values) describes."""
    directory = DIRECTORIES[kind]
    if kind in ("users", "vhosts"):
        return f"{directory}/{leaf_name(entry['name'])}"
    if kind == "permissions":
        return f"{directory}/{leaf_name(entry['vhost'])},{leaf_name(entry['user'])}"
    if kind == "vhost_limits":
        return f"{directory}/{leaf_name(entry['vhost'])}"
    if kind == "user_limits":
        return f"{directory}/{leaf_name(entry['user'])}"
    if kind == "runtime_parameters":
        return f"{directory}/{leaf_name(entry['vhost'])},{leaf_name(entry['component'])},{leaf_name(entry['name'])}"
    if kind == "bindings":
        identity = _text([entry["vhost"], entry["source"], entry["destination_type"], entry["destination"],
                          entry["routing_key"], encode_value(entry.get("arguments") or {})])
        return f"{directory}/{hashlib.sha256(identity.encode()).hexdigest()}"
    return f"{directory}/{queue_leaf(entry['vhost'], entry['name'])}"


def queue_leaf(vhost: str, name: str) -> str:
    return f"{leaf_name(vhost)},{leaf_name(name)}"


def owner_key(vhost: str, queue: str) -> str:
    return f"{OWNERS}/{queue_leaf(vhost, queue)}"


@dataclass(frozen=True)
class SharedValue:
    """One definition as the coordination service holds it."""

    kind: str
    entry: dict[str, Any]  # decoded: AMQP argument values as the broker uses them
    by: str  # the writer: a node's process (node name and a token of that process)
    seq: int  # that writer's write counter
    home: str = ""  # queues: the owner node
    exclusive: bool = False  # queues: usable only by one connection of the owner

    def encode(self) -> bytes:
        document: dict[str, Any] = {"entry": _encoded_entry(self.kind, self.entry), "by": self.by, "seq": self.seq}
        if self.kind == "queues":
            document["home"] = self.home
            document["exclusive"] = self.exclusive
        return _text(document).encode()

    @classmethod
    def decode(cls, kind: str, data: bytes) -> "SharedValue":
        """ValueError (DefinitionsError included) for a value this version cannot read."""
        document = json.loads(data)
        if not isinstance(document, dict) or not isinstance(document.get("entry"), dict):
            raise ValueError("not a shared definition")
        entry = dict(document["entry"])
        normalise_entry(entry, ENTITIES[kind], kind)
        if kind in WITH_ARGUMENTS:
            entry["arguments"] = decode_value(entry["arguments"])
        return cls(kind, entry, str(document.get("by", "")), int(document.get("seq", 0)),
                   str(document.get("home", "")), bool(document.get("exclusive", False)))

    def same_object_as(self, other: "SharedValue") -> bool:
        """The same definition, whoever wrote it."""
        return (self.entry_text() == other.entry_text() and self.home == other.home
                and self.exclusive == other.exclusive)

    def entry_text(self) -> str:
        return _text(_encoded_entry(self.kind, self.entry))


def _encoded_entry(kind: str, entry: dict[str, Any]) -> dict[str, Any]:
    if kind not in WITH_ARGUMENTS:
        return entry
    return {**entry, "arguments": encode_value(entry.get("arguments") or {})}


def decode_owner(data: bytes) -> str:
    """The node an ownership key names ("" when unreadable)."""
    try:
        document = json.loads(data)
    except ValueError:
        return ""
    return str(document.get("node", "")) if isinstance(document, dict) else ""


def encode_owner(node: str) -> bytes:
    return _text({"node": node}).encode()
