"""Policies, operator policies and limits: rabbitmqctl's set_/clear_ commands, through the API.

Same arguments, options (-p, --priority, --apply-to), progress lines and exit codes as
rabbitmqctl 3.10: a definition the broker refuses prints its "Validation failed" text and exits
69, as does clearing a policy that does not exist ("Parameter does not exist").
list_policies and list_operator_policies are tables (listings.py); list_vhost_limits and
list_user_limits print the limits as JSON, as rabbitmqctl does. set_vhost_limits replaces the
vhost's limits, set_user_limits merges into the user's (rabbitmqctl 3.10 and 3.13 alike).
"""

from __future__ import annotations

import html
import json
from typing import Any

from amqp_server.ctl.admin_commands import Session, existing_user, refused, require_vhost
from amqp_server.ctl.api_client import ApiError, quote
from amqp_server.ctl.exit_codes import EX_DATAERR, EX_OK, EX_UNAVAILABLE, EX_USAGE, ArgumentError, CtlError
from amqp_server.config.limit_definitions import USER_LIMITS, VHOST_LIMITS, LimitError, check_limits


def _definition(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as error:
        raise CtlError(EX_DATAERR, f"Could not parse JSON document: {error}") from None


def _put(session: Session, path: str, body: Any) -> None:
    try:
        session.client.put(path, body)
    except ApiError as error:
        if error.status == 400:
            # The API escapes < and > in a policy's refusal, rabbitmqctl does not; the reason
            # ends with a newline, which rabbitmqctl prints too.
            raise CtlError(EX_UNAVAILABLE, html.unescape(error.reason or error.error)) from None
        raise refused(error) from None


def _delete(session: Session, path: str, missing: str | None = None) -> None:
    try:
        session.client.delete(path)
    except ApiError as error:
        if error.status == 404 and missing is not None:
            raise CtlError(EX_UNAVAILABLE, missing) from None
        if error.status != 404:
            raise refused(error) from None


def _priority(text: str) -> int:
    """--priority as rabbitmqctl takes it: an integer, or a usage error (exit 64)."""
    try:
        return int(text)
    except ValueError:
        raise ArgumentError(f"Invalid options for this command:\n--priority : {text}", EX_USAGE) from None


def _set(session: Session, kind: str, name: str, pattern: str, definition: str, priority: int,
         apply_to: str) -> int:
    require_vhost(session, session.vhost)
    body = {"pattern": pattern, "definition": _definition(definition), "priority": priority, "apply-to": apply_to}
    _put(session, f"/api/{kind}/{quote(session.vhost)}/{quote(name)}", body)
    return EX_OK


def set_policy(session: Session, name: str, pattern: str, definition: str, priority: str = "0",
               apply_to: str = "all") -> int:
    number = _priority(priority)
    session.info(f'Setting policy "{name}" for pattern "{pattern}" to "{definition}" with priority "{priority}" '
                 f'for vhost "{session.vhost}" ...')
    return _set(session, "policies", name, pattern, definition, number, apply_to)


def set_operator_policy(session: Session, name: str, pattern: str, definition: str, priority: str = "0",
                        apply_to: str = "all") -> int:
    number = _priority(priority)
    session.info(f'Setting operator policy override "{name}" for pattern "{pattern}" to "{definition}" '
                 f'with priority "{priority}" for vhost "{session.vhost}" ...')
    return _set(session, "operator-policies", name, pattern, definition, number, apply_to)


def clear_policy(session: Session, name: str) -> int:
    session.info(f'Clearing policy "{name}" on vhost "{session.vhost}" ...')
    _delete(session, f"/api/policies/{quote(session.vhost)}/{quote(name)}", "Parameter does not exist")
    return EX_OK


def clear_operator_policy(session: Session, name: str) -> int:
    session.info(f'Clearing operator policy "{name}" on vhost "{session.vhost}" ...')
    _delete(session, f"/api/operator-policies/{quote(session.vhost)}/{quote(name)}", "Parameter does not exist")
    return EX_OK


def _put_limits(session: Session, base: str, wanted: Any, names: tuple[str, ...], component: str,
                runtime_parameter: bool) -> None:
    """PUT each limit of `wanted` once all of them passed RabbitMQ's check: a refused definition
    changes nothing, as in rabbitmqctl. A vhost's limits are a runtime parameter, whose refusal
    reads "Validation failed"; a user's are not."""
    try:
        check_limits(wanted, names, component)
    except LimitError as error:
        text = f"Validation failed\n\n{error}\n" if runtime_parameter else str(error)
        raise CtlError(EX_UNAVAILABLE, text) from None
    for name, value in wanted.items():
        _put(session, f"{base}/{quote(name)}", {"value": value})


def _limits_of(session: Session, path: str) -> dict[str, Any]:
    try:
        items = session.client.get(path)
    except ApiError as error:
        raise refused(error) from None
    return items[0]["value"] if items else {}


def set_vhost_limits(session: Session, definition: str) -> int:
    vhost = session.vhost
    session.info(f'Setting vhost limits to "{definition}" for vhost "{vhost}" ...')
    require_vhost(session, vhost)
    base = f"/api/vhost-limits/{quote(vhost)}"
    current, wanted = _limits_of(session, base), _definition(definition)
    _put_limits(session, base, wanted, VHOST_LIMITS, "limits", runtime_parameter=True)
    for name in current:  # the definition replaces the vhost's limits
        if name not in wanted:
            _delete(session, f"{base}/{quote(name)}")
    return EX_OK


def clear_vhost_limits(session: Session) -> int:
    vhost = session.vhost
    session.info(f'Clearing vhost "{vhost}" limits ...')
    require_vhost(session, vhost)
    for name in _limits_of(session, f"/api/vhost-limits/{quote(vhost)}"):
        _delete(session, f"/api/vhost-limits/{quote(vhost)}/{quote(name)}")
    return EX_OK


def list_vhost_limits(session: Session) -> int:
    vhost = session.vhost
    session.info(f'Listing limits for vhost "{vhost}" ...')
    require_vhost(session, vhost)
    limits = _limits_of(session, f"/api/vhost-limits/{quote(vhost)}")
    # rabbitmqctl prints an empty line for a vhost without limits.
    session.out.write((json.dumps(limits, separators=(",", ":"), sort_keys=True) if limits else "") + "\n")
    return EX_OK


def set_user_limits(session: Session, user: str, definition: str) -> int:
    session.info(f'Setting user limits to "{definition}" for user "{user}" ...')
    existing_user(session, user)
    # Merged into the user's limits: those it does not name stay, as rabbitmqctl's do.
    _put_limits(session, f"/api/user-limits/{quote(user)}", _definition(definition), USER_LIMITS, "user-limits",
                runtime_parameter=False)
    return EX_OK


def clear_user_limits(session: Session, user: str, limit: str) -> int:
    """`limit` is a limit's name or "all"."""
    if limit == "all":
        session.info(f'Clearing all limits for user "{user}" ...')
    else:
        session.info(f'Clearing "{limit}" limit for user "{user}" ...')
    existing_user(session, user)
    names = list(_limits_of(session, f"/api/user-limits/{quote(user)}")) if limit == "all" else [limit]
    for name in names:
        _delete(session, f"/api/user-limits/{quote(user)}/{quote(name)}")
    return EX_OK


def list_user_limits(session: Session, user: str | None = None) -> int:
    """`user` defaults to guest, as rabbitmqctl's does; a user without limits prints {}."""
    user = user or "guest"
    session.info(f'Listing limits for user "{user}" ...')
    existing_user(session, user)
    limits = _limits_of(session, f"/api/user-limits/{quote(user)}")
    # Sorted, as rabbitmqctl prints an Erlang map.
    session.out.write(json.dumps(limits, separators=(",", ":"), sort_keys=True) + "\n")
    return EX_OK
