"""`federation_status` and `restart_federation_link`, as rabbitmqctl with the federation plugin,
through the management API (/api/federation-links).

federation_status prints one row per link (with --only-down, those neither starting nor
running), its columns RabbitMQ's status fields (exchange, queue, upstream_exchange,
upstream_queue, type, vhost, upstream, id, status, local_connection, uri, timestamp, error) and
this broker's reconnects at the end. restart_federation_link restarts the link with that id; an
id no link has exits 69 with rabbitmqctl's text.
"""

from __future__ import annotations

from typing import Any

from amqp_server.ctl.admin_commands import Session, node_name, refused
from amqp_server.ctl.api_client import ApiError, quote
from amqp_server.ctl.exit_codes import EX_OK, EX_UNAVAILABLE, CtlError
from amqp_server.ctl.formatting import write_rows

COLUMNS = ("exchange", "queue", "upstream_exchange", "upstream_queue", "type", "vhost", "upstream", "id", "status",
           "local_connection", "uri", "timestamp", "error", "reconnects")


def _links(session: Session, only_down: bool = False) -> list[dict[str, Any]]:
    path = "/api/federation-links/state/down" if only_down else "/api/federation-links"
    try:
        links: list[dict[str, Any]] = session.client.get(path)
    except ApiError as error:
        raise refused(error) from None
    return links


def federation_status(session: Session, only_down: bool = False, formatter: str = "table",
                      headers: bool = True) -> int:
    which = "which are down " if only_down else ""
    session.info(f"Listing federation links {which}on node {node_name(session)}...")
    links = _links(session, only_down)
    rows = [["" if link.get(column) is None else link.get(column) for column in COLUMNS] for link in links]
    write_rows(session.out, formatter, COLUMNS, rows, headers)
    return EX_OK


def restart_federation_link(session: Session, link_id: str) -> int:
    session.info(f"Restarting federation link {link_id} on node {node_name(session)}")
    for link in _links(session):
        if link.get("id") == link_id:
            try:
                session.client.delete(f"/api/federation-links/vhost/{quote(link['vhost'])}/{quote(link_id)}/"
                                      f"{quote(link['node'])}/restart")
            except ApiError as error:
                if error.status == 404:
                    break
                raise refused(error) from None
            return EX_OK
    raise CtlError(EX_UNAVAILABLE, "Link with the given ID was not found")
