"""What a hostile web page in an operator's browser can send the management API, refused.

A cross-site form can only send urlencoded, multipart or text/plain bodies, carries the page's
`Origin`, and a DNS-rebinding page's requests name the attacker's host in `Host`. The
interop_tests/test_hostile_management_clients.py tests drive a real broker the same way.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from amqp_server.broker.broker import Broker
from amqp_server.config.settings import ManagementConfig
from amqp_server.management.request_guard import RequestPolicy, machine_names, split_host
from tests.test_management_client import ManagementClient, broker  # noqa: F401  (fixture)
from tests.test_management_client import api  # noqa: F401  (fixture)

EVIL_ADMIN = {"users": [{"name": "evil", "password": "evil", "tags": "administrator"}],
              "permissions": [{"user": "evil", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}]}


def forbidden(reason_start: str) -> dict:
    return {"error": "forbidden", "reason": reason_start}


# ---- bodies must be JSON ----------------------------------------------------------------


@pytest.mark.parametrize("content_type, body", [
    ("text/plain", json.dumps(EVIL_ADMIN)),
    ("text/plain; charset=utf-8", json.dumps(EVIL_ADMIN)),
    ("application/x-www-form-urlencoded", json.dumps(EVIL_ADMIN)),
    ("multipart/form-data; boundary=x",
     '--x\r\nContent-Disposition: form-data; name="file"\r\n\r\n' + json.dumps(EVIL_ADMIN) + "\r\n--x--\r\n"),
    (None, json.dumps(EVIL_ADMIN)),
])
def test_a_definitions_import_not_declared_as_json_is_415_and_creates_no_user(api, broker, content_type, body):
    headers = {"Content-Type": content_type} if content_type else {"Content-Type": ""}
    reply = api.request("POST", "/api/definitions", raw=body.encode(), headers=headers)
    assert (reply.status, reply.text) == (415, ""), "RabbitMQ 3.10: 415 with an empty body"
    assert broker.access.user("evil") is None


def test_json_with_a_charset_in_any_case_is_accepted(api, broker):
    for content_type in ("application/json; charset=utf-8", "Application/JSON"):
        reply = api.request("PUT", "/api/queues/%2F/typed-" + content_type[-4:], {"durable": False},
                            headers={"Content-Type": content_type})
        assert reply.status == 201, content_type
    assert api.request("POST", "/api/definitions", {}, headers={"Content-Type": "application/json;charset=UTF-8"}).status == 204


@pytest.mark.parametrize("method, path, created", [
    ("PUT", "/api/queues/%2F/formq", lambda b: "formq" in b.vhosts["/"].queues),
    ("PUT", "/api/users/formuser", lambda b: b.access.user("formuser") is not None),
    ("PUT", "/api/vhosts/formvhost", lambda b: "formvhost" in b.vhosts),
    ("POST", "/api/bindings/%2F/e/amq.direct/q/bound", lambda b: len(b.vhosts["/"].exchanges["amq.direct"].bindings()) > 0),
    ("POST", "/api/exchanges/%2F/amq.default/publish", lambda b: b.vhosts["/"].queues["bound"].message_count > 0),
    ("POST", "/api/users/bulk-delete", lambda b: b.access.user("mon") is None),
])
def test_every_write_with_a_non_json_body_is_415(api, broker, method, path, created):
    """RabbitMQ itself takes text/plain on these routes (only /api/definitions is strict there);
    here every body must be JSON, since a cross-site form can post text/plain."""
    broker.vhosts["/"].declare_queue("bound", connection=None)
    body = {"password": "x", "tags": "administrator", "routing_key": "bound", "payload": "x",
            "payload_encoding": "string", "properties": {}, "users": ["mon"]}
    reply = api.request(method, path, raw=json.dumps(body).encode(), headers={"Content-Type": "text/plain"})
    assert (reply.status, reply.text) == (415, "")
    assert not created(broker)


def test_requests_without_a_body_pass_as_in_rabbitmq(api, broker):
    """rabbitmqadmin and curl send no Content-Type without a body, aiohttp sends
    application/octet-stream, some clients send their usual type on every DELETE."""
    assert api.request("PUT", "/api/queues/%2F/bodyless").status == 201  # aiohttp: octet-stream, no body
    assert api.request("DELETE", "/api/queues/%2F/bodyless/contents", headers={"Content-Type": "text/plain"}).status == 204
    assert api.request("DELETE", "/api/queues/%2F/bodyless").status == 204
    assert api.request("DELETE", "/api/users/mon", raw=b"junk", headers={"Content-Type": "text/plain"}).status == 415
    assert broker.access.user("mon") is not None


def test_a_definitions_import_must_say_json_even_without_a_body(api):
    """RabbitMQ 3.10 answers 415 to a bodyless POST /api/definitions unless it says application/json."""
    for headers in ({"Content-Type": "text/plain"}, {}):
        assert api.request("POST", "/api/definitions", headers=headers).status == 415
    assert api.request("POST", "/api/definitions", headers={"Content-Type": "application/json"}).status == 204


def test_401_and_405_come_before_415_as_in_rabbitmq(api):
    wrong = api.request("POST", "/api/definitions", raw=b"{}", headers={"Content-Type": "text/plain"}, password="bad")
    assert (wrong.status, wrong.json()["reason"]) == (401, "Login failed")
    not_admin = api.request("POST", "/api/definitions", headers={"Content-Type": "text/plain"}, user="mon", password="mon")
    assert (not_admin.status, not_admin.json()["reason"]) == (401, "Not administrator user")
    assert api.request("POST", "/api/overview", raw=b"{}", headers={"Content-Type": "text/plain"}).status == 405


# ---- Host ---------------------------------------------------------------------------------


def test_a_foreign_host_is_refused_before_anything_else(api, broker, caplog):
    caplog.set_level(logging.WARNING, logger="amqp_server.management.request_guard")
    for method, path in (("GET", "/api/overview"), ("GET", "/"), ("GET", "/api/auth"), ("POST", "/api/definitions")):
        reply = api.request(method, path, EVIL_ADMIN, headers={"Host": "evil.example:15672"})
        assert reply.status == 403, path
        assert reply.json() == forbidden(
            "Host 'evil.example:15672' is not a name of this management API; "
            "add it to [management] allowed_hosts (--management-allowed-hosts)")
    assert broker.access.user("evil") is None
    assert caplog.messages == ["management API: refused requests for Host 'evil.example'; if clients use this name, "
                               "add it to [management] allowed_hosts"], "one line per name, not per request"


@pytest.mark.parametrize("host", [
    "127.0.0.1:15672", "127.0.0.1", "[::1]:15672", "192.0.2.7:15672", "[fd00::2]", "localhost:15672", "LOCALHOST.",
    "grafana.localhost:15672",
])
def test_ip_literals_and_localhost_are_always_served(api, host):
    assert api.request("GET", "/api/whoami", headers={"Host": host}).status == 200, host


def test_the_machines_own_name_is_served(api):
    for name in machine_names():
        assert api.request("GET", "/api/whoami", headers={"Host": f"{name}:15672"}).status == 200


def test_configured_names_suffixes_and_star(broker):
    client = ManagementClient(broker, settings=ManagementConfig(allowed_hosts=["mq.example.com", ".corp.example"]))
    try:
        for host in ("mq.example.com", "MQ.Example.Com.:443", "corp.example", "a.b.corp.example:15672"):
            assert client.request("GET", "/api/whoami", headers={"Host": host}).status == 200, host
        for host in ("example.com", "mq.example.com.evil", "xcorp.example", "evil.example"):
            assert client.request("GET", "/api/whoami", headers={"Host": host}).status == 403, host
    finally:
        client.close()
    anything = RequestPolicy(["*"], own_names=[])
    assert anything.allows_host("whatever.example")


def test_split_host_reads_every_form_of_host_header():
    assert split_host("MQ.example.com.:15672") == ("mq.example.com", 15672)
    assert split_host("[::1]:15672") == ("::1", 15672)
    assert split_host("[::1]") == ("::1", None)
    assert split_host("::1") == ("::1", None)
    assert split_host("name:notaport") == ("name", None)


# ---- Origin -------------------------------------------------------------------------------


def test_a_foreign_origin_may_not_change_state(api, broker):
    for origin in ("http://evil.example", "null", f"http://127.0.0.1:{api.client.server.port + 1}",
                   f"https://127.0.0.1:{api.client.server.port}x"):
        reply = api.request("PUT", "/api/queues/%2F/from-page", {"durable": False}, headers={"Origin": origin})
        assert reply.status == 403, origin
        assert reply.json()["reason"].startswith(f"Origin '{origin}' may not change state")
    assert "from-page" not in broker.vhosts["/"].queues
    assert api.request("DELETE", "/api/users/mon", headers={"Origin": "http://evil.example"}).status == 403
    assert broker.access.user("mon") is not None


def test_a_foreign_origin_may_still_read(api):
    assert api.request("GET", "/api/overview", headers={"Origin": "http://evil.example"}).status == 200


def test_the_apis_own_origin_and_configured_ones_may_change_state(broker):
    client = ManagementClient(broker, settings=ManagementConfig(allowed_origins=["https://ops.example.com"]))
    port = client.client.server.port
    try:
        for n, origin in enumerate((f"http://127.0.0.1:{port}", f"http://LOCALHOST:{port}", "https://ops.example.com",
                                    "https://ops.example.com:443")):
            host = f"localhost:{port}" if "LOCALHOST" in origin else f"127.0.0.1:{port}"
            reply = client.request("PUT", f"/api/queues/%2F/page-{n}", {}, headers={"Origin": origin, "Host": host})
            assert reply.status == 201, origin
        assert client.request("PUT", "/api/queues/%2F/x", {}, headers={"Origin": "https://ops.example.com:8443"}).status == 403
    finally:
        client.close()
    behind_proxy = RequestPolicy(own_names=[])
    assert behind_proxy.allows_origin("https://mq.example.com", "mq.example.com")
    assert not behind_proxy.allows_origin("https://mq.example.com.evil", "mq.example.com")
    assert not behind_proxy.allows_origin("http://mq.example.com:8080", "mq.example.com"), "another port's page"
    assert RequestPolicy(allowed_origins=["*"], own_names=[]).allows_origin("null", None)


# ---- guest from elsewhere and failed logins ------------------------------------------------------


@pytest.fixture
def strict_api(broker: Broker) -> Iterator[ManagementClient]:
    client = ManagementClient(broker, settings=ManagementConfig(failed_login_limit=3, failed_login_window=60))
    yield client
    client.close()


def test_failed_logins_from_one_address_get_429_even_with_the_right_password(strict_api, broker):
    for _ in range(3):
        assert strict_api.request("GET", "/api/whoami", password="guess").status == 401
    refused = strict_api.request("GET", "/api/whoami")
    assert refused.status == 429
    assert refused.json() == {"error": "too_many_requests",
                              "reason": f"Too many failed logins from this address; retry in {refused.headers['Retry-After']} s"}
    assert 0 < int(refused.headers["Retry-After"]) <= 60
    no_credentials = strict_api.request("GET", "/api/whoami", user="")
    assert no_credentials.status == 401 and "WWW-Authenticate" in no_credentials.headers


def test_requests_without_credentials_are_not_counted_as_failures(strict_api):
    for _ in range(5):
        assert strict_api.request("GET", "/api/whoami", user="").status == 401
    assert strict_api.request("GET", "/api/whoami").status == 200


def test_failed_login_limit_0_turns_the_limit_off(broker):
    client = ManagementClient(broker, settings=ManagementConfig(failed_login_limit=0))
    try:
        for _ in range(30):
            assert client.request("GET", "/api/whoami", password="guess").status == 401
        assert client.request("GET", "/api/whoami").status == 200
    finally:
        client.close()
