"""The management API against what a hostile web page, a DNS-rebinding page and a password
guesser send: raw HTTP to a real broker's management port (issue 10's findings).

A web page in an operator's browser can post a form (text/plain, urlencoded or multipart, with
the page's Origin) to http://127.0.0.1:15672, and a page on a name re-pointed at 127.0.0.1
reaches the API with the attacker's name in Host. Before the fix, a text/plain POST with a
foreign Origin and Host imported definitions that created an administrator: 204.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import subprocess
from dataclasses import dataclass

import pytest

from interop_tests.broker_process import TEST_CONFIG, free_port

EVIL_DEFINITIONS = {
    "users": [{"name": "evil", "password": "evil", "tags": "administrator"}],
    "permissions": [{"user": "evil", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}],
}
# An administrator that is not in loopback_users, to tell the loopback rule from the network.
OPS_CONFIG = TEST_CONFIG + """
[[users]]
name = "ops"
password = "ops"
tags = ["administrator"]
"""


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    text: str

    def json(self):
        return json.loads(self.text)


def call(port: int, method: str, path: str, *, to: str = "127.0.0.1", source: str | None = None,
         auth: tuple[str, str] | None = ("guest", "guest"), headers: dict[str, str] | None = None,
         body: bytes | None = None) -> Reply:
    """One raw HTTP request; `source` binds the client's end to that address. A Host in
    `headers` replaces the one http.client would send."""
    connection = http.client.HTTPConnection(to, port, timeout=10, source_address=(source, 0) if source else None)
    sent = dict(headers or {})
    if auth is not None:
        sent["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    try:
        connection.request(method, path, body=body, headers=sent)
        response = connection.getresponse()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read().decode())
    finally:
        connection.close()


def user_names(port: int) -> list[str]:
    return [user["name"] for user in call(port, "GET", "/api/users").json()]


@pytest.fixture
def api_port(broker_factory) -> int:
    port = free_port()
    broker_factory(extra_args=("--management-port", str(port)))
    return port


def test_a_cross_site_text_plain_definitions_import_is_415_and_creates_no_user(api_port):
    body = json.dumps(EVIL_DEFINITIONS).encode()
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "text/plain;charset=UTF-8"):
        reply = call(api_port, "POST", "/api/definitions", headers={"Content-Type": content_type}, body=body)
        assert (reply.status, reply.text) == (415, ""), content_type
    # The finding's request exactly: text/plain, a foreign Origin and a foreign Host.
    finding = call(api_port, "POST", "/api/definitions", body=body, headers={
        "Content-Type": "text/plain", "Origin": "http://rebind.evil.example", "Host": f"rebind.evil.example:{api_port}"})
    assert finding.status == 403
    assert "evil" not in user_names(api_port)
    accepted = call(api_port, "POST", "/api/definitions", body=b"{}", headers={"Content-Type": "application/json"})
    assert accepted.status == 204, "what rabbitmqadmin and amqp-server ctl send still works"


def test_a_foreign_host_is_refused_so_a_rebinding_page_reads_nothing(api_port):
    for path in ("/api/overview", "/api/users", "/api/definitions"):
        reply = call(api_port, "GET", path, headers={"Host": f"rebind.evil.example:{api_port}"})
        assert reply.status == 403, path
        assert reply.json() == {"error": "forbidden", "reason": (
            f"Host 'rebind.evil.example:{api_port}' is not a name of this management API; "
            "add it to [management] allowed_hosts (--management-allowed-hosts)")}
    for host in (f"127.0.0.1:{api_port}", f"localhost:{api_port}", f"{socket.gethostname()}:{api_port}"):
        assert call(api_port, "GET", "/api/overview", headers={"Host": host}).status == 200, host


def test_a_configured_host_name_is_served(broker_factory):
    port = free_port()
    broker_factory(extra_args=("--management-port", str(port), "--management-allowed-hosts", "mq.example.com"))
    assert call(port, "GET", "/api/overview", headers={"Host": f"mq.example.com:{port}"}).status == 200
    assert call(port, "GET", "/api/overview", headers={"Host": f"other.example.com:{port}"}).status == 403


def test_a_foreign_origin_may_not_change_state(api_port):
    json_type = {"Content-Type": "application/json"}
    page = {**json_type, "Origin": "http://evil.example"}
    reply = call(api_port, "PUT", "/api/users/evil", headers=page, body=b'{"password": "evil", "tags": "administrator"}')
    assert reply.status == 403
    assert reply.json()["reason"].startswith("Origin 'http://evil.example' may not change state")
    assert call(api_port, "DELETE", "/api/users/guest", headers={"Origin": "null"}).status == 403
    users = user_names(api_port)
    assert "guest" in users and "evil" not in users
    same_page = {**json_type, "Origin": f"http://127.0.0.1:{api_port}"}
    assert call(api_port, "PUT", "/api/vhosts/from-own-page", headers=same_page, body=b"{}").status == 201


def non_loopback_address() -> str:
    """An IPv4 address of this machine that is not loopback (127.0.0.2 would still count as loopback)."""
    candidates: list[str] = []
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.255", 9))  # no packet is sent: this only picks the route's source address
        candidates.append(probe.getsockname()[0])
    except OSError:
        pass
    finally:
        probe.close()
    try:
        shown = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"],
                               capture_output=True, text=True, timeout=5).stdout
        candidates += [line.split()[3].split("/")[0] for line in shown.splitlines() if len(line.split()) > 3]
    except OSError:
        pass
    for address in candidates:
        if not address.startswith("127.") and address != "0.0.0.0":
            return address
    raise AssertionError("this machine has no non-loopback IPv4 address to test from "
                         "(tests/test_management_auth.py checks the rule with a fake peer address)")


def test_guest_from_a_non_loopback_address_gets_rabbitmqs_refusal(broker_factory):
    port = free_port()
    broker_factory(OPS_CONFIG, extra_args=("--host", "0.0.0.0", "--management-port", str(port)))
    address = non_loopback_address()
    refused = call(port, "GET", "/api/overview", to=address)
    assert (refused.status, refused.json()) == (401, {"error": "not_authorised", "reason": "User can only log in via localhost"})
    assert "www-authenticate" not in refused.headers, "RabbitMQ sends no challenge with this refusal"
    import_attempt = call(port, "POST", "/api/definitions", to=address, body=json.dumps(EVIL_DEFINITIONS).encode(),
                          headers={"Content-Type": "application/json"})
    assert import_attempt.status == 401
    assert call(port, "GET", "/api/overview", to=address, auth=("ops", "ops")).status == 200
    assert call(port, "GET", "/api/overview").status == 200, "guest from 127.0.0.1 still logs in"
    assert "evil" not in user_names(port)


def test_repeated_failed_logins_are_limited_while_another_address_logs_in(api_port):
    guesser = "127.0.0.2"  # a different client address, on every Linux loopback interface
    for n in range(10):
        reply = call(api_port, "GET", "/api/whoami", source=guesser, auth=("guest", f"guess-{n}"))
        assert reply.status == 401, n
    blocked = call(api_port, "GET", "/api/whoami", source=guesser, auth=("guest", "guest"))
    assert blocked.status == 429, "the right password is not even checked while the address is blocked"
    assert blocked.json()["error"] == "too_many_requests"
    assert 0 < int(blocked.headers["retry-after"]) <= 60
    assert call(api_port, "GET", "/api/whoami").json() == {"name": "guest", "tags": ["administrator"]}
