"""Importing a RabbitMQ definitions file: POST /api/definitions[/{vhost}] and `--definitions` at boot.

Like RabbitMQ's load_definitions, an import brings users (with their limits), vhosts (with
their limits), permissions, policies, operator policies, exchanges, queues, bindings and the
runtime parameters of the components this broker has (shovels, federation upstreams and
upstream sets), and importing the same file twice changes nothing. It runs in two passes:

1. check: every entry is read and checked against the broker as it is and the rest of the file,
   changing nothing. A malformed entry, or one RabbitMQ itself would refuse (an invalid queue
   argument, an inequivalent redeclaration), refuses the whole import with 400;
2. apply, in RabbitMQ's order.

What this broker cannot honour (a stream queue, an exchange type it lacks, a mirroring
policy, topic permissions, parameters of a component it lacks or that its component refuses,
such as an AMQP 1.0 shovel) is not applied, whole,
together with the bindings that need it, and named in the answer's "not_applied" list and in
one log line; nothing is silently dropped and nothing is half-applied.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from amqp_server.wire import errors
from amqp_server.wire.errors import AMQPError
from amqp_server.management import api_errors
from amqp_server.management.definitions_transfer import password_hash_of, set_user, user_tags, vhost_metadata_of
from amqp_server.management.http_io import as_bool, as_table
from amqp_server.broker.policies import Policy, parse_policy
from amqp_server.broker.runtime_parameters import ParameterError
from amqp_server.config.limit_definitions import USER_LIMITS, VHOST_LIMITS, LimitError, check_limits
from exchanges.registry import EXCHANGE_TYPES
from queues.arguments import InvalidArgument, QueueArguments, equivalence
from queues.arguments.equivalence import Inequivalent
from queues.arguments.policy_keys import PolicyError

if TYPE_CHECKING:
    from amqp_server.broker.broker import Broker

log = logging.getLogger(__name__)

OPERATOR_POLICY_COMPONENT = "operator_policy"
VHOST_LIMITS_COMPONENT = "vhost-limits"
# Global parameters RabbitMQ writes for itself; they mean nothing to another broker.
_INTERNAL_GLOBAL_PARAMETERS = frozenset({"internal_cluster_id"})


@dataclass
class _Plan:
    """What pass 1 found: the entries to apply, and what will not be applied and why."""

    users: list[tuple[str, str, list[str], dict[str, int] | None]] = field(default_factory=list)
    # (name, (description, tags) or None to leave them, limits or None to leave them)
    vhosts: list[tuple[str, tuple[str, list[str]] | None, dict[str, int] | None]] = field(default_factory=list)
    permissions: list[tuple[str, str, str, str, str]] = field(default_factory=list)
    policies: list[tuple[Policy, bool]] = field(default_factory=list)
    exchanges: list[dict[str, Any]] = field(default_factory=list)
    queues: list[dict[str, Any]] = field(default_factory=list)
    bindings: list[dict[str, Any]] = field(default_factory=list)
    parameters: list[tuple[str, str, str, Any]] = field(default_factory=list)  # (vhost, component, name, value)
    not_applied: list[str] = field(default_factory=list)


def import_definitions(broker: "Broker", document: dict[str, Any], only_vhost: str | None = None) -> list[str]:
    """Apply `document` (with `only_vhost`, its policies and topology go into that vhost, vhost
    fields ignored); returns what was not applied, one sentence each. ApiError 400 when the
    file is refused, before anything changed."""
    if not isinstance(document, dict):
        raise api_errors.bad_request("definitions must be a JSON object")
    plan = _Plan()
    if only_vhost is None:
        _check_access(broker, document, plan)
    _check_policies(broker, document, plan, only_vhost)
    _check_topology(broker, document, plan, only_vhost)
    try:
        _apply(broker, plan)
    except AMQPError as error:
        raise api_errors.from_amqp_error(error) from None
    finally:
        broker.save_definitions()
    if plan.not_applied:
        log.warning("definitions import: %d definition(s) not applied: %s", len(plan.not_applied),
                    "; ".join(plan.not_applied))
    return plan.not_applied


# -- pass 1: checks ----------------------------------------------------------------------


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


def _as_table(value: Any) -> Any:
    """RabbitMQ 3.10 exports some tables (a vhost's limits, an operator policy's definition) as
    lists of [key, value] pairs; anything else is returned as it is."""
    if isinstance(value, list) and all(isinstance(pair, list) and len(pair) == 2 for pair in value):
        return {pair[0]: pair[1] for pair in value}
    return value


def _limits(value: Any, names: tuple[str, ...], where: str) -> dict[str, int] | None:
    """An entry's "limits" (None when it has none: RabbitMQ writes [] or {} for none)."""
    value = _as_table(value)
    if value is None or value == {}:
        return None
    try:
        return check_limits(value, names, where)
    except LimitError as error:
        raise api_errors.bad_request(f"{where}: {error}") from None


