"""A vhost's description and tags: set by PUT /api/vhosts/{v} or a definitions import, shown by
GET /api/vhosts, and kept across a restart, as in RabbitMQ 3.10."""

from __future__ import annotations

from amqp_server.broker.broker import Broker
from persistence.definitions import MemoryDefinitionStore
from tests.test_management_client import ManagementClient, api, broker  # noqa: F401


def _metadata(api: ManagementClient, name: str) -> tuple:
    shown = api.get(f"/api/vhosts/{name}")
    listed = next(v for v in api.get("/api/vhosts") if v["name"] == name)
    assert listed["description"] == shown["description"] and listed["tags"] == shown["tags"]
    assert shown["metadata"] == {"description": shown["description"], "tags": shown["tags"]}
    return shown["description"], shown["tags"]


def test_put_keeps_description_and_tags_and_a_later_put_replaces_them(api, broker):
    assert api.request("PUT", "/api/vhosts/shop", {"description": "the shop", "tags": "prod, eu"}).status == 201
    assert _metadata(api, "shop") == ("the shop", ["prod", "eu"])
    assert api.request("PUT", "/api/vhosts/shop", {"tags": ["blue"]}).status == 204
    assert _metadata(api, "shop") == ("", ["blue"])
    # RabbitMQ clears them on a PUT that leaves them out.
    api.request("PUT", "/api/vhosts/shop", {})
    assert _metadata(api, "shop") == ("", [])


def test_description_and_tags_survive_a_restart():
    store = MemoryDefinitionStore()
    first = ManagementClient(Broker(store=store))
    try:
        first.request("PUT", "/api/vhosts/shop", {"description": "the shop", "tags": "prod"}, user="guest")
    finally:
        first.close()
    assert {"name": "shop", "description": "the shop", "tags": ["prod"]} in store.load()["vhosts"]
    restarted = Broker(store=store)
    assert restarted.vhost_metadata["shop"] == {"description": "the shop", "tags": ["prod"]}
    restarted.delete_vhost("shop")
    assert "shop" not in restarted.vhost_metadata
    assert all(v["name"] != "shop" for v in store.load()["vhosts"])


def test_import_takes_3_10_and_3_11_shapes_and_export_has_names_only(api, broker):
    assert api.request("POST", "/api/definitions", {"vhosts": [
        {"name": "a", "description": "da", "tags": "x,y"},
        {"name": "b", "metadata": {"description": "db", "tags": ["z"]}},
    ]}).status == 204
    assert _metadata(api, "a") == ("da", ["x", "y"])
    assert _metadata(api, "b") == ("db", ["z"])
    # RabbitMQ 3.10 exports a vhost by name only.
    assert {"name": "a"} in api.get("/api/definitions")["vhosts"]
    # An entry without them clears them, as RabbitMQ's import does.
    api.request("POST", "/api/definitions", {"vhosts": [{"name": "a"}]})
    assert _metadata(api, "a") == ("", [])
