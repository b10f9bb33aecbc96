"""A page of the queue list costs that page: with 10,000 queues, the web UI's list (paged,
sorted by name, filtered) builds only the queues it shows, and answers exactly what building
every queue would."""

from __future__ import annotations

import re
import urllib.parse

import pytest

from amqp_server.management import queue_routes

from tests.test_management_client import api, broker  # noqa: F401  (fixtures)

QUEUES = 3_000


@pytest.fixture
def many_queues(broker):
    for n in range(QUEUES):
        broker.vhosts["/" if n % 3 else "other"].declare_queue(f"q-{n:05d}", connection=None)
    return broker


def test_a_page_builds_only_its_queues(api, many_queues, monkeypatch):
    built = []
    real = queue_routes.queue_json
    monkeypatch.setattr(queue_routes, "queue_json", lambda *args: built.append(args[1].name) or real(*args))
    page = api.get("/api/queues?page=3&page_size=50&sort=name&name=q-01&columns=name,vhost,messages")
    assert [item["name"] for item in page["items"]] == [f"q-{n:05d}" for n in range(1100, 1150)]
    assert (page["filtered_count"], page["total_count"], page["page_count"]) == (1000, QUEUES, 20)
    assert len(built) == 50


@pytest.mark.parametrize("sort, page, size, name", [
    ("", 1, 100, ""),
    ("sort=name&sort_reverse=true", 7, 20, ""),
    ("sort=vhost", 2, 500, ""),
    ("sort=vhost&sort_reverse=true", 1, 30, "q-00[12]"),
    ("sort=name", 4, 10, "9"),
])
def test_a_built_page_is_that_page_of_the_whole_list(api, many_queues, sort, page, size, name):
    """The page equals the same page cut from the unpaged list, which builds every queue."""
    regex = name.startswith("q-")
    whole = api.get(f"/api/queues?{sort}&columns=vhost,name")
    matching = [q for q in whole if (re.search(name, q["name"]) if regex else name in q["name"])]
    query = f"{sort}&page={page}&page_size={size}&columns=vhost,name"
    if name:
        query += f"&name={urllib.parse.quote(name)}&use_regex={'true' if regex else 'false'}"
    paged = api.get(f"/api/queues?{query}")
    assert paged["items"] == matching[(page - 1) * size: page * size]
    assert (paged["filtered_count"], paged["total_count"]) == (len(matching), QUEUES)
