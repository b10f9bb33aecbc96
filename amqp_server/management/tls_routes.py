"""This broker's own route to reload the TLS certificate, under /api/amqp-server/.

RabbitMQ reloads certificates with `rabbitmqctl eval 'ssl:clear_pem_cache().'` over Erlang
distribution; here `amqp-server ctl reload_certificates` (or SIGHUP to the broker) does it.

- POST /api/amqp-server/reload-certificates (administrator): read the `[tls]` certificate, key
  and CA files again. Handshakes after it present the new certificate; open connections keep
  theirs. 204 when done; 400 when TLS is off or a file is unreadable or invalid (the certificate
  in use stays).
"""

from __future__ import annotations

import ssl

from aiohttp import web

from amqp_server.management import api_errors
from amqp_server.management.alarm_routes import PREFIX
from amqp_server.management.context import caller, context
from amqp_server.management.http_io import no_content


async def reload_certificates(request: web.Request) -> web.Response:
    caller(request).require_admin()
    tls = context(request).tls
    if tls is None:
        raise api_errors.bad_request("TLS is not configured: no [tls] certfile and keyfile")
    try:
        tls.reload()
    except (OSError, ssl.SSLError, ValueError) as error:
        raise api_errors.bad_request(f"certificates not reloaded, the previous ones stay in use: {error}") from None
    return no_content()


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_post(f"{PREFIX}/reload-certificates", reload_certificates)
