"""Routes that RabbitMQ tools call besides the core objects: a user's connections, topic
permissions and user limits (always empty here), feature flags, /api/auth, and the plugin
routes that must 404 as on a RabbitMQ without federation or shovel."""

from __future__ import annotations

from pamqp import commands

from tests.frame_driver import methods, opened_client
from tests.test_management_client import api, broker  # noqa: F401


def test_a_users_connections_are_listed_and_closed_together(api, broker):
    first, second = opened_client(broker), opened_client(broker)
    listed = api.get("/api/connections/username/guest")
    assert len(listed) == 2 and {c["user"] for c in listed} == {"guest"}
    assert api.get("/api/connections/username/guest", user="mon", password="mon") == listed
    # A management user sees only their own connections; an unknown user has none.
    assert api.get("/api/connections/username/guest", user="mgmt", password="mgmt") == []
    assert api.get("/api/connections/username/nobody") == []
    assert api.request("DELETE", "/api/connections/username/guest", user="mgmt", password="mgmt").status == 401
    reply = api.request("DELETE", "/api/connections/username/guest", headers={"X-Reason": "rotate"})
    assert reply.status == 204
    for client in (first, second):
        [close] = methods(client.take())
        assert isinstance(close, commands.Connection.Close)
        assert (close.reply_code, close.reply_text) == (320, "CONNECTION_FORCED - rotate")
    assert api.request("DELETE", "/api/connections/username/nobody").status == 204


def test_topic_permissions_and_user_limits_are_empty_lists(api, broker):
    assert api.get("/api/users/guest/topic-permissions") == []
    assert api.get("/api/vhosts/%2F/topic-permissions") == []
    assert api.request("GET", "/api/users/nobody/topic-permissions").status == 404
    assert api.request("GET", "/api/vhosts/novh/topic-permissions").status == 404
    denied = api.request("GET", "/api/users/guest/topic-permissions", user="mon", password="mon")
    assert (denied.status, denied.json()["reason"]) == (401, "Not administrator user")
    assert api.get("/api/user-limits/guest", user="mgmt", password="mgmt") == []
    assert api.request("GET", "/api/user-limits/nobody").status == 404


def test_feature_flags_list_what_the_broker_does(api, broker):
    flags = {flag["name"]: flag for flag in api.get("/api/feature-flags")}
    assert flags["virtual_host_metadata"]["state"] == "enabled"
    assert flags["implicit_default_bindings"] == {
        "name": "implicit_default_bindings",
        "desc": "Default bindings are now implicit, instead of being stored in the database",
        "doc_url": "", "state": "enabled", "stability": "stable", "provided_by": "rabbit"}
    assert api.request("GET", "/api/feature-flags", user="mon", password="mon").status == 401


def test_auth_needs_no_credentials(api, broker):
    reply = api.request("GET", "/api/auth", user="")
    assert (reply.status, reply.json()) == (200, {"enable_uaa": False, "uaa_client_id": "", "uaa_location": ""})


def test_federation_and_shovel_routes_are_absent_as_without_the_plugins(api, broker):
    for path in ("/api/federation-links", "/api/shovels"):
        reply = api.request("GET", path)
        assert (reply.status, reply.json()) == (404, {"error": "Object Not Found", "reason": "Not Found"})


def test_only_rabbitmqs_paginated_lists_answer_page_with_a_page_object(api, broker):
    opened_client(broker)
    for path in ("/api/vhosts", "/api/exchanges", "/api/exchanges/%2F", "/api/queues", "/api/connections",
                 "/api/channels", "/api/connections/username/guest"):
        assert api.get(path + "?page=1&page_size=1")["page_size"] == 1, path
    # RabbitMQ 3.10 ignores page (and page_size, even an out-of-range page) on these.
    for path in ("/api/bindings", "/api/bindings/%2F", "/api/consumers", "/api/users", "/api/permissions",
                 "/api/vhosts/%2F/permissions"):
        assert isinstance(api.get(path + "?page=99&page_size=1"), list), path
    assert len(api.get("/api/users?page=1&page_size=1")) == len(api.get("/api/users")) > 1
    assert api.get("/api/users?page=1&columns=name&sort=name&sort_reverse=true")[0] == {"name": "plain"}
