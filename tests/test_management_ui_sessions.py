"""The management web UI's login: a session cookie that scripts cannot read and other sites
cannot send, a CSRF token required on every write made with it, and the same password,
tag and throttle rules as basic auth."""

from __future__ import annotations

from aiohttp import web

from amqp_server.config.settings import ManagementConfig
from amqp_server.management.ui_sessions import COOKIE_NAME, UiSessions
from amqp_server.broker.access_control import User

from tests.test_management_client import ManagementClient, api, broker, broker_with_users  # noqa: F401  (fixtures)

SESSION = "/api/amqp-server/session"
UI = {"X-Requested-With": "XMLHttpRequest"}


def log_in(api, user: str = "guest", password: str = "guest"):
    """(reply, cookie header value, csrf token) of a login through the UI's route."""
    reply = api.request("POST", SESSION, {"username": user, "password": password}, user="", headers=UI)
    api.client.session.cookie_jar.clear()  # each test sends the cookie it means to, by hand
    if reply.status != 200:
        return reply, None, None
    token = reply.headers["Set-Cookie"].split(";")[0].split("=", 1)[1]
    return reply, f"{COOKIE_NAME}={token}", reply.json()["csrf_token"]


def as_session(cookie: str, csrf: str | None = None) -> dict[str, str]:
    headers = {**UI, "Cookie": cookie}
    if csrf is not None:
        headers["X-CSRF-Token"] = csrf
    return headers


def test_login_sets_a_cookie_scripts_cannot_read_and_other_sites_cannot_send(api):
    reply, cookie, csrf = log_in(api)
    assert reply.status == 200
    assert reply.json() == {"name": "guest", "tags": ["administrator"], "csrf_token": csrf}
    set_cookie = reply.headers["Set-Cookie"]
    assert "HttpOnly" in set_cookie
    assert "SameSite=Strict" in set_cookie
    assert "Path=/" in set_cookie
    assert csrf and csrf not in set_cookie, "the CSRF token is not the cookie"


def test_the_cookie_reads_the_api_and_a_write_needs_the_csrf_token(api, broker):
    _reply, cookie, csrf = log_in(api)
    overview = api.request("GET", "/api/overview", user="", headers=as_session(cookie))
    assert overview.status == 200
    refused = api.request("PUT", "/api/queues/%2F/ui-made", {"durable": True}, user="", headers=as_session(cookie))
    assert refused.status == 403
    assert refused.json() == {"error": "forbidden", "reason": "missing or wrong X-CSRF-Token header for this session"}
    wrong = api.request("PUT", "/api/queues/%2F/ui-made", {"durable": True}, user="", headers=as_session(cookie, "x" * 43))
    assert wrong.status == 403
    assert "ui-made" not in broker.vhosts["/"].queues
    made = api.request("PUT", "/api/queues/%2F/ui-made", {"durable": True}, user="", headers=as_session(cookie, csrf))
    assert made.status == 201
    assert "ui-made" in broker.vhosts["/"].queues


def test_a_session_has_its_users_rights_and_no_more(api, broker):
    _reply, cookie, csrf = log_in(api, "mgmt", "mgmt")
    assert api.request("GET", "/api/users", user="", headers=as_session(cookie)).json()["reason"] == "Not administrator user"
    broker.vhosts["/"].declare_queue("not-mgmt", connection=None)
    refused = api.request("DELETE", "/api/queues/%2F/not-mgmt", user="", headers=as_session(cookie, csrf))
    assert (refused.status, refused.json()["reason"]) == (401, "Access refused.")
    assert "not-mgmt" in broker.vhosts["/"].queues


def test_refused_logins_get_the_apis_answers_and_no_cookie(api):
    for user, password, reason in (("guest", "wrong", "Login failed"), ("nobody", "x", "Login failed"),
                                   ("plain", "plain", "Not management user")):
        reply, cookie, _csrf = log_in(api, user, password)
        assert reply.status == 401, user
        assert reply.json()["reason"] == reason
        assert "Set-Cookie" not in reply.headers
        assert "WWW-Authenticate" not in reply.headers, "the UI's login form, not the browser's dialog"


