"""The management HTTP API as an aiohttp application (RabbitMQ's rabbitmq_management, /api/...),
and the web UI that uses it (web_ui.py, served at /).

It runs on the broker's event loop: handlers read and change broker objects directly, between
two AMQP events, with no locking. Every request must name the API in `Host`, and a
state-changing one must come from no web page or an allowed one and carry JSON
(request_guard.py); every /api request needs basic auth (caller.py) or the web UI's session
cookie (ui_sessions.py, with its CSRF token on writes). Errors come back as RabbitMQ's
`{"error", "reason"}` JSON. docs/management-api.md lists the routes, docs/management-ui.md
describes the UI.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from amqp_server.config.settings import ManagementConfig
from amqp_server.wire.errors import AMQPError
from amqp_server.management import (
    alarm_routes,
    binding_routes,
    connection_routes,
    definition_routes,
    exchange_routes,
    feature_routes,
    federation_routes,
    limit_routes,
    overview_routes,
    parameter_routes,
    policy_routes,
    queue_routes,
    replication_routes,
    session_routes,
    shovel_routes,
    tls_routes,
    user_routes,
    vhost_routes,
)
from amqp_server.management.api_errors import REALM, ApiError, from_amqp_error, not_found, not_stored
from amqp_server.management.caller import Caller, authenticate
from amqp_server.management.context import CALLER_KEY, CONTEXT_KEY, ManagementContext, context
from amqp_server.management.http_io import dumps
from amqp_server.management.login_throttle import LoginThrottle
from amqp_server.management.request_guard import (
    RequestPolicy,
    check_host_and_origin,
    json_body_refused,
    unsupported_media_type,
)
from amqp_server.management.ui_sessions import COOKIE_NAME, UI_REQUEST_HEADER, UiSessions
from amqp_server.management.web_ui import WebUi
from amqp_server.metrics.broker_view import process_stats_of
from amqp_server.metrics.process_stats import ProcessStats

if TYPE_CHECKING:
    from amqp_server.broker.broker import Broker
    from amqp_server.config.tls import TlsListenerContext

# Definitions files of large brokers run to megabytes; aiohttp's default cap is 1 MiB.
MAX_REQUEST_BYTES = 64 * 1024 * 1024
ROUTE_MODULES = (
    overview_routes, vhost_routes, user_routes, connection_routes, exchange_routes, queue_routes, binding_routes,
    definition_routes, alarm_routes, feature_routes, tls_routes, session_routes, policy_routes, limit_routes,
    replication_routes, parameter_routes, shovel_routes, federation_routes,
)
# Answered without credentials, as RabbitMQ does (the web UI asks before it logs in).
PUBLIC_PATHS = frozenset({feature_routes.AUTH_PATH})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error_response(error: ApiError, request: web.Request) -> web.Response:
    headers = dict(error.headers)
    if error.status == 401 and error.error == "not_authorized" and UI_REQUEST_HEADER not in request.headers:
        headers["WWW-Authenticate"] = REALM
    return web.json_response(error.body(), status=error.status, headers=headers, dumps=dumps)


@web.middleware
async def api_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse requests from names and web pages the API does not serve, authenticate /api
    requests, refuse non-JSON bodies (in RabbitMQ's order: 401 before 415), and turn every
    refusal into RabbitMQ's JSON error."""
    ctx = context(request)
    try:
        check_host_and_origin(ctx.request_policy, request)
        if request.path.startswith("/api/") and request.path not in PUBLIC_PATHS and not session_routes.is_public(request):
            request[CALLER_KEY] = _identify(ctx, request)
        # An unknown path or method answers 404/405 from the handler, before any 415.
        if request.match_info.http_exception is None and json_body_refused(request):
            return unsupported_media_type()
        changes_before = ctx.broker.definition_changes
        response = await handler(request)
        if request.method not in ("GET", "HEAD"):
            # A change the answer reports (a queue, a user, an import) is on disk (and, in a
            # cluster, committed in the coordination service) first.
            try:
                await ctx.broker.definitions_durable(changes_before)
            except AMQPError:
                raise  # a lost declare race: answered as the refusal it is
            except Exception as error:  # the disk, or the cluster's coordination service, failed
                raise not_stored(ctx.broker.definitions_failure, error) from None
        return response
    except ApiError as error:
        return _error_response(error, request)
    except AMQPError as error:
        return _error_response(from_amqp_error(error), request)
    except web.HTTPNotFound:
        return _error_response(not_found(), request)
    except web.HTTPMethodNotAllowed as error:
        return web.json_response({"error": "Method Not Allowed", "reason": f"{request.method} not allowed"},
                                 status=405, headers={"Allow": ",".join(sorted(error.allowed_methods))})


def _identify(ctx: ManagementContext, request: web.Request) -> Caller:
    """Basic auth when the request has an Authorization header, else the web UI's session cookie."""
    authorization = request.headers.get("Authorization")
    if authorization is None and COOKIE_NAME in request.cookies:
        return ctx.ui_sessions.caller(request, ctx.broker.access)
    return authenticate(ctx.broker.access, authorization, request.remote, ctx.login_throttle)


def build_management_app(
    broker: "Broker",
    process_stats: Callable[[], ProcessStats] | None = None,
    listeners: list[dict[str, Any]] | None = None,
    sample_rates: bool = True,
    settings: ManagementConfig | None = None,
    tls: "TlsListenerContext | None" = None,
) -> web.Application:
    """The aiohttp application. `listeners` is what /api/overview reports; `sample_rates=False` leaves every rate
    at 0.0 (tests that must not depend on timing); `settings` is the `[management]` configuration (its
    defaults when None)."""
    if process_stats is None:
        process_stats = lambda: process_stats_of(broker)  # noqa: E731
    settings = settings or ManagementConfig()
    ctx = ManagementContext(
        broker, process_stats,
        request_policy=RequestPolicy(settings.allowed_hosts, settings.allowed_origins),
        login_throttle=LoginThrottle(settings.failed_login_limit, settings.failed_login_window),
        ui_sessions=UiSessions(),
        listeners=listeners or [],
        tls=tls,
    )
    app = web.Application(middlewares=[api_middleware], client_max_size=MAX_REQUEST_BYTES)
    app[CONTEXT_KEY] = ctx
    WebUi().add_routes(app.router)
    for module in ROUTE_MODULES:
        module.add_routes(app.router)
    if sample_rates:
        app.cleanup_ctx.append(_rate_sampling(ctx))
    return app


def _rate_sampling(ctx: ManagementContext) -> Callable[[web.Application], AsyncIterator[None]]:
    async def run(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(ctx.rates.run(ctx.rate_samples))
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return run