def _check_access(broker: "Broker", document: dict[str, Any], plan: _Plan) -> None:
    for entry in _entries(document, "users"):
        name = _text(entry, "name")
        plan.users.append((name, password_hash_of(entry), user_tags(entry.get("tags")),
                           _limits(entry.get("limits"), USER_LIMITS, f"limits of user '{name}'")))
    for entry in _entries(document, "vhosts"):
        name = _text(entry, "name")
        plan.vhosts.append((name, vhost_metadata_of(entry),
                            _limits(entry.get("limits"), VHOST_LIMITS, f"limits of vhost '{name}'")))
        queue_type = _default_queue_type(entry)
        if queue_type not in (None, "classic", "undefined"):
            plan.not_applied.append(
                f"default queue type '{queue_type}' of vhost '{name}': a vhost's default queue type is not "
                "supported (a queue declared there without x-queue-type is classic)"
            )
    users = {name for name, *_ in plan.users} | {user.name for user in broker.access.users()}
    vhosts = _vhost_names(broker, plan)
    for entry in _entries(document, "permissions"):
        user, vhost = _text(entry, "user"), _text(entry, "vhost")
        if user not in users or vhost not in vhosts:
            raise api_errors.bad_request(f"permissions for unknown user {user!r} or vhost {vhost!r}")
        configure, write, read = (_text(entry, kind) for kind in ("configure", "write", "read"))
        for pattern in (configure, write, read):
            try:
                re.compile(pattern)
            except re.error as error:
                raise api_errors.bad_request(f"invalid permission pattern {pattern!r}: {error}") from None
        plan.permissions.append((user, vhost, configure, write, read))
    for entry in _entries(document, "topic_permissions"):
        plan.not_applied.append(
            f"topic permissions of user '{entry.get('user')}' in vhost '{entry.get('vhost')}': "
            "topic permissions are not supported"
        )
    for entry in _entries(document, "global_parameters"):
        if entry.get("name") not in _INTERNAL_GLOBAL_PARAMETERS:
            plan.not_applied.append(f"global parameter '{entry.get('name')}': global parameters are not supported")


def _default_queue_type(entry: dict[str, Any]) -> Any:
    """A vhost entry's default queue type: top-level or in "metadata" (RabbitMQ 3.11+ exports)."""
    metadata = entry.get("metadata")
    if not isinstance(metadata, dict):
        metadata = {}
    return entry.get("default_queue_type", metadata.get("default_queue_type"))


def _vhost_names(broker: "Broker", plan: _Plan) -> set[str]:
    return {name for name, *_ in plan.vhosts} | set(broker.vhosts)


def _vhost_of(broker: "Broker", plan: _Plan, entry: dict[str, Any], only_vhost: str | None) -> str:
    name = only_vhost if only_vhost is not None else _text(entry, "vhost")
    if name not in _vhost_names(broker, plan):
        raise api_errors.bad_request(f"vhost '{name}' does not exist")
    return name


def _check_policies(broker: "Broker", document: dict[str, Any], plan: _Plan, only_vhost: str | None) -> None:
    for entry in _entries(document, "policies"):
        _plan_policy(broker, plan, entry, entry, only_vhost, operator=False)
    for entry in _entries(document, "parameters"):
        component = entry.get("component")
        vhost = _vhost_of(broker, plan, entry, only_vhost)
        if component == OPERATOR_POLICY_COMPONENT:
            value = dict(entry["value"]) if isinstance(entry.get("value"), dict) else {}
            if "definition" in value:
                value["definition"] = _as_table(value["definition"])
            _plan_policy(broker, plan, {**entry, "vhost": vhost}, value, only_vhost, operator=True)
        elif component == VHOST_LIMITS_COMPONENT:
            limits = _limits(entry.get("value"), VHOST_LIMITS, f"limits of vhost '{vhost}'")
            plan.vhosts.append((vhost, None, limits))
        elif isinstance(component, str) and broker.parameters.component(component) is not None:
            name = _text(entry, "name")
            try:
                broker.parameters.validate(vhost, component, name, entry.get("value"))
            except ParameterError as error:
                # A RabbitMQ export holds what RabbitMQ took (an AMQP 1.0 shovel, say): what this
                # broker's component refuses is not applied, with its reasons, and the rest is.
                plan.not_applied.append(f"parameter '{name}' of component '{component}' in vhost '{vhost}': "
                                        + "; ".join(error.problems))
                continue
            plan.parameters.append((vhost, component, name, entry.get("value")))
        else:
            plan.not_applied.append(
                f"parameter '{entry.get('name')}' of component '{component}' in vhost '{vhost}': "
                "this broker has no such component"
            )