def test_ui_requests_without_a_session_get_no_basic_challenge(api):
    reply = api.request("GET", "/api/overview", user="", headers=UI)
    assert reply.status == 401
    assert "WWW-Authenticate" not in reply.headers
    assert "WWW-Authenticate" in api.request("GET", "/api/overview", user="").headers, "other clients still get it"


def test_logout_ends_the_session(api):
    _reply, cookie, csrf = log_in(api)
    assert api.request("GET", SESSION, user="", headers=as_session(cookie)).json()["csrf_token"] == csrf
    assert api.request("DELETE", SESSION, user="", headers=as_session(cookie)).status == 403, "logout needs the token too"
    out = api.request("DELETE", SESSION, user="", headers=as_session(cookie, csrf))
    assert out.status == 204
    assert f"{COOKIE_NAME}=\"\"" in out.headers["Set-Cookie"] or f"{COOKIE_NAME}=;" in out.headers["Set-Cookie"]
    after = api.request("GET", "/api/overview", user="", headers=as_session(cookie))
    assert (after.status, after.json()["reason"]) == (401, "Login failed")


def test_a_new_password_a_lost_tag_or_a_deleted_user_ends_the_session(api):
    _reply, cookie, _csrf = log_in(api, "mgmt", "mgmt")
    assert api.request("PUT", "/api/users/mgmt", {"password": "changed", "tags": "management"}).status == 204
    assert api.request("GET", "/api/overview", user="", headers=as_session(cookie)).status == 401

    _reply, cookie, _csrf = log_in(api, "mgmt", "changed")
    assert api.request("PUT", "/api/users/mgmt", {"tags": ""}).status == 204
    lost_tag = api.request("GET", "/api/overview", user="", headers=as_session(cookie))
    assert (lost_tag.status, lost_tag.json()["reason"]) == (401, "Not management user")

    assert api.request("PUT", "/api/users/mgmt", {"tags": "management"}).status == 204
    _reply, cookie, _csrf = log_in(api, "mgmt", "changed")
    assert api.request("DELETE", "/api/users/mgmt").status == 204
    assert api.request("GET", "/api/overview", user="", headers=as_session(cookie)).status == 401


def test_the_login_form_counts_failed_logins_like_basic_auth(broker):
    client = ManagementClient(broker, settings=ManagementConfig(failed_login_limit=2, failed_login_window=60))
    try:
        assert log_in(client, "guest", "bad")[0].status == 401
        assert log_in(client, "guest", "bad")[0].status == 401
        throttled, cookie, _csrf = log_in(client, "guest", "guest")
        assert throttled.status == 429
        assert throttled.json()["error"] == "too_many_requests"
        assert cookie is None
    finally:
        client.close()


def test_a_login_from_a_foreign_page_or_as_a_form_is_refused(api):
    foreign = api.request("POST", SESSION, {"username": "guest", "password": "guest"}, user="",
                          headers={"Origin": "http://evil.example"})
    assert foreign.status == 403
    as_form = api.request("POST", SESSION, user="", raw=b"username=guest&password=guest",
                          headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert as_form.status == 415
    assert "Set-Cookie" not in foreign.headers and "Set-Cookie" not in as_form.headers


def test_sessions_expire_and_are_bounded():
    now = [1000.0]
    sessions = UiSessions(lifetime=60, max_sessions=3, clock=lambda: now[0])
    user = User("u", "hash", ["management"])
    started = [sessions.start(user) for _ in range(5)]
    assert sessions.count == 3
    assert sessions.find(started[0].token) is None, "the oldest went first"
    assert sessions.find(started[4].token) == started[4]
    now[0] += 61
    assert sessions.find(started[4].token) is None
    assert len({s.token for s in started}) == 5 and len({s.csrf_token for s in started}) == 5


def test_the_cookie_is_secure_when_the_ui_is_served_over_https():
    sessions = UiSessions()
    session = sessions.start(User("u", "hash", ["management"]))
    for secure in (True, False):
        response = web.Response()
        sessions.set_cookie(response, session, secure=secure)
        cookie = response.cookies[COOKIE_NAME]
        assert bool(cookie["secure"]) is secure
        assert cookie["httponly"] and cookie["samesite"] == "Strict"
