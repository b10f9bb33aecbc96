"""The commands that change things: users, permissions, vhosts, queues, connections,
definitions and tracing. Each prints rabbitmqctl's progress line, then calls the API.

A command gets a `Session` (the API client, the vhost from -p, and the output) and its
positional arguments; it returns the exit code or raises CtlError.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from amqp_server.ctl.api_client import ApiError, ManagementClient, quote
from amqp_server.ctl.exit_codes import EX_DATAERR, EX_NOUSER, EX_OK, EX_SOFTWARE, EX_UNAVAILABLE, CtlError
from amqp_server.ctl.formatting import cell


@dataclass
class Session:
    client: ManagementClient
    vhost: str
    out: TextIO
    quiet: bool = False

    def info(self, text: str) -> None:
        """A progress line; --quiet and --silent drop it."""
        if not self.quiet:
            self.out.write(text + "\n")


def node_name(session: Session) -> str:
    """The node's name (/api/overview), "?" when the API does not say: for progress lines."""
    try:
        overview = session.client.get("/api/overview")
    except ApiError:
        return "?"
    return str(overview.get("node", "?"))


def _missing(error: ApiError) -> bool:
    return error.status == 404


def refused(error: ApiError) -> CtlError:
    return CtlError(EX_SOFTWARE, error.reason or error.error)


def existing_user(session: Session, name: str) -> dict[str, Any]:
    try:
        user: dict[str, Any] = session.client.get(f"/api/users/{quote(name)}")  # (JSON: Any)
        return user
    except ApiError as error:
        if _missing(error):
            raise CtlError(EX_NOUSER, f'User "{name}" does not exist') from None
        raise refused(error) from None


def require_vhost(session: Session, vhost: str) -> dict[str, Any]:
    try:
        found: dict[str, Any] = session.client.get(f"/api/vhosts/{quote(vhost)}")  # (JSON: Any)
        return found
    except ApiError as error:
        if _missing(error):
            raise CtlError(EX_UNAVAILABLE, f"Virtual host {vhost} does not exist") from None
        raise refused(error) from None


def _call(action: Callable[[], Any]) -> Any:
    try:
        return action()
    except ApiError as error:
        raise refused(error) from None


# -- users and permissions ------------------------------------------------------------------


def add_user(session: Session, name: str, password: str) -> int:
    session.info(f'Adding user "{name}" ...')
    try:
        session.client.get(f"/api/users/{quote(name)}")
    except ApiError as error:
        if not _missing(error):
            raise refused(error) from None
    else:
        raise CtlError(EX_SOFTWARE, f'User "{name}" already exists')
    _call(lambda: session.client.put(f"/api/users/{quote(name)}", {"password": password, "tags": ""}))
    session.info(
        "Done. Don't forget to grant the user permissions to some virtual hosts! "
        "See 'amqp-server ctl help set_permissions' to learn more."
    )
    return EX_OK


def delete_user(session: Session, name: str) -> int:
    session.info(f'Deleting user "{name}" ...')
    try:
        session.client.delete(f"/api/users/{quote(name)}")
    except ApiError as error:
        if _missing(error):
            raise CtlError(EX_NOUSER, f'User "{name}" does not exist') from None
        raise refused(error) from None
    return EX_OK


def change_password(session: Session, name: str, password: str) -> int:
    session.info(f'Changing password for user "{name}" ...')
    user = existing_user(session, name)
    body = {"password": password, "tags": ",".join(user.get("tags") or [])}
    _call(lambda: session.client.put(f"/api/users/{quote(name)}", body))
    return EX_OK


def set_user_tags(session: Session, name: str, *tags: str) -> int:
    session.info(f'Setting tags for user "{name}" to {cell(list(tags))} ...')
    existing_user(session, name)
    # Without a password field the broker keeps the user's password.
    _call(lambda: session.client.put(f"/api/users/{quote(name)}", {"tags": ",".join(tags)}))
    return EX_OK


def set_permissions(session: Session, user: str, configure: str, write: str, read: str) -> int:
    vhost = session.vhost
    session.info(f'Setting permissions for user "{user}" in vhost "{vhost}" ...')
    require_vhost(session, vhost)
    existing_user(session, user)
    body = {"configure": configure, "write": write, "read": read}
    _call(lambda: session.client.put(f"/api/permissions/{quote(vhost)}/{quote(user)}", body))
    return EX_OK


def clear_permissions(session: Session, user: str) -> int:
    vhost = session.vhost
    session.info(f'Clearing permissions for user "{user}" in vhost "{vhost}" ...')
    require_vhost(session, vhost)
    existing_user(session, user)
    try:
        session.client.delete(f"/api/permissions/{quote(vhost)}/{quote(user)}")
    except ApiError as error:
        if not _missing(error):  # no permissions to clear is fine, as in rabbitmqctl
            raise refused(error) from None
    return EX_OK


# -- vhosts -----------------------------------------------------------------------------------


