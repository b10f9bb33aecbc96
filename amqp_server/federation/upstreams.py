"""Federation upstreams: the runtime parameters that name them, and which ones a policy gives.

Two components of RabbitMQ's runtime parameters (rabbit_federation_parameters, 3.10.8):

- `federation-upstream`: one upstream, `{"uri": ..., "prefetch-count": ..., ...}`;
- `federation-upstream-set`: a list of `{"upstream": name, ...}`, each naming an upstream and
  overriding any of its keys but the URI.

A value is checked key by key in RabbitMQ's order, and every refusal is reported, one per line,
in RabbitMQ's words (`max-hops should be a number, actually was <<"b">>`, `Key "uri" not found
in u1`, `Unrecognised terms [{<<"bogus">>,1}] in u1`).

A policy federates what it applies to with one of `federation-upstream` (one upstream),
`federation-upstream-set` (a set; `all` is every upstream of the vhost) or
`federation-upstream-pattern` (every upstream whose name the regular expression finds);
`upstreams_for` resolves it, as rabbit_federation_upstream:for/1 does: a name that is not (or
no longer) an upstream is left out, not refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from amqp_server.peer_link.uri import InvalidUri, parse_uri
from queues.arguments.policy_keys import erlang_term

UPSTREAM_COMPONENT = "federation-upstream"
UPSTREAM_SET_COMPONENT = "federation-upstream-set"
ALL_UPSTREAMS = "all"  # the set every upstream of the vhost is in
ACK_MODES = ("no-ack", "on-publish", "on-confirm")
ON_CONFIRM, ON_PUBLISH, NO_ACK = "on-confirm", "on-publish", "no-ack"

# RabbitMQ's defaults (rabbit_federation_upstream:from_upstream_or_set).
DEFAULT_PREFETCH = 1000
DEFAULT_RECONNECT_DELAY_S = 5.0
DEFAULT_MAX_HOPS = 1


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(key: str, value: Any) -> str | None:
    return None if _is_number(value) else f"{key} should be a number, actually was {erlang_term(value)}"


def _binary(key: str, value: Any) -> str | None:
    return None if isinstance(value, str) else f"{key} should be binary, actually was {erlang_term(value)}"


def _boolean(key: str, value: Any) -> str | None:
    return None if isinstance(value, bool) else f"{key} should be boolean, actually was {erlang_term(value)}"


def _enum(*choices: str) -> Callable[[str, Any], str | None]:
    listed = "[" + ",".join(erlang_term(choice) for choice in choices) + "]"

    def check(key: str, value: Any) -> str | None:
        if isinstance(value, str) and value in choices:
            return None
        return f"{key} should be one of {listed}, actually was {erlang_term(value)}"
    return check


def uri_refusal(uri: str) -> str | None:
    """Why `uri` is not an AMQP URI (RabbitMQ's amqp_uri:parse, as peer_link/uri.py reads it:
    the one reading the links use), in RabbitMQ's words; None when it is one."""
    try:
        parse_uri(uri)
    except InvalidUri as refusal:
        return str(refusal)
    return None


def _uri(key: str, value: Any) -> str | None:
    if isinstance(value, str):
        return uri_refusal(value)
    if not isinstance(value, list) or not value:
        return f"{key} should be list, actually was {erlang_term(value)}"
    for item in value:
        if not isinstance(item, str):
            return f"{key} should be list, actually was {erlang_term(value)}"
        refusal = uri_refusal(item)
        if refusal is not None:
            return refusal
    return None


# rabbit_federation_parameters:shared_validation(), in its order (the order of the refusals).
_SHARED: tuple[tuple[str, Callable[[str, Any], str | None]], ...] = (
    ("exchange", _binary),
    ("queue", _binary),
    ("consumer-tag", _binary),
    ("prefetch-count", _number),
    ("reconnect-delay", _number),
    ("max-hops", _number),
    ("expires", _number),
    ("message-ttl", _number),
    ("trust-user-id", _boolean),
    ("ack-mode", _enum(*ACK_MODES)),
    ("resource-cleanup-mode", _enum("default", "never")),
    ("ha-policy", _binary),
    ("bind-nowait", _boolean),
    ("channel-use-mode", _enum("multiple", "single")),
)
_UPSTREAM_KEYS = (("uri", _uri),) + _SHARED
_SET_MEMBER_KEYS = (("upstream", _binary),) + _SHARED


def _proplist_refusals(name: str, keys: tuple[tuple[str, Callable[[str, Any], str | None]], ...],
                       value: dict[str, Any], mandatory: str) -> list[str]:
    """rabbit_parameter_validation:proplist: each key's refusal, the last key's first, and
    before them the keys nobody knows."""
    refusals = []
    for key, check in keys:
        if key in value:
            refusal = check(key, value[key])
            if refusal is not None:
                refusals.append(refusal)
        elif key == mandatory:
            refusals.append(f'Key "{key}" not found in {name}')
    refusals.reverse()
    known = {key for key, _check in keys}
    unknown = [(key, item) for key, item in value.items() if key not in known]
    if unknown:
        listed = ",".join(f"{{{erlang_term(key)},{erlang_term(item)}}}" for key, item in unknown)
        refusals.insert(0, f"Unrecognised terms [{listed}] in {name}")
    return refusals