def _plan_policy(broker: "Broker", plan: _Plan, entry: dict[str, Any], body: dict[str, Any],
                 only_vhost: str | None, operator: bool) -> None:
    vhost = _vhost_of(broker, plan, entry, only_vhost)
    name = _text(entry, "name")
    label = "operator policy" if operator else "policy"
    try:
        plan.policies.append((parse_policy(vhost, name, body, operator), operator))
    except PolicyError as error:
        plan.not_applied.append(f"{label} '{name}' in vhost '{vhost}': {error}")


def _check_topology(broker: "Broker", document: dict[str, Any], plan: _Plan, only_vhost: str | None) -> None:
    skipped: set[tuple[str, str, str]] = set()  # (vhost, "exchange" | "queue", name) not applied
    known: set[tuple[str, str, str]] = set()  # ... that will exist
    for entry in _entries(document, "exchanges"):
        vhost, name, type_name = _vhost_of(broker, plan, entry, only_vhost), _text(entry, "name"), _text(entry, "type")
        if type_name not in EXCHANGE_TYPES:
            plan.not_applied.append(f"exchange '{name}' in vhost '{vhost}': exchange type '{type_name}' is not supported")
            skipped.add((vhost, "exchange", name))
            continue
        exchange: dict[str, Any] = {
            "vhost": vhost, "name": name, "type": type_name, "durable": as_bool(entry.get("durable"), True),
            "auto_delete": as_bool(entry.get("auto_delete")), "internal": as_bool(entry.get("internal")),
            "arguments": as_table(entry.get("arguments")),
        }
        existing = broker.vhosts[vhost].exchanges.get(name) if vhost in broker.vhosts else None
        if existing is not None:
            _refuse_on_error(lambda: equivalence.check_exchange(
                vhost, existing, type_name, exchange["durable"], exchange["auto_delete"], exchange["internal"],
                exchange["arguments"]))
        plan.exchanges.append(exchange)
        known.add((vhost, "exchange", name))
    for entry in _entries(document, "queues"):
        vhost, name = _vhost_of(broker, plan, entry, only_vhost), _text(entry, "name")
        queue: dict[str, Any] = {"vhost": vhost, "name": name, "durable": as_bool(entry.get("durable"), True),
                 "auto_delete": as_bool(entry.get("auto_delete")), "arguments": as_table(entry.get("arguments"))}
        if name.startswith("amq."):
            # RabbitMQ 3.10 answers 204 and creates no queue with a reserved name (amq.gen-…):
            # nothing this broker could honour either, so logged but not reported.
            log.info("definitions import: skipped queue '%s' with a reserved name", name)
            skipped.add((vhost, "queue", name))
            continue
        if entry.get("type") == "quorum" and "x-queue-type" not in queue["arguments"]:
            # An export names each queue's type; a queue declared without x-queue-type in a
            # vhost whose default queue type is quorum may lack the argument.
            queue["arguments"] = {**queue["arguments"], "x-queue-type": "quorum"}
        reason = _queue_not_honoured(entry, queue)
        if reason is not None:
            plan.not_applied.append(f"queue '{name}' in vhost '{vhost}': {reason}")
            skipped.add((vhost, "queue", name))
            continue
        _check_queue(broker, queue)
        plan.queues.append(queue)
        known.add((vhost, "queue", name))
    for entry in _entries(document, "bindings"):
        vhost = _vhost_of(broker, plan, entry, only_vhost)
        source, destination = _text(entry, "source"), _text(entry, "destination")
        kind = "exchange" if entry.get("destination_type", "queue") == "exchange" else "queue"
        ends = ((vhost, "exchange", source), (vhost, kind, destination))
        missing = [end for end in ends if end in skipped]
        if missing:
            plan.not_applied.append(
                f"binding of {kind} '{destination}' to exchange '{source}' in vhost '{vhost}': "
                f"{missing[0][1]} '{missing[0][2]}' is not applied"
            )
            continue
        for end in ends:
            if end not in known and not _exists(broker, end):
                what = "binding from missing exchange" if end is ends[0] else "binding to missing destination"
                raise api_errors.bad_request(f"{what} {end[2]!r}")
        plan.bindings.append({"vhost": vhost, "source": source, "destination": destination, "destination_type": kind,
                              "routing_key": str(entry.get("routing_key", "")),
                              "arguments": as_table(entry.get("arguments"))})


