"""The definitions store keeps RabbitMQ's export shape and survives restarts and crashes."""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path

import pytest

from persistence.atomic_file import write_atomically
from persistence.definitions import (
    DefinitionsError,
    DefinitionStore,
    FileDefinitionStore,
    MemoryDefinitionStore,
    empty_definitions,
)

# Trimmed from `rabbitmqctl export_definitions` on RabbitMQ 3.10.8, plus one of each entity.
RABBITMQ_EXPORT = {
    "rabbit_version": "3.10.8",
    "rabbitmq_version": "3.10.8",
    "users": [
        {
            "name": "hashcheck",
            "password_hash": "Sq1v7NDvP6o5CX8uSgsKc8mSZ92Tma5g4XCDohtxFsXTf5Xz",
            "hashing_algorithm": "rabbit_password_hashing_sha256",
            "tags": [],
            "limits": {},
        }
    ],
    "vhosts": [{"name": "/", "limits": [], "metadata": {"description": "Default virtual host", "tags": []}}],
    "permissions": [{"user": "hashcheck", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}],
    "topic_permissions": [],
    "parameters": [],
    "global_parameters": [],
    "policies": [],
    "queues": [{"name": "orders", "vhost": "/", "durable": True, "auto_delete": False,
                "arguments": {"x-queue-type": "classic", "x-max-length": 10}}],
    "exchanges": [{"name": "events", "vhost": "/", "type": "topic", "durable": True, "auto_delete": False,
                   "internal": False, "arguments": {}}],
    "bindings": [{"source": "events", "vhost": "/", "destination": "orders", "destination_type": "queue",
                  "routing_key": "order.*", "arguments": {}}],
}


