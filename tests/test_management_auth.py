"""Who may use the management API, and what each user tag sees and may change."""

from __future__ import annotations

from pamqp import commands

from tests.frame_driver import FakeClient, opened_client
from tests.test_management_client import api, broker  # noqa: F401  (fixtures)


def test_missing_or_wrong_credentials_get_401_with_a_basic_challenge(api):
    for user, password in (("", ""), ("guest", "wrong"), ("nobody", "x")):
        reply = api.request("GET", "/api/overview", user=user, password=password)
        assert reply.status == 401
        assert reply.json() == {"error": "not_authorized", "reason": "Login failed"}
        assert reply.headers["WWW-Authenticate"] == 'Basic realm="RabbitMQ Management"'


def test_a_user_without_a_management_tag_is_refused(api):
    reply = api.request("GET", "/api/overview", user="plain", password="plain")
    assert reply.status == 401
    assert reply.json() == {"error": "not_authorised", "reason": "Not management user"}


def test_whoami_names_the_user_and_tags(api):
    assert api.get("/api/whoami", user="mon", password="mon") == {"name": "mon", "tags": ["monitoring"]}


def test_only_administrators_list_users_and_permissions(api):
    for path in ("/api/users", "/api/permissions", "/api/definitions"):
        reply = api.request("GET", path, user="mgmt", password="mgmt")
        assert reply.status == 401, path
        assert reply.json()["reason"] == "Not administrator user"
        assert api.request("GET", path).status == 200


def test_management_users_see_only_their_vhosts_and_connections(api, broker):
    broker.vhosts["other"].declare_queue("hidden", connection=None)
    broker.vhosts["/"].declare_queue("mgmt-visible", connection=None)
    opened_client(broker)  # guest's connection
    mine = FakeClient(broker)
    mine.start()
    mine.start_ok(user="mgmt", password="mgmt")
    mine.send(0, commands.Connection.TuneOk(channel_max=10, frame_max=131072, heartbeat=0))
    mine.send(0, commands.Connection.Open(virtual_host="/"))

    as_mgmt = {"user": "mgmt", "password": "mgmt"}
    assert [v["name"] for v in api.get("/api/vhosts", **as_mgmt)] == ["/"]
    assert [q["name"] for q in api.get("/api/queues", **as_mgmt)] == ["mgmt-visible"]
    assert [c["user"] for c in api.get("/api/connections", **as_mgmt)] == ["mgmt"]
    assert api.request("GET", "/api/queues/other", **as_mgmt).status == 401

    as_monitor = {"user": "mon", "password": "mon"}
    assert {q["name"] for q in api.get("/api/queues", **as_monitor)} == {"mgmt-visible", "hidden"}
    assert sorted(c["user"] for c in api.get("/api/connections", **as_monitor)) == ["guest", "mgmt"]


def test_monitoring_may_read_but_not_write(api):
    as_monitor = {"user": "mon", "password": "mon"}
    assert api.request("GET", "/api/nodes", **as_monitor).status == 200
    assert api.request("PUT", "/api/vhosts/new", **as_monitor).status == 401
    assert api.request("PUT", "/api/users/eve", {"password": "x", "tags": ""}, **as_monitor).status == 401
    # Declaring needs AMQP configure permission, which mon has nowhere.
    assert api.request("PUT", "/api/queues/%2F/q", {}, **as_monitor).status == 401


def test_queue_writes_follow_the_users_amqp_permissions(api, broker):
    as_mgmt = {"user": "mgmt", "password": "mgmt"}
    assert api.request("PUT", "/api/queues/%2F/mgmt-jobs", {}, **as_mgmt).status == 201
    refused = api.request("PUT", "/api/queues/%2F/jobs", {}, **as_mgmt)
    assert refused.status == 401
    assert refused.json() == {"error": "not_authorised", "reason": "Access refused."}
    assert "jobs" not in broker.vhosts["/"].queues
    assert api.request("DELETE", "/api/queues/%2F/mgmt-jobs", **as_mgmt).status == 204


def test_guest_is_refused_from_a_remote_address(broker):
    from amqp_server.management.caller import authenticate
    from amqp_server.management.api_errors import ApiError
    import base64
    header = "Basic " + base64.b64encode(b"guest:guest").decode()
    assert authenticate(broker.access, header, "127.0.0.1").name == "guest"
    assert authenticate(broker.access, header, "::ffff:127.0.0.1").name == "guest"
    try:
        authenticate(broker.access, header, "10.1.2.3")
    except ApiError as error:
        assert error.status == 401
    else:
        raise AssertionError("guest logged in from a remote address")
