"""`shovel_status` and `delete_shovel`, as rabbitmqctl with the shovel plugin, through the API.

shovel_status prints one row per shovel, its columns in rabbitmqctl 3.10's order (sorted by
name): destination, destination_protocol, destination_queue (or destination_exchange and
destination_exchange_key), last_changed, name, source, source_protocol, source_queue (or
source_exchange and source_exchange_key), state, termination_reason, type, vhost, and this
broker's reconnects and last_error at the end. delete_shovel deletes a dynamic shovel of the
vhost given with -p; one that does not exist exits 69 with rabbitmqctl's text.
"""

from __future__ import annotations

from typing import Any

from amqp_server.ctl.admin_commands import Session, node_name, refused
from amqp_server.ctl.api_client import ApiError, quote
from amqp_server.ctl.exit_codes import EX_OK, EX_UNAVAILABLE, CtlError
from amqp_server.ctl.formatting import write_rows

# rabbitmqctl's columns (they depend on whether shovels read queues or exchanges).
_FIXED = ("destination", "destination_protocol", "last_changed", "name", "source", "source_protocol", "state",
          "termination_reason", "type", "vhost")
_OPTIONAL = ("destination_exchange", "destination_exchange_key", "destination_queue", "source_exchange",
             "source_exchange_key", "source_queue")
_OURS = ("reconnects", "last_error")
_FROM_API = {"destination": "dest_uri", "destination_protocol": "dest_protocol", "last_changed": "timestamp",
             "source": "src_uri", "source_protocol": "src_protocol", "termination_reason": "reason",
             "destination_exchange": "dest_exchange", "destination_exchange_key": "dest_exchange_key",
             "destination_queue": "dest_queue", "source_exchange": "src_exchange",
             "source_exchange_key": "src_exchange_key", "source_queue": "src_queue"}


def shovel_status(session: Session, formatter: str = "table", headers: bool = True) -> int:
    session.info(f"Shovel status on node {node_name(session)}")
    try:
        items: list[dict[str, Any]] = session.client.get("/api/shovels")
    except ApiError as error:
        raise refused(error) from None
    used = {column for item in items for column in _OPTIONAL if item.get(_FROM_API[column]) is not None}
    columns = sorted((*_FIXED, *used)) + list(_OURS)
    rows = [[_cell(item, column) for column in columns] for item in items]
    write_rows(session.out, formatter, columns, rows, headers)
    return EX_OK


def _cell(item: dict[str, Any], column: str) -> Any:
    value = item.get(_FROM_API.get(column, column))
    if column == "last_changed" and isinstance(value, str):
        day, _, clock = value.partition(" ")
        return f"{day} {clock.zfill(8)}"  # rabbitmqctl pads the hour: 00:46:49
    if column == "termination_reason" and value is None:
        return ""
    return value


def delete_shovel(session: Session, name: str) -> int:
    vhost = session.vhost
    session.info(f"Deleting shovel {name} in vhost {vhost}")
    try:
        session.client.delete(f"/api/shovels/vhost/{quote(vhost)}/{quote(name)}")
    except ApiError as error:
        if error.status == 404:
            raise CtlError(EX_UNAVAILABLE, "Shovel with the given name was not found on the target node "
                           f"'{node_name(session)}' and / or virtual host '{vhost}'") from None
        raise refused(error) from None
    return EX_OK
