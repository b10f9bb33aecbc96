"""The stored definitions as a table changed one entry at a time, and the log records of those changes.

Each entry is kept as its JSON text (tagged argument encoding, sorted keys),
so a change costs the size of that one entry: encoding it, comparing it with
what is stored, and one log record. Nothing ever re-encodes the whole table
except a snapshot (``snapshot_bytes``), which the file store writes off the
event loop.

A record is one JSON object ``{"op": "put" | "remove", "kind": K, "entry": E}``
with ``E`` in the file's tagged encoding (for "remove", only the entry's key
fields matter). Removing an entry removes what cannot exist without it, so a
replayed log reaches the same table as the broker that wrote it:

    a queue     its bindings (as destination)
    an exchange its bindings (as source or as destination)
    a vhost     its permissions, queues, exchanges, bindings, policies, limits and runtime parameters
    a user      its limits
"""

from __future__ import annotations

import json
from typing import Any

from persistence.definitions_codec import (
    ENTITIES,
    FORMAT_KEY,
    WITH_ARGUMENTS,
    DefinitionsError,
    Definitions,
    encode_value,
    normalise_entry,
)

KINDS = tuple(ENTITIES)
# Fields naming an entry: two entries with the same key are one entry (the later replaces it).
KEY_FIELDS: dict[str, tuple[str, ...]] = {
    "users": ("name",),
    "vhosts": ("name",),
    "permissions": ("user", "vhost"),
    "queues": ("vhost", "name"),
    "exchanges": ("vhost", "name"),
    "bindings": ("vhost", "source", "destination_type", "destination", "routing_key", "arguments"),
    "policies": ("vhost", "name"),
    "operator_policies": ("vhost", "name"),
    "vhost_limits": ("vhost",),
    "user_limits": ("user",),
    "runtime_parameters": ("vhost", "component", "name"),
}
LOG_KEY = "amqp_server_log"  # in a snapshot: the first log generation written after it
PUT = "put"
REMOVE = "remove"
EXTRAS = "extras"  # replaces the other top-level keys (a full save of a RabbitMQ export has them)

Key = tuple[str, ...]


