"""Logins of the management web UI: a session cookie, so no password stays in the browser.

The UI sends the user's name and password once (POST /api/amqp-server/session, session_routes.py);
they are checked exactly as basic auth is (caller.check_credentials: the same failed-login
throttle, loopback rule and management-tag rule). The answer sets a cookie holding a random
session token:

- `HttpOnly`: page scripts cannot read it, so an injected script cannot carry it away;
- `SameSite=Strict`: the browser does not send it with any request another site causes;
- `Secure` when the UI is served over HTTPS.

and returns a second random token, the CSRF token, in its body. A PUT, POST, PATCH or DELETE
authenticated by the cookie must carry that token in `X-CSRF-Token`: a foreign page can neither
read it nor send a custom header across origins (that needs a CORS preflight the API does not
grant). GETs change nothing (tests/test_management_get_is_safe.py) and need no token.

A session ends at logout, `SESSION_LIFETIME` after login (RabbitMQ's default
login_session_timeout), or at the first request after its user was deleted, got a new
password or lost every management tag. At most `MAX_SESSIONS` live at once; logging in beyond
that ends the oldest, so a login flood costs bounded memory.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from amqp_server.broker.access_control import AccessControl, User
from amqp_server.management import api_errors
from amqp_server.management.caller import Caller, management_caller
from amqp_server.management.request_guard import SAFE_METHODS

COOKIE_NAME = "amqp_server_session"
CSRF_HEADER = "X-CSRF-Token"
# The UI marks its requests with this header, so a 401 comes without a basic-auth challenge (which
# would make the browser open its own password dialog over the UI's login form).
UI_REQUEST_HEADER = "X-Requested-With"
SESSION_LIFETIME = 8 * 3600  # seconds: RabbitMQ's management.login_session_timeout default (480 minutes)
MAX_SESSIONS = 10_000
TOKEN_BYTES = 32


@dataclass(frozen=True)
class UiSession:
    token: str  # in the HttpOnly cookie
    csrf_token: str  # given to the page; required on writes
    user_name: str
    password_hash: str  # the user's hash at login: a new password ends the session
    expires: float  # on the sessions' clock


class UiSessions:
    """The live web UI sessions of one management app."""

    def __init__(self, lifetime: float = SESSION_LIFETIME, max_sessions: int = MAX_SESSIONS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lifetime = lifetime
        self.max_sessions = max_sessions
        self._clock = clock
        self._sessions: OrderedDict[str, UiSession] = OrderedDict()

    def start(self, user: User) -> UiSession:
        session = UiSession(secrets.token_urlsafe(TOKEN_BYTES), secrets.token_urlsafe(TOKEN_BYTES), user.name,
                            user.password_hash, self._clock() + self.lifetime)
        self._sessions[session.token] = session
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
        return session

    def find(self, token: str) -> UiSession | None:
        """The live session of a cookie's token (an expired one is forgotten)."""
        session = self._sessions.get(token)
        if session is not None and session.expires <= self._clock():
            del self._sessions[token]
            return None
        return session

    def end(self, token: str) -> None:
        self._sessions.pop(token, None)

    def caller(self, request: web.Request, access: AccessControl) -> Caller:
        """The Caller a request's session cookie stands for: 401 "Login failed" when the cookie
        names no live session or its user changed as the module says, 403 for a write without
        the session's CSRF token."""
        token = request.cookies.get(COOKIE_NAME, "")
        session = self.find(token)
        if session is None:
            raise api_errors.login_failed()
        user = access.user(session.user_name)
        if user is None or user.password_hash != session.password_hash:
            self.end(token)
            raise api_errors.login_failed()
        if request.method not in SAFE_METHODS and not hmac.compare_digest(
                request.headers.get(CSRF_HEADER, ""), session.csrf_token):
            raise api_errors.ApiError(403, "forbidden", f"missing or wrong {CSRF_HEADER} header for this session")
        return management_caller(user, access)

    def set_cookie(self, response: web.StreamResponse, session: UiSession, secure: bool) -> None:
        response.set_cookie(COOKIE_NAME, session.token, max_age=int(self.lifetime), path="/", httponly=True,
                            samesite="Strict", secure=secure)

    @property
    def count(self) -> int:
        return len(self._sessions)


def clear_session_cookie(response: web.StreamResponse) -> None:
    response.del_cookie(COOKIE_NAME, path="/")
