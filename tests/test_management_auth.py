"""Who may use the management API, and what each user tag sees and may change."""

from __future__ import annotations

import base64

import pytest
from pamqp import commands

from amqp_server.management.api_errors import ApiError
from amqp_server.management.caller import authenticate
from amqp_server.management.login_throttle import LoginThrottle

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
    guests = opened_client(broker)
    guests.send(1, commands.Basic.Consume(queue="mgmt-visible", consumer_tag="guests"))
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
    assert api.get("/api/consumers", **as_mgmt) == [], "guest's consumer is on guest's connection"
    assert [c["consumer_tag"] for c in api.get("/api/consumers")] == ["guests"]

    as_monitor = {"user": "mon", "password": "mon"}
    assert sorted(c["user"] for c in api.get("/api/connections", **as_monitor)) == ["guest", "mgmt"]


def test_monitoring_users_list_every_vhost_but_see_inside_only_where_they_have_permissions(api, broker):
    """As RabbitMQ 3.10 answers a monitoring user without permissions (checked side by side)."""
    broker.vhosts["/"].declare_queue("jobs", connection=None)
    as_monitor = {"user": "mon", "password": "mon"}
    assert [v["name"] for v in api.get("/api/vhosts", **as_monitor)] == ["/", "other"]
    assert api.get("/api/queues", **as_monitor) == [] and api.get("/api/exchanges", **as_monitor) == []
    for path in ("/api/queues/%2F", "/api/queues/%2F/jobs", "/api/exchanges/%2F/amq.direct", "/api/bindings/%2F",
                 "/api/aliveness-test/%2F"):
        refused = api.request("GET", path, **as_monitor)
        assert (refused.status, refused.json()) == (401, {
            "error": "not_authorised", "reason": "User not authorised to access virtual host"}), path

    broker.access.set_permissions("mon", "/", "", "", ".*")
    assert [q["name"] for q in api.get("/api/queues", **as_monitor)] == ["jobs"]
    assert api.get("/api/queues/%2F/jobs", **as_monitor)["name"] == "jobs"
    # The aliveness test declares, publishes to and reads a queue: read permission is not enough.
    refused = api.request("GET", "/api/aliveness-test/%2F", **as_monitor)
    assert (refused.status, refused.json()["reason"]) == (
        401, "ACCESS_REFUSED - access to queue 'aliveness-test' in vhost '/' refused for user 'mon'")


def test_a_single_vhost_is_shown_to_administrators_only(api):
    refused = api.request("GET", "/api/vhosts/%2F", user="mgmt", password="mgmt")
    assert (refused.status, refused.json()["reason"]) == (401, "Not administrator user")
    assert api.get("/api/vhosts/%2F")["name"] == "/"


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


def test_guest_is_refused_from_a_remote_address_with_rabbitmqs_reason(broker):
    """RabbitMQ 3.10 over HTTP from a non-loopback address: guest:guest gets 401 "User can only
    log in via localhost" (no challenge); a wrong password still gets "Login failed"."""
    header = "Basic " + base64.b64encode(b"guest:guest").decode()
    throttle = LoginThrottle(limit=10, window=60)
    assert authenticate(broker.access, header, "127.0.0.1", throttle).name == "guest"
    assert authenticate(broker.access, header, "::ffff:127.0.0.1", throttle).name == "guest"
    for remote in ("10.1.2.3", "::ffff:10.1.2.3", "2001:db8::1"):
        with pytest.raises(ApiError) as refused:
            authenticate(broker.access, header, remote, throttle)
        assert (refused.value.status, refused.value.body()) == (
            401, {"error": "not_authorised", "reason": "User can only log in via localhost"}), remote
    wrong = "Basic " + base64.b64encode(b"guest:wrong").decode()
    with pytest.raises(ApiError) as refused:
        authenticate(broker.access, wrong, "10.1.2.3", throttle)
    assert refused.value.body() == {"error": "not_authorized", "reason": "Login failed"}