def _queue_not_honoured(entry: dict[str, Any], queue: dict[str, Any]) -> str | None:
    """Why this broker cannot have the queue, or None. RabbitMQ 3.10+ exports write the type
    in "type" as well as (or, for a vhost's default queue type, instead of) x-queue-type."""
    if "stream" in (entry.get("type"), queue["arguments"].get("x-queue-type")):
        return "stream queues are not supported"
    return None


def _check_queue(broker: "Broker", queue: dict[str, Any]) -> None:
    """400 for arguments the broker would refuse, or a queue that exists and differs."""
    resource = errors.resource("queue", queue["name"], queue["vhost"])
    try:
        QueueArguments.parse(queue["arguments"])
    except InvalidArgument as error:
        raise api_errors.bad_request(error.describe(resource)) from None
    vhost = broker.vhosts.get(queue["vhost"])
    existing = vhost.queues.get(queue["name"]) if vhost is not None else None
    if existing is not None:
        _refuse_on_error(lambda: equivalence.check_queue(
            queue["vhost"], existing, queue["durable"], queue["auto_delete"], queue["arguments"]))


def _refuse_on_error(check: Any) -> None:
    try:
        check()
    except Inequivalent as refusal:
        raise api_errors.from_amqp_error(errors.inequivalent(refusal)) from None
    except AMQPError as error:
        raise api_errors.from_amqp_error(error) from None


def _exists(broker: "Broker", end: tuple[str, str, str]) -> bool:
    vhost = broker.vhosts.get(end[0])
    if vhost is None:
        return False
    return end[2] in (vhost.exchanges if end[1] == "exchange" else vhost.queues)


# -- pass 2: apply -------------------------------------------------------------------------


def _apply(broker: "Broker", plan: _Plan) -> None:
    for name, password_hash, tags, limits in plan.users:
        set_user(broker, name, password_hash, tags)
        if limits is not None:
            broker.set_user_limits(name, limits)
    for name, metadata, limits in plan.vhosts:
        vhost = broker.add_vhost(name)
        if metadata is not None:
            # As RabbitMQ 3.10: an entry replaces the vhost's description and tags, even with none.
            broker.set_vhost_metadata(name, *metadata)
        if limits is not None:
            vhost.set_limits(limits)
    for user, vhost_name, configure, write, read in plan.permissions:
        broker.access.set_permissions(user, vhost_name, configure, write, read)
    for policy, operator in plan.policies:
        broker.vhosts[policy.vhost].set_policy(policy, operator)
    for entry in plan.exchanges:
        broker.vhosts[entry["vhost"]].declare_exchange(
            entry["name"], entry["type"], durable=entry["durable"], auto_delete=entry["auto_delete"],
            internal=entry["internal"], arguments=entry["arguments"],
        )
    for entry in plan.queues:
        _queue, created = broker.vhosts[entry["vhost"]].declare_queue(
            entry["name"], connection=None, durable=entry["durable"], auto_delete=entry["auto_delete"],
            arguments=entry["arguments"],
            by_client=True,
        )
        broker.stats.queues_declared += 1
        broker.stats.queues_created += created
    for entry in plan.bindings:
        vhost = broker.vhosts[entry["vhost"]]
        pool = vhost.exchanges if entry["destination_type"] == "exchange" else vhost.queues
        vhost.bind(vhost.exchanges[entry["source"]], pool[entry["destination"]], entry["routing_key"],
                   entry["arguments"])
    # Last, as RabbitMQ: a shovel or an upstream finds the queues and exchanges it names.
    for vhost_name, component, name, value in plan.parameters:
        broker.parameters.set(vhost_name, component, name, value, validate=False)
