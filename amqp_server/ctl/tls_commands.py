"""`reload_certificates`: make a running broker read its TLS certificate, key and CA files again
(the route in amqp_server/management/tls_routes.py; SIGHUP to the broker does the same)."""

from __future__ import annotations

from amqp_server.ctl.admin_commands import Session, _call
from amqp_server.ctl.exit_codes import EX_OK

RELOAD_PATH = "/api/amqp-server/reload-certificates"


def reload_certificates(session: Session) -> int:
    session.info("Reloading TLS certificates ...")
    _call(lambda: session.client.post(RELOAD_PATH, {}))
    return EX_OK
