"""Definitions export and import for the management API (GET/POST /api/definitions[/{vhost}]).

The export has users, vhosts and permissions and every exchange, queue and binding except the
predeclared amq.* exchanges and exclusive queues, durable or not
(definitions_export.topology_definitions), as RabbitMQ 3.10 exports them, with the version
fields and the empty sections RabbitMQ writes, so a RabbitMQ import reads it. Import applies a RabbitMQ export in order:
users (existing users get the new hash and tags), vhosts, permissions, exchanges, queues,
bindings; anything the broker refuses stops the import with 400. Policies, parameters and
topic permissions are accepted and ignored (the broker has none).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from amqp_server.auth import HASHING_ALGORITHM, hash_password, is_valid_password_hash
from amqp_server.definitions_export import topology_definitions
from amqp_server.errors import AMQPError
from amqp_server.management import api_errors
from amqp_server.management.http_io import as_bool, as_table
from amqp_server.management.node_json import permission_json, user_json
from amqp_server.metrics import identity

if TYPE_CHECKING:
    from amqp_server.broker import Broker
    from amqp_server.vhost import VirtualHost

log = logging.getLogger(__name__)

_VERSION_FIELDS = {
    "rabbit_version": identity.RABBITMQ_COMPATIBLE_VERSION,
    "rabbitmq_version": identity.RABBITMQ_COMPATIBLE_VERSION,
    "product_name": identity.PRODUCT_NAME,
    "product_version": identity.PRODUCT_VERSION,
}


def export_definitions(broker: "Broker") -> dict[str, Any]:
    topology: dict[str, list[dict[str, Any]]] = {"queues": [], "exchanges": [], "bindings": []}
    for vhost in broker.vhosts.values():
        for key, entries in topology_definitions(vhost, durable_only=False).items():
            topology[key].extend(entries)
    return {
        **_VERSION_FIELDS,
        "users": [user_json(user) for user in broker.access.users()],
        # RabbitMQ 3.10 exports a vhost as its name alone (description and tags are not exported).
        "vhosts": [{"name": name} for name in broker.vhosts],
        "permissions": [permission_json(permission) for permission in broker.access.permissions()],
        "topic_permissions": [],
        "parameters": [],
        "global_parameters": [],
        "policies": [],
        "queues": topology["queues"],
        "exchanges": topology["exchanges"],
        "bindings": topology["bindings"],
    }


def export_vhost_definitions(broker: "Broker", vhost: "VirtualHost") -> dict[str, Any]:
    """One vhost's exchanges, queues and bindings, without "vhost" fields (RabbitMQ's shape)."""
    topology = topology_definitions(vhost, durable_only=False)

    def strip(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{key: value for key, value in entry.items() if key != "vhost"} for entry in entries]

    return {
        **_VERSION_FIELDS,
        "parameters": [],
        "policies": [],
        "queues": strip(topology["queues"]),
        "exchanges": strip(topology["exchanges"]),
        "bindings": strip(topology["bindings"]),
    }


def import_definitions(broker: "Broker", document: dict[str, Any], only_vhost: str | None = None) -> None:
    """Apply `document`; with `only_vhost`, its topology goes into that vhost (vhost fields ignored)."""
    try:
        if only_vhost is None:
            _import_users(broker, _entries(document, "users"))
            for entry in _entries(document, "vhosts"):
                name = _text(entry, "name")
                broker.add_vhost(name)
                # As RabbitMQ 3.10: an entry replaces the vhost's description and tags, even with none.
                broker.set_vhost_metadata(name, *vhost_metadata_of(entry))
            _import_permissions(broker, _entries(document, "permissions"))
        _import_topology(broker, document, only_vhost)
    except AMQPError as error:
        raise api_errors.from_amqp_error(error) from None
    finally:
        broker.save_definitions()


def _entries(document: dict[str, Any], key: str) -> list[dict[str, Any]]:
    entries = document.get(key) or []
    if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
        raise api_errors.bad_request(f"'{key}' must be a list of objects")
    return entries


def _text(entry: dict[str, Any], key: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str):
        raise api_errors.bad_request(f"missing or invalid '{key}' in {entry}")
    return value


def vhost_metadata_of(entry: dict[str, Any]) -> tuple[str, list[str]]:
    """A vhost's description and tags from a PUT body or a definitions entry: top-level
    "description"/"tags" (RabbitMQ 3.10's API) or inside "metadata" (3.11+ exports)."""
    metadata = entry.get("metadata") if isinstance(entry.get("metadata"), dict) else {}
    description = entry.get("description", metadata.get("description"))
    tags = entry.get("tags", metadata.get("tags"))
    return ("" if description is None else str(description)), user_tags(tags)


def user_tags(value: Any) -> list[str]:
    """Tags as a list; older exports (and rabbitmqadmin) write them comma-separated."""
    if value is None:
        return []
    if isinstance(value, str):
        return [tag.strip() for tag in value.split(",") if tag.strip()]
    if isinstance(value, list) and all(isinstance(tag, str) for tag in value):
        return list(value)
    raise api_errors.bad_request(f"tags must be a list or a comma-separated string, got {value!r}")


def password_hash_of(entry: dict[str, Any]) -> str:
    """The stored hash for a user entry with `password` or `password_hash` (400 otherwise)."""
    if "password" in entry:
        return hash_password(str(entry["password"]))
    algorithm = entry.get("hashing_algorithm") or HASHING_ALGORITHM
    if algorithm != HASHING_ALGORITHM:
        raise api_errors.bad_request(f"hashing algorithm {algorithm} is not supported (only {HASHING_ALGORITHM})")
    password_hash = entry.get("password_hash")
    if password_hash == "":
        return ""  # RabbitMQ: a user without a password, who cannot log in with one
    if not isinstance(password_hash, str) or not is_valid_password_hash(password_hash):
        raise api_errors.bad_request("password_hash is not a valid rabbit_password_hashing_sha256 hash")
    return password_hash


def set_user(broker: "Broker", name: str, password_hash: str, tags: list[str]) -> bool:
    """Create the user or replace its hash and tags; True if it was created."""
    return broker.access.set_user(name, password_hash, tags)


def _import_users(broker: "Broker", entries: list[dict[str, Any]]) -> None:
    for entry in entries:
        set_user(broker, _text(entry, "name"), password_hash_of(entry), user_tags(entry.get("tags")))


def _import_permissions(broker: "Broker", entries: list[dict[str, Any]]) -> None:
    for entry in entries:
        user, vhost = _text(entry, "user"), _text(entry, "vhost")
        if broker.access.user(user) is None or vhost not in broker.vhosts:
            raise api_errors.bad_request(f"permissions for unknown user {user!r} or vhost {vhost!r}")
        try:
            broker.access.set_permissions(user, vhost, *(_text(entry, kind) for kind in ("configure", "write", "read")))
        except ValueError as error:
            raise api_errors.bad_request(str(error)) from None


def _vhost_for(broker: "Broker", entry: dict[str, Any], only_vhost: str | None) -> "VirtualHost":
    name = only_vhost if only_vhost is not None else _text(entry, "vhost")
    vhost = broker.vhosts.get(name)
    if vhost is None:
        raise api_errors.bad_request(f"vhost '{name}' does not exist")
    return vhost


def _import_topology(broker: "Broker", document: dict[str, Any], only_vhost: str | None) -> None:
    for entry in _entries(document, "exchanges"):
        vhost = _vhost_for(broker, entry, only_vhost)
        vhost.declare_exchange(
            _text(entry, "name"), _text(entry, "type"),
            durable=as_bool(entry.get("durable"), True), auto_delete=as_bool(entry.get("auto_delete")),
            internal=as_bool(entry.get("internal")), arguments=as_table(entry.get("arguments")),
        )
    for entry in _entries(document, "queues"):
        vhost = _vhost_for(broker, entry, only_vhost)
        if _text(entry, "name").startswith("amq."):
            # RabbitMQ 3.10 answers 204 and creates no queue with a reserved name (amq.gen-…).
            log.info("definitions import: skipped queue '%s' with a reserved name", _text(entry, "name"))
            continue
        _queue, created = vhost.declare_queue(
            _text(entry, "name"), connection=None, durable=as_bool(entry.get("durable"), True),
            auto_delete=as_bool(entry.get("auto_delete")), arguments=as_table(entry.get("arguments")),
        )
        broker.stats.queues_declared += 1
        broker.stats.queues_created += created
    for entry in _entries(document, "bindings"):
        vhost = _vhost_for(broker, entry, only_vhost)
        source = vhost.exchanges.get(_text(entry, "source"))
        if source is None:
            raise api_errors.bad_request(f"binding from missing exchange {entry.get('source')!r}")
        pool = vhost.exchanges if entry.get("destination_type", "queue") == "exchange" else vhost.queues
        destination = pool.get(_text(entry, "destination"))
        if destination is None:
            raise api_errors.bad_request(f"binding to missing destination {entry.get('destination')!r}")
        vhost.bind(source, destination, str(entry.get("routing_key", "")), as_table(entry.get("arguments")))
