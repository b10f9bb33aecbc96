"""Definitions export for the management API (GET /api/definitions[/{vhost}]), and the entry
readers the import (definitions_import.py) and the user and vhost routes share.

The export has users (with their limits), vhosts and permissions, policies, operator policies
and vhost limits (as RabbitMQ's "parameters" of components operator_policy and vhost-limits),
the runtime parameters (shovels, federation upstreams: "parameters" too),
and every exchange, queue and binding except the predeclared amq.* exchanges and exclusive
queues, durable or not (definitions_export.topology_definitions), as RabbitMQ 3.10 exports
them, with the version fields and the empty sections RabbitMQ writes, so a RabbitMQ import
reads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from amqp_server.config.auth import HASHING_ALGORITHM, hash_password, is_valid_password_hash
from amqp_server.broker.definitions_export import topology_definitions
from amqp_server.management import api_errors
from amqp_server.management.node_json import permission_json, user_json
from amqp_server.metrics import identity

if TYPE_CHECKING:
    from amqp_server.broker.broker import Broker
    from amqp_server.broker.vhost import VirtualHost

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
    user_limits = broker.user_limits()
    return {
        **_VERSION_FIELDS,
        "users": [user_json(user, user_limits.get(user.name)) for user in broker.access.users()],
        # RabbitMQ 3.10 exports a vhost as its name alone (description and tags are not exported).
        "vhosts": [{"name": name} for name in broker.vhosts],
        "permissions": [permission_json(permission) for permission in broker.access.permissions()],
        "topic_permissions": [],
        "parameters": [entry for vhost in broker.vhosts.values() for entry in _parameters(broker, vhost)],
        "global_parameters": [],
        "policies": [policy.as_json() for vhost in broker.vhosts.values() for policy in vhost.policies],
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
        "parameters": strip(_parameters(broker, vhost)),
        "policies": strip([policy.as_json() for policy in vhost.policies]),
        "queues": strip(topology["queues"]),
        "exchanges": strip(topology["exchanges"]),
        "bindings": strip(topology["bindings"]),
    }


def _parameters(broker: "Broker", vhost: "VirtualHost") -> list[dict[str, Any]]:
    """A vhost's operator policies, limits and runtime parameters as RabbitMQ exports them."""
    parameters = [
        {"value": {key: value for key, value in policy.as_json().items() if key not in ("vhost", "name")},
         "vhost": vhost.name, "component": "operator_policy", "name": policy.name}
        for policy in vhost.operator_policies
    ]
    if vhost.limits.as_value():
        parameters.append({"value": vhost.limits.as_value(), "vhost": vhost.name, "component": "vhost-limits",
                           "name": "limits"})
    parameters.extend(parameter.as_json() for parameter in broker.parameters.matching(vhost=vhost.name))
    return parameters


def vhost_metadata_of(entry: dict[str, Any]) -> tuple[str, list[str]]:
    """A vhost's description and tags from a PUT body or a definitions entry: top-level
    "description"/"tags" (RabbitMQ 3.10's API) or inside "metadata" (3.11+ exports)."""
    metadata = entry.get("metadata")
    if not isinstance(metadata, dict):
        metadata = {}
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
