"""Starting from stored definitions: one stored queue that today's declare rules refuse (made by
an older version) must not stop the broker from starting, nor be forgotten."""

from __future__ import annotations

import logging

from amqp_server.broker.broker import Broker
from amqp_server.config.settings import ServerConfig
from persistence.definitions import MemoryDefinitionStore


def test_a_stored_queue_the_rules_now_refuse_is_kept_and_the_rest_comes_back(caplog):
    store = MemoryDefinitionStore()
    store.save({
        "vhosts": [{"name": "/"}],
        "queues": [
            {"name": "old-quorum", "vhost": "/", "durable": True, "auto_delete": True,
             "arguments": {"x-queue-type": "quorum"}},  # quorum queues refuse auto-delete now
            {"name": "fine", "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}},
        ],
    })
    with caplog.at_level(logging.ERROR):
        broker = Broker(ServerConfig(), store=store)
    assert "fine" in broker.vhosts["/"].queues and "old-quorum" not in broker.vhosts["/"].queues
    assert "durable queue 'old-quorum' in vhost '/' was not restored" in caplog.text
    assert "invalid property 'auto-delete'" in caplog.text
    assert sorted(q["name"] for q in store.load()["queues"]) == ["fine", "old-quorum"], "its definition is kept"