@pytest.fixture(params=["file", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> DefinitionStore:
    return FileDefinitionStore(tmp_path) if request.param == "file" else MemoryDefinitionStore()


def test_nothing_saved_loads_empty(store: DefinitionStore) -> None:
    definitions = store.load()
    assert definitions == empty_definitions()
    assert definitions["amqp_server_format"] == 4
    for key in ("users", "vhosts", "permissions", "queues", "exchanges", "bindings", "policies",
                "operator_policies", "vhost_limits", "user_limits", "runtime_parameters"):
        assert definitions[key] == []


def test_rabbitmq_export_round_trips(store: DefinitionStore) -> None:
    store.save(RABBITMQ_EXPORT)
    loaded = store.load()
    # "policies" is a kind of the store's own; operator policies and limits come back empty.
    assert loaded == {**RABBITMQ_EXPORT, "amqp_server_format": 4, "operator_policies": [], "vhost_limits": [],
                      "user_limits": [], "runtime_parameters": []}


def test_save_does_not_mutate_the_callers_dict(store: DefinitionStore) -> None:
    definitions = {"queues": [{"name": "q", "vhost": "/", "arguments": {"x": b"\x00"}}]}
    store.save(definitions)
    assert definitions == {"queues": [{"name": "q", "vhost": "/", "arguments": {"x": b"\x00"}}]}


def test_missing_optional_fields_get_rabbitmq_defaults(store: DefinitionStore) -> None:
    store.save({
        "queues": [{"name": "q", "vhost": "/"}],
        "exchanges": [{"name": "e", "vhost": "/", "type": "direct"}],
        "bindings": [{"source": "e", "vhost": "/", "destination": "q", "destination_type": "queue"}],
        "users": [{"name": "u", "password_hash": "", "tags": "administrator,monitoring"}],
    })
    loaded = store.load()
    assert loaded["queues"] == [{"name": "q", "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}}]
    assert loaded["exchanges"][0] == {"name": "e", "vhost": "/", "type": "direct", "durable": True,
                                           "auto_delete": False, "internal": False, "arguments": {}}
    assert loaded["bindings"][0]["routing_key"] == ""
    assert loaded["users"][0]["tags"] == ["administrator", "monitoring"]
    assert loaded["users"][0]["hashing_algorithm"] == "rabbit_password_hashing_sha256"


def test_amqp_argument_values_json_cannot_hold_round_trip(store: DefinitionStore) -> None:
    arguments = {
        "bytes": b"\x00\xff raw",
        "decimal": Decimal("12.50"),
        "timestamp": datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc),
        "infinite": float("inf"),
        "negative_infinite": float("-inf"),
        "nested": {"list": [b"a", Decimal("-1"), {"deep": b"b"}], "plain": 1.5, "none": None, "flag": True},
        "looks_tagged": {"$amqp": "bytes", "value": "not really"},
        "int": 2**40,
    }
    store.save({"queues": [{"name": "q", "vhost": "/", "arguments": arguments}],
                "bindings": [{"source": "e", "vhost": "/", "destination": "q", "destination_type": "queue",
                              "arguments": {"x-match": "all", "k": b"v"}}]})
    loaded = store.load()
    assert loaded["queues"][0]["arguments"] == arguments
    assert loaded["bindings"][0]["arguments"] == {"x-match": "all", "k": b"v"}


def test_file_is_plain_rabbitmq_shaped_json(tmp_path: Path) -> None:
    store = FileDefinitionStore(tmp_path)
    store.save({"queues": [{"name": "q", "vhost": "/", "arguments": {"x-max-length": 5, "k": b"hi"}}]})
    store.close()
    FileDefinitionStore(tmp_path).load()  # opening folds the change log into the snapshot
    document = json.loads((tmp_path / "definitions.json").read_text())
    assert document["amqp_server_format"] == 4
    assert document["queues"][0]["arguments"] == {"x-max-length": 5, "k": {"$amqp": "bytes", "value": "aGk="}}


def test_file_store_creates_the_data_dir(tmp_path: Path) -> None:
    store = FileDefinitionStore(tmp_path / "new" / "dir")
    store.save({"vhosts": [{"name": "/"}]})
    assert FileDefinitionStore(tmp_path / "new" / "dir").load()["vhosts"] == [{"name": "/"}]


def test_file_survives_a_new_store_instance(tmp_path: Path) -> None:
    FileDefinitionStore(tmp_path).save(RABBITMQ_EXPORT)
    assert FileDefinitionStore(tmp_path).load()["queues"][0]["name"] == "orders"


def test_file_holding_password_hashes_is_private(tmp_path: Path) -> None:
    FileDefinitionStore(tmp_path).save(RABBITMQ_EXPORT)
    assert (tmp_path / "definitions.json").stat().st_mode & 0o077 == 0


def test_export_written_by_rabbitmq_loads(tmp_path: Path) -> None:
    # A RabbitMQ export has no amqp_server_format key.
    (tmp_path / "definitions.json").write_text(json.dumps(RABBITMQ_EXPORT))
    loaded = FileDefinitionStore(tmp_path).load()
    assert loaded["users"][0]["name"] == "hashcheck"
    assert loaded["policies"] == []


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "not valid JSON"),
        (b'{"queues": [', "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[]", "expected a JSON object"),
        (b'{"queues": {}}', "queues must be a list"),
        (b'{"queues": [{"vhost": "/"}]}', "queues[0] is missing 'name'"),
        (b'{"queues": [{"name": "q", "vhost": "/", "durable": "yes"}]}', "queues[0] durable must be a bool"),
        (b'{"bindings": [{"source": "", "vhost": "/", "destination": "q", "destination_type": "topic"}]}',
         "destination_type must be 'queue' or 'exchange'"),
        (b'{"queues": [{"name": "q", "vhost": "/", "arguments": {"a": {"$amqp": "bytes", "value": "!!"}}}]}',
         "queues[0] arguments: malformed tagged value"),
        (b'{"queues": [{"name": "q", "vhost": "/", "arguments": {"a": {"$amqp": "nope", "value": ""}}}]}',
         "malformed tagged value"),
        (b'{"amqp_server_format": 5}', "newer amqp-server"),
    ],
)
def test_corrupt_file_raises_error_naming_the_file(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "definitions.json"
    path.write_bytes(content)
    with pytest.raises(DefinitionsError) as info:
        FileDefinitionStore(tmp_path).load()
    assert str(info.value).startswith(str(path))
    assert message in str(info.value)


def test_unserialisable_value_is_refused_before_writing(tmp_path: Path) -> None:
    store = FileDefinitionStore(tmp_path)
    store.save({"vhosts": [{"name": "/"}]})
    with pytest.raises(DefinitionsError, match="cannot be written as JSON"):
        store.save({"queues": [{"name": "q", "vhost": "/", "arguments": {"x": object()}}]})
    assert store.load()["vhosts"] == [{"name": "/"}]  # the previous snapshot is intact


def test_memory_store_catches_invalid_definitions_too() -> None:
    with pytest.raises(DefinitionsError, match="missing 'vhost'"):
        MemoryDefinitionStore().save({"queues": [{"name": "q"}]})


def test_load_returns_independent_copies(store: DefinitionStore) -> None:
    store.save(RABBITMQ_EXPORT)
    first = store.load()
    first["queues"].clear()
    assert store.load()["queues"] != []


# ---- write_atomically ----

def test_write_atomically_replaces_content_and_leaves_no_temp_files(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    write_atomically(path, b"old")
    write_atomically(path, b"new")
    assert path.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["f.json"]


def test_write_atomically_failure_keeps_old_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "f.json"
    write_atomically(path, b"old")

    def crash(*args: object) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk on fire"):
        write_atomically(path, b"new")
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["f.json"]


def test_write_atomically_needs_an_existing_directory(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_atomically(tmp_path / "missing" / "f", b"x")