def _text(value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as err:
        raise DefinitionsError(f"definitions: cannot be written as JSON: {err}") from err


def _key(kind: str, entry: dict[str, Any]) -> Key:
    fields = KEY_FIELDS[kind]
    if kind == "bindings":
        return tuple(entry[f] for f in fields[:-1]) + (_text(entry.get("arguments") or {}),)
    return tuple(entry[f] for f in fields)


class DefinitionTable:
    """Every stored definition, by kind and key, as JSON text; see the module docstring."""

    def __init__(self) -> None:
        self._entries: dict[str, dict[Key, str]] = {kind: {} for kind in KINDS}
        # (vhost, "source" | "queue" | "exchange", name) -> keys of the bindings with that end.
        self._binding_ends: dict[tuple[str, str, str], set[Key]] = {}
        # Other top-level keys of a loaded document (a RabbitMQ export's policies ...), kept as they were.
        self._extras: dict[str, Any] = {}

    @classmethod
    def from_document(cls, document: Definitions) -> "DefinitionTable":
        """A table holding a decoded, normalised definitions document (decode_definitions' result)."""
        table = cls()
        table._extras = {
            key: value for key, value in document.items() if key not in ENTITIES and key not in (FORMAT_KEY, LOG_KEY)
        }
        for kind in KINDS:
            for entry in document[kind]:
                table._store(kind, _encoded(kind, entry))
        return table

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._entries.values())

    # -- changes: each returns its log record's JSON text, or None when nothing changed --

    def put(self, kind: str, entry: dict[str, Any]) -> str | None:
        """Add ``entry`` (decoded values) or replace the entry with its key."""
        entry = dict(entry)
        normalise_entry(entry, ENTITIES[kind], f"{kind} entry")
        encoded = _encoded(kind, entry)
        text = _text(encoded)
        if self._entries[kind].get(_key(kind, encoded)) == text:
            return None
        self._store(kind, encoded, text)
        return f'{{"op":"{PUT}","kind":"{kind}","entry":{text}}}'

    def remove(self, kind: str, entry: dict[str, Any]) -> str | None:
        """Remove the entry with ``entry``'s key, and what depends on it."""
        keyed = {field: entry[field] for field in KEY_FIELDS[kind] if field in entry}
        if kind == "bindings":
            keyed["arguments"] = encode_value(entry.get("arguments") or {})
        try:
            key = _key(kind, keyed)
        except KeyError as missing:
            raise DefinitionsError(f"{kind} entry is missing {missing}") from None
        if key not in self._entries[kind]:
            return None
        self._discard(kind, key)
        return f'{{"op":"{REMOVE}","kind":"{kind}","entry":{_text(keyed)}}}'

    def replace(self, document: Definitions, kinds: tuple[str, ...] = KINDS) -> list[str]:
        """Make the entries of ``kinds`` exactly those of ``document`` (decoded values); the
        records of the changes, none for entries that stay the same. With every kind, the
        document's other top-level keys replace the kept ones too. Validates everything
        before changing anything."""
        if not isinstance(document, dict):
            raise DefinitionsError("definitions must be a JSON object / dict")
        wanted: dict[str, dict[Key, str]] = {}
        for kind in kinds:
            entries = document.get(kind, [])
            if not isinstance(entries, list):
                raise DefinitionsError(f"definitions: {kind} must be a list")
            wanted[kind] = {}
            for i, entry in enumerate(entries):
                if not isinstance(entry, dict):
                    raise DefinitionsError(f"definitions: {kind}[{i}] must be an object")
                entry = dict(entry)
                normalise_entry(entry, ENTITIES[kind], f"definitions: {kind}[{i}]")
                encoded = _encoded(kind, entry)
                wanted[kind][_key(kind, encoded)] = _text(encoded)
        extras = None
        if kinds == KINDS:
            extras = {k: v for k, v in document.items() if k not in ENTITIES and k not in (FORMAT_KEY, LOG_KEY)}
            extras_text = _text(extras)
        records = []
        for kind in kinds:
            for key in [key for key in self._entries[kind] if key not in wanted[kind]]:
                if key in self._entries[kind]:  # not already gone with something it depended on
                    records.append(f'{{"op":"{REMOVE}","kind":"{kind}","entry":{_text(_key_entry(kind, key))}}}')
                    self._discard(kind, key)
        for kind in kinds:
            current = self._entries[kind]
            for key, text in wanted[kind].items():
                if current.get(key) != text:
                    self._store(kind, json.loads(text), text)
                    records.append(f'{{"op":"{PUT}","kind":"{kind}","entry":{text}}}')
        if extras is not None and extras != self._extras:
            self._extras = json.loads(extras_text)
            records.append(f'{{"op":"{EXTRAS}","entry":{extras_text}}}')
        return records

    def apply(self, record: Any) -> None:
        """Replay one parsed log record; DefinitionsError if it is not a record."""
        if isinstance(record, dict) and record.get("op") == EXTRAS and isinstance(record.get("entry"), dict):
            self._extras = record["entry"]
            return
        if not isinstance(record, dict) or record.get("kind") not in ENTITIES or not isinstance(record.get("entry"), dict):
            raise DefinitionsError(f"not a definitions record: {record!r}")
        kind, entry = record["kind"], record["entry"]
        try:
            if record.get("op") == PUT:
                normalise_entry(entry, ENTITIES[kind], f"{kind} record")
                self._store(kind, entry)
            elif record.get("op") == REMOVE:
                self._discard(kind, _key(kind, entry))
            else:
                raise DefinitionsError(f"unknown definitions record op {record.get('op')!r}")
        except (KeyError, TypeError) as err:
            raise DefinitionsError(f"malformed definitions record {record!r}: {err!r}") from None

    # -- snapshots ---------------------------------------------------------------------

    def snapshot(self) -> "TableSnapshot":
        """A copy to serialise later (in a worker thread): later changes do not show in it."""
        return TableSnapshot(dict(self._extras), {kind: list(entries.values()) for kind, entries in self._entries.items()})

    # -- internals ---------------------------------------------------------------------

    def _store(self, kind: str, encoded: dict[str, Any], text: str | None = None) -> None:
        key = _key(kind, encoded)
        self._entries[kind][key] = text if text is not None else _text(encoded)
        if kind == "bindings":
            for end in _binding_ends(encoded):
                self._binding_ends.setdefault(end, set()).add(key)

    def _discard(self, kind: str, key: Key) -> None:
        text = self._entries[kind].pop(key, None)
        if text is None:
            return
        if kind == "bindings":
            for end in _binding_ends(json.loads(text)):
                keys = self._binding_ends.get(end)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del self._binding_ends[end]
        elif kind == "queues":
            self._discard_bindings((key[0], "queue", key[1]))
        elif kind == "users":
            self._entries["user_limits"].pop(key, None)
        elif kind == "exchanges":
            self._discard_bindings((key[0], "exchange", key[1]))
            self._discard_bindings((key[0], "source", key[1]))
        elif kind == "vhosts":
            vhost = key[0]
            for dependent in ("bindings", "queues", "exchanges", "permissions", "policies", "operator_policies",
                              "vhost_limits", "runtime_parameters"):
                entries = self._entries[dependent]
                vhost_at = KEY_FIELDS[dependent].index("vhost")
                for dependent_key in [k for k in entries if k[vhost_at] == vhost]:
                    self._discard(dependent, dependent_key)

    def _discard_bindings(self, end: tuple[str, str, str]) -> None:
        for key in list(self._binding_ends.get(end, ())):
            self._discard("bindings", key)


class TableSnapshot:
    """A frozen copy of a DefinitionTable's texts, serialised to a definitions.json document."""

    __slots__ = ("extras", "texts")

    def __init__(self, extras: dict[str, Any], texts: dict[str, list[str]]) -> None:
        self.extras = extras
        self.texts = texts

    def document_bytes(self, format_version: int, log_generation: int) -> bytes:
        """The snapshot as the JSON document definitions.json holds (one entry per line)."""
        parts = [f'{{\n"{FORMAT_KEY}": {format_version},\n"{LOG_KEY}": {log_generation}']
        for key, value in sorted(self.extras.items()):
            parts.append(f",\n{json.dumps(key)}: {_text(value)}")
        for kind in KINDS:
            texts = self.texts[kind]
            parts.append(f',\n"{kind}": [\n' + ",\n".join(texts) + "\n]" if texts else f',\n"{kind}": []')
        parts.append("\n}\n")
        return "".join(parts).encode("utf-8")


def _key_entry(kind: str, key: Key) -> dict[str, Any]:
    entry = dict(zip(KEY_FIELDS[kind], key))
    if kind == "bindings":
        entry["arguments"] = json.loads(entry["arguments"])
    return entry


def _encoded(kind: str, entry: dict[str, Any]) -> dict[str, Any]:
    if kind not in WITH_ARGUMENTS:
        return entry
    return {**entry, "arguments": encode_value(entry["arguments"])}


def _binding_ends(encoded: dict[str, Any]) -> tuple[tuple[str, str, str], tuple[str, str, str]]:
    vhost = encoded["vhost"]
    return (vhost, "source", encoded["source"]), (vhost, encoded["destination_type"], encoded["destination"])