def add_vhost(session: Session, name: str) -> int:
    session.info(f'Adding vhost "{name}" ...')
    _call(lambda: session.client.put(f"/api/vhosts/{quote(name)}", {}))
    return EX_OK


def delete_vhost(session: Session, name: str) -> int:
    session.info(f'Deleting vhost "{name}" ...')
    try:
        session.client.delete(f"/api/vhosts/{quote(name)}")
    except ApiError as error:
        if _missing(error):
            raise CtlError(EX_DATAERR, f"Virtual host '{name}' does not exist") from None
        raise refused(error) from None
    return EX_OK


def _set_tracing(session: Session, on: bool) -> None:
    vhost = session.vhost
    current = require_vhost(session, vhost)
    body: dict[str, Any] = {key: current[key] for key in ("description", "tags", "default_queue_type") if key in current}
    body["tracing"] = on
    _call(lambda: session.client.put(f"/api/vhosts/{quote(vhost)}", body))
    if bool(require_vhost(session, vhost).get("tracing")) != on:
        raise CtlError(EX_SOFTWARE, f"the broker did not switch tracing {'on' if on else 'off'} for vhost {vhost}")


def trace_on(session: Session) -> int:
    session.info(f'Starting tracing for vhost "{session.vhost}" ...')
    _set_tracing(session, True)
    session.info(f"Trace enabled for vhost {session.vhost}")
    return EX_OK


def trace_off(session: Session) -> int:
    session.info(f'Stopping tracing for vhost "{session.vhost}" ...')
    _set_tracing(session, False)
    session.info(f"Trace disabled for vhost {session.vhost}")
    return EX_OK


# -- queues and connections ---------------------------------------------------------------------


def _queue_path(session: Session, name: str) -> str:
    return f"/api/queues/{quote(session.vhost)}/{quote(name)}"


def _queue_not_found(session: Session, name: str) -> CtlError:
    return CtlError(EX_UNAVAILABLE, f"queue '{name}' in vhost '{session.vhost}' not found")


def purge_queue(session: Session, name: str) -> int:
    session.info(f"Purging queue '{name}' in vhost '{session.vhost}' ...")
    try:
        session.client.delete(_queue_path(session, name) + "/contents")
    except ApiError as error:
        raise (_queue_not_found(session, name) if _missing(error) else refused(error)) from None
    return EX_OK


def delete_queue(session: Session, name: str, if_empty: bool = False, if_unused: bool = False) -> int:
    session.info(f"Deleting queue '{name}' on vhost '{session.vhost}' ...")
    path = _queue_path(session, name)
    try:
        ready = session.client.get(path).get("messages_ready", 0)
        conditions = [f"{flag}=true" for flag, wanted in (("if-empty", if_empty), ("if-unused", if_unused)) if wanted]
        session.client.delete(path + ("?" + "&".join(conditions) if conditions else ""))
    except ApiError as error:
        raise (_queue_not_found(session, name) if _missing(error) else refused(error)) from None
    session.info(f"Queue was successfully deleted with {ready} ready messages")
    return EX_OK


def close_connection(session: Session, name: str, reason: str) -> int:
    """`name` is the connection's name ("client_ip:port -> server_ip:port"), as list_connections
    shows it in the name and pid columns."""
    session.info(f"Closing connection {name}, reason: {reason}...")
    try:
        session.client.delete(f"/api/connections/{quote(name)}", headers={"X-Reason": reason})
    except ApiError as error:
        if _missing(error):
            raise CtlError(EX_UNAVAILABLE, f"connection {name} not found") from None
        raise refused(error) from None
    return EX_OK


# -- definitions --------------------------------------------------------------------------------


def export_definitions(session: Session, path: str) -> int:
    """Write every definition as JSON to `path` ("-": standard output)."""
    definitions = _call(lambda: session.client.get("/api/definitions"))
    text = json.dumps(definitions, indent=2, ensure_ascii=False) + "\n"
    if path == "-":
        session.out.write(text)
        return EX_OK
    session.info(f'Exporting definitions in JSON to a file at "{path}" ...')
    try:
        Path(path).write_text(text)
    except OSError as error:
        raise CtlError(EX_DATAERR, f"cannot write {path}: {error.strerror}") from None
    return EX_OK


def import_definitions(session: Session, path: str) -> int:
    """Import definitions from a JSON file (or "-": standard input), RabbitMQ's export format."""
    if path != "-":
        session.info(f'Importing definitions in JSON from a file at "{path}" ...')
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
        definitions = json.loads(text)
    except OSError as error:
        raise CtlError(EX_DATAERR, f"cannot read {path}: {error.strerror}") from None
    except ValueError as error:
        raise CtlError(EX_DATAERR, f"{path} is not valid JSON: {error}") from None
    _call(lambda: session.client.post("/api/definitions", definitions))
    session.info("Successfully imported definitions.")
    return EX_OK
