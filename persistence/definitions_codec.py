"""The definitions document: its JSON shape, validation, and the encoding of AMQP values.

Shape: RabbitMQ's definitions export JSON (``rabbitmqctl export_definitions``)::

    {"amqp_server_format": 2,
     "users":       [{"name", "password_hash", "hashing_algorithm", "tags": [...]}],
     "vhosts":      [{"name", "description", "tags": [...]}],   (description and tags only if set)
     "permissions": [{"user", "vhost", "configure", "write", "read"}],
     "queues":      [{"name", "vhost", "durable", "auto_delete", "arguments"}],
     "exchanges":   [{"name", "vhost", "type", "durable", "auto_delete", "internal", "arguments"}],
     "bindings":    [{"source", "vhost", "destination", "destination_type", "routing_key", "arguments"}],
     "policies":    [{"vhost", "name", "pattern", "apply-to", "definition", "priority"}],
     "operator_policies": [the same shape],                      (format 3)
     "vhost_limits": [{"vhost", "value": {"max-connections": N, "max-queues": N}}],
     "user_limits": [{"user", "value": {"max-connections": N, "max-channels": N}}],
     "runtime_parameters": [{"vhost", "component", "name", "value": any JSON}]}   (format 4)

Loading fills omitted optional fields with RabbitMQ's defaults, turns a
comma-separated ``tags`` string (older RabbitMQ exports) into a list, and
keeps any other keys (policies, parameters, rabbit_version, an entry's
"limits" ...) untouched, so a RabbitMQ export loads as is. A file without
"amqp_server_format" is taken as a RabbitMQ export. Format 1 is a whole
definitions.json rewritten on every change; format 2 is the same document
as a snapshot followed by change logs (persistence/definitions.py,
docs/durability.md); format 3 adds policies, operator policies and vhost
and user limits (an older broker would refuse their records rather than
drop them); format 4 adds runtime parameters (RabbitMQ's per-vhost (component, name) ->
value store: shovels, federation upstreams). All four are read; format 4 is written.

AMQP argument values that JSON cannot hold are written in a tagged form,
an object whose only keys are "$amqp" and "value":

    bytes               {"$amqp": "bytes",     "value": "<base64>"}
    decimal.Decimal     {"$amqp": "decimal",   "value": "12.50"}
    datetime.datetime   {"$amqp": "timestamp", "value": "2024-01-01T00:00:00+00:00"}  (ISO 8601)
    NaN / +-infinity    {"$amqp": "float",     "value": "nan" | "inf" | "-inf"}
    a table that itself has a "$amqp" key
                        {"$amqp": "table",     "value": {...}}

Tags are applied at any depth inside the "arguments" of queues, exchanges
and bindings, and decoded back to the Python values on load. Tuples come
back as lists.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import math
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any, Callable

Definitions = dict[str, Any]

FORMAT_VERSION = 4  # written; 1 (a lone definitions.json), 2 (no policies or limits) and 3 (no runtime
# parameters) are still read
FORMAT_KEY = "amqp_server_format"
HASHING_ALGORITHM = "rabbit_password_hashing_sha256"
_TAG = "$amqp"


class DefinitionsError(ValueError):
    """Stored definitions are unreadable or malformed; the message names the source."""


def empty_definitions() -> Definitions:
    definitions: Definitions = {key: [] for key in ENTITIES}
    definitions[FORMAT_KEY] = FORMAT_VERSION
    return definitions


def decode_definitions(data: bytes, source: str = "definitions") -> Definitions:
    """Parse and validate serialised definitions; raises DefinitionsError naming ``source``."""
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DefinitionsError(f"{source}: corrupt definitions file, not valid JSON: {err}") from err
    if not isinstance(document, dict):
        raise DefinitionsError(f"{source}: corrupt definitions file, expected a JSON object")
    version = document.get(FORMAT_KEY, FORMAT_VERSION)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise DefinitionsError(f"{source}: {FORMAT_KEY} must be a positive integer, got {version!r}")
    if version > FORMAT_VERSION:
        raise DefinitionsError(
            f"{source}: written in format {version} by a newer amqp-server; this one reads format {FORMAT_VERSION}"
        )
    document = _normalise(document, source)
    for key in WITH_ARGUMENTS:
        for i, entry in enumerate(document[key]):
            try:
                entry["arguments"] = decode_value(entry["arguments"])
            except ValueError as err:
                raise DefinitionsError(f"{source}: {key}[{i}] arguments: {err}") from err
    document[FORMAT_KEY] = FORMAT_VERSION
    return document


# ---- shape: required fields and RabbitMQ's defaults for optional ones ----

_REQUIRED = object()
_REQUIRED_ANY_JSON = object()  # required, and any JSON value (a runtime parameter's value)

ENTITIES: dict[str, dict[str, Any]] = {
    "users": {"name": _REQUIRED, "password_hash": "", "hashing_algorithm": HASHING_ALGORITHM, "tags": []},
    "vhosts": {"name": _REQUIRED},
    "permissions": {"user": _REQUIRED, "vhost": _REQUIRED, "configure": _REQUIRED, "write": _REQUIRED,
                    "read": _REQUIRED},
    "queues": {"name": _REQUIRED, "vhost": _REQUIRED, "durable": True, "auto_delete": False, "arguments": {}},
    "exchanges": {"name": _REQUIRED, "vhost": _REQUIRED, "type": _REQUIRED, "durable": True,
                  "auto_delete": False, "internal": False, "arguments": {}},
    "bindings": {"source": _REQUIRED, "vhost": _REQUIRED, "destination": _REQUIRED,
                 "destination_type": _REQUIRED, "routing_key": "", "arguments": {}},
    "policies": {"vhost": _REQUIRED, "name": _REQUIRED, "pattern": _REQUIRED, "apply-to": "all",
                 "definition": _REQUIRED, "priority": 0},
    "operator_policies": {"vhost": _REQUIRED, "name": _REQUIRED, "pattern": _REQUIRED, "apply-to": "all",
                          "definition": _REQUIRED, "priority": 0},
    "vhost_limits": {"vhost": _REQUIRED, "value": _REQUIRED},
    "user_limits": {"user": _REQUIRED, "value": _REQUIRED},
    "runtime_parameters": {"vhost": _REQUIRED, "component": _REQUIRED, "name": _REQUIRED,
                           "value": _REQUIRED_ANY_JSON},
}
WITH_ARGUMENTS = ("queues", "exchanges", "bindings")
_TYPES: dict[str, type | tuple[type, ...]] = {
    "durable": bool, "auto_delete": bool, "internal": bool, "arguments": dict, "tags": list,
    "definition": dict, "priority": (int, float), "value": dict,  # a policy's priority: any number, as RabbitMQ
}


def _normalise(document: Definitions, source: str) -> Definitions:
    if not isinstance(document, dict):
        raise DefinitionsError(f"{source}: definitions must be a JSON object / dict")
    for key, fields in ENTITIES.items():
        entries = document.setdefault(key, [])
        if not isinstance(entries, list):
            raise DefinitionsError(f"{source}: {key} must be a list")
        for i, entry in enumerate(entries):
            normalise_entry(entry, fields, f"{source}: {key}[{i}]")
    for i, binding in enumerate(document["bindings"]):
        if binding["destination_type"] not in ("queue", "exchange"):
            raise DefinitionsError(
                f"{source}: bindings[{i}] destination_type must be 'queue' or 'exchange', "
                f"got {binding['destination_type']!r}"
            )
    return document


def normalise_entry(entry: Any, fields: dict[str, Any], where: str) -> None:
    if not isinstance(entry, dict):
        raise DefinitionsError(f"{where} must be an object")
    if isinstance(entry.get("tags"), str):  # RabbitMQ < 3.9 exports: "administrator,monitoring"
        entry["tags"] = [t for t in entry["tags"].split(",") if t]
    for name, default in fields.items():
        if name not in entry:
            if default is _REQUIRED or default is _REQUIRED_ANY_JSON:
                raise DefinitionsError(f"{where} is missing {name!r}")
            entry[name] = copy.deepcopy(default)
        if default is _REQUIRED_ANY_JSON:
            continue
        expected = _TYPES.get(name, str)
        value = entry[name]
        if not isinstance(value, expected) or (expected is not bool and isinstance(value, bool)):
            expected_name = expected.__name__ if isinstance(expected, type) else "value"
            raise DefinitionsError(f"{where} {name} must be a {expected_name}, got {type(value).__name__}")


# ---- tagged encoding of AMQP values ----

def encode_value(value: Any) -> Any:
    if isinstance(value, dict):
        table = {str(k): encode_value(v) for k, v in value.items()}
        return {_TAG: "table", "value": table} if _TAG in table else table
    if isinstance(value, (list, tuple)):
        return [encode_value(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {_TAG: "bytes", "value": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, Decimal):
        return {_TAG: "decimal", "value": str(value)}
    if isinstance(value, datetime):
        return {_TAG: "timestamp", "value": value.isoformat()}
    if isinstance(value, float) and not math.isfinite(value):
        return {_TAG: "float", "value": repr(value)}
    return value


def decode_value(value: Any) -> Any:
    if isinstance(value, list):
        return [decode_value(v) for v in value]
    if not isinstance(value, dict):
        return value
    if _TAG not in value:
        return {k: decode_value(v) for k, v in value.items()}
    if set(value) != {_TAG, "value"} or value[_TAG] not in _DECODERS:
        raise ValueError(f"malformed tagged value {value!r}")
    if value[_TAG] == "table":
        if not isinstance(value["value"], dict):
            raise ValueError(f"malformed tagged table {value!r}")
        return {k: decode_value(v) for k, v in value["value"].items()}
    if not isinstance(value["value"], str):
        raise ValueError(f"malformed tagged value {value!r}")
    try:
        return _DECODERS[value[_TAG]](value["value"])
    except (binascii.Error, InvalidOperation, ValueError) as err:
        raise ValueError(f"malformed tagged value {value!r}: {err}") from err


def _decode_float(text: str) -> float:
    if text not in ("nan", "inf", "-inf"):
        raise ValueError("expected nan, inf or -inf")
    return float(text)


_DECODERS: dict[str, Callable[[str], Any]] = {
    "bytes": lambda text: base64.b64decode(text, validate=True),
    "decimal": Decimal,
    "timestamp": datetime.fromisoformat,
    "float": _decode_float,
    "table": lambda text: text,  # handled before dispatch
}
