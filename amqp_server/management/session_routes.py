"""/api/amqp-server/session: the management web UI logs in, asks who it is, and logs out.

- POST `{"username", "password"}` (no credentials needed): checked as basic auth is; 200
  `{"name", "tags", "csrf_token"}` and the session cookie (ui_sessions.py), or the API's 401/429.
- GET (basic auth or the cookie): `{"name", "tags", "csrf_token"}`, the token null without a
  session; the UI asks this after a reload, as the token lives only in the page.
- DELETE (the cookie and its CSRF token): ends the session and clears the cookie; 204.

These routes are this broker's own (RabbitMQ's UI keeps the password in browser storage and
sends basic auth with every request).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from amqp_server.management import api_errors
from amqp_server.management.caller import Caller, check_credentials
from amqp_server.management.context import caller, context
from amqp_server.management.http_io import json_reply, no_content, read_body
from amqp_server.management.ui_sessions import COOKIE_NAME, clear_session_cookie

SESSION_PATH = "/api/amqp-server/session"


def _session_json(user: Caller, csrf_token: str | None) -> dict[str, Any]:
    return {"name": user.name, "tags": user.tags, "csrf_token": csrf_token}


async def log_in(request: web.Request) -> web.Response:
    ctx = context(request)
    body = await read_body(request)
    name, password = body.get("username"), body.get("password")
    if not isinstance(name, str) or not isinstance(password, str):
        raise api_errors.bad_request("username and password must be strings")
    user = check_credentials(ctx.broker.access, name, password, request.remote, ctx.login_throttle)
    session = ctx.ui_sessions.start(user.user)
    response = json_reply(_session_json(user, session.csrf_token))
    ctx.ui_sessions.set_cookie(response, session, secure=request.secure)
    return response


async def who_is_logged_in(request: web.Request) -> web.Response:
    session = context(request).ui_sessions.find(request.cookies.get(COOKIE_NAME, ""))
    user = caller(request)
    own_session = session is not None and session.user_name == user.name
    return json_reply(_session_json(user, session.csrf_token if session is not None and own_session else None))


async def log_out(request: web.Request) -> web.Response:
    context(request).ui_sessions.end(request.cookies.get(COOKIE_NAME, ""))
    response = no_content()
    clear_session_cookie(response)
    return response


def is_public(request: web.Request) -> bool:
    """The login itself needs no credentials."""
    return request.method == "POST" and request.path == SESSION_PATH


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_post(SESSION_PATH, log_in)
    router.add_get(SESSION_PATH, who_is_logged_in)
    router.add_delete(SESSION_PATH, log_out)