def upstream_problems(name: str, value: Any) -> list[str]:
    """Why RabbitMQ would refuse `value` as upstream `name`, one line each ([]: it takes it)."""
    if not isinstance(value, dict):
        # (RabbitMQ 3.10.8 answers 500 here)
        return [f"{name} should be a JSON object, actually was {erlang_term(value)}"]
    return _proplist_refusals(name, _UPSTREAM_KEYS, value, "uri")


def upstream_set_problems(name: str, value: Any) -> list[str]:
    """Why RabbitMQ would refuse `value` as upstream set `name`, one line each ([]: it takes it)."""
    if not isinstance(value, list):
        return [f"{name} should be list, actually was {erlang_term(value)}"]
    problems: list[str] = []
    for member in value:
        if not isinstance(member, dict):
            problems.append(f"{name} should be a list of JSON objects, actually holds {erlang_term(member)}")
            continue
        problems.extend(_proplist_refusals(name, _SET_MEMBER_KEYS, member, "upstream"))
    return problems


@dataclass(frozen=True)
class Upstream:
    """One upstream as it applies to one federated exchange or queue: the parameter's keys,
    overridden by the set's, with RabbitMQ's defaults for the rest. `exchange` and `queue`
    are the names on the upstream (the federated one's own name when not given)."""

    name: str
    uris: tuple[str, ...]
    exchange: str
    queue: str
    consumer_tag: str
    prefetch_count: int = DEFAULT_PREFETCH
    reconnect_delay_s: float = DEFAULT_RECONNECT_DELAY_S
    max_hops: int = DEFAULT_MAX_HOPS
    expires_ms: int | None = None
    message_ttl_ms: int | None = None
    trust_user_id: bool = False
    ack_mode: str = ON_CONFIRM
    resource_cleanup: bool = True  # resource-cleanup-mode default (False: never)


def _upstream(name: str, parameter: dict[str, Any], overrides: dict[str, Any], local_name: str) -> Upstream:
    def get(key: str, default: Any) -> Any:
        if key in overrides:
            return overrides[key]
        return parameter.get(key, default)

    uri = parameter["uri"]
    return Upstream(
        name=name,
        uris=(uri,) if isinstance(uri, str) else tuple(uri),
        exchange=get("exchange", local_name),
        queue=get("queue", local_name),
        consumer_tag=get("consumer-tag", f"federation-link-{name}"),
        prefetch_count=max(0, int(get("prefetch-count", DEFAULT_PREFETCH))),
        reconnect_delay_s=max(0.0, float(get("reconnect-delay", DEFAULT_RECONNECT_DELAY_S))),
        max_hops=int(get("max-hops", DEFAULT_MAX_HOPS)),
        expires_ms=_optional_int(get("expires", None)),
        message_ttl_ms=_optional_int(get("message-ttl", None)),
        trust_user_id=bool(get("trust-user-id", False)),
        ack_mode=get("ack-mode", ON_CONFIRM),
        resource_cleanup=get("resource-cleanup-mode", "default") != "never",
    )


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


FEDERATION_POLICY_KEYS = ("federation-upstream", "federation-upstream-set", "federation-upstream-pattern")


def federates(definition: Mapping[str, Any]) -> bool:
    """Does a policy with `definition` federate what it applies to?"""
    return any(key in definition for key in FEDERATION_POLICY_KEYS)


def upstreams_for(definition: Mapping[str, Any], upstreams: Mapping[str, dict[str, Any]],
                  sets: Mapping[str, list[dict[str, Any]]], local_name: str) -> list[Upstream]:
    """The upstreams a policy's `definition` gives the exchange or queue `local_name`, given the
    vhost's `upstreams` and upstream `sets` (parameter values by name)."""
    members: list[dict[str, Any]]
    if "federation-upstream" in definition:
        members = [{"upstream": definition["federation-upstream"]}]
    elif "federation-upstream-set" in definition:
        set_name = definition["federation-upstream-set"]
        if set_name == ALL_UPSTREAMS:
            members = [{"upstream": name} for name in sorted(upstreams)]
        else:
            members = list(sets.get(set_name, []))
    elif "federation-upstream-pattern" in definition:
        pattern = re.compile(definition["federation-upstream-pattern"])
        members = [{"upstream": name} for name in sorted(upstreams) if pattern.search(name)]
    else:
        return []
    found = []
    for member in members:
        name = member.get("upstream")
        parameter = upstreams.get(name) if isinstance(name, str) else None
        if parameter is not None:
            found.append(_upstream(name, parameter, member, local_name))  # type: ignore[arg-type]
    return found


def safe_uri(uri: str) -> str:
    """`uri` without its user name and password, as RabbitMQ shows it (amqp_uri:remove_credentials)."""
    scheme, separator, rest = uri.partition("://")
    if not separator:
        return uri
    authority, slash, path = rest.partition("/")
    host = authority.rpartition("@")[2]
    return f"{scheme}://{host}{slash}{path}"
