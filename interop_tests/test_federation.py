"""Federation between two of this project's brokers: upstreams and policies over the HTTP API,
exchange federation (bindings propagated upstream, x-received-from, max-hops and loops), queue
federation (consumer demand), link status, and bad input.

The upstream ("up") and the downstream ("down") are separate broker processes on free ports;
down federates from up. RabbitMQ as a peer is interop_tests/test_federation_rabbitmq.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from interop_tests.federation_helpers import (
    Site,
    consume_messages,
    declare,
    get_all,
    launch_site,
    publish_confirmed,
    quote,
)
from interop_tests.waiting import poll, wait_until


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Site, Site]]:
    tmp = tmp_path_factory.mktemp("federation")
    up = launch_site(tmp / "up")
    down = launch_site(tmp / "down")
    try:
        yield up, down
    finally:
        down.broker.stop()
        up.broker.stop()


def cluster_name(site: Site) -> str:
    return site.get("/api/cluster-name")["name"]


def test_a_federated_exchange_receives_what_its_bindings_ask_for_from_upstream(pair, unique):
    up, down = pair
    exchange, queue = unique("fed.x"), unique("fed-q")
    down.set_upstream(unique("u"), {"uri": up.amqp_url})
    down.set_policy(unique("p"), f"^{exchange}$", {"federation-upstream": unique("u")}, apply_to="exchanges")
    declare(up, exchange=exchange)
    declare(down, exchange=exchange, queue=queue, binding="a.#")
    link = down.wait_running("exchange", exchange)
    assert link["upstream_exchange"] == exchange and link["uri"] == up.amqp_url.replace("guest:guest@", "")
    # RabbitMQ's names on the upstream: the queue, and its internal exchange bound with our key
    upstream_queue = f"federation: {exchange} -> {cluster_name(down)}"
    assert up.get(f"/api/queues/%2F/{quote(upstream_queue)}")["arguments"] == {"x-internal-purpose": "federation"}
    bound = wait_until(lambda: [b for b in up.get(f"/api/exchanges/%2F/{quote(exchange)}/bindings/source")
                                if b["routing_key"] == "a.#"], "the binding propagated upstream")
    assert bound[0]["destination"] == f"{upstream_queue} A"
    assert bound[0]["arguments"]["x-bound-from"] == [
        {"cluster-name": cluster_name(down), "vhost": "/", "exchange": f"/:{exchange} A", "hops": 1}]
    publish_confirmed(up, exchange, "a.b", [b"wanted"], headers={"h": 7})
    publish_confirmed(up, exchange, "c.d", [b"not bound here"])
    [(body, headers)] = get_all(down, queue, 1)
    assert body == b"wanted" and headers["h"] == 7
    assert headers["x-received-from"] == [{"uri": up.amqp_url.replace("guest:guest@", ""),
                                           "exchange": exchange, "redelivered": False,
                                           "cluster-name": cluster_name(up), "vhost": "/"}]
    assert poll(lambda: up.get(f"/api/queues/%2F/{quote(upstream_queue)}")["messages"] == 0, 5)
    assert not get_all_nowait(down, queue), "c.d matches no binding here: it never crossed"


def get_all_nowait(site: Site, queue: str) -> list[bytes]:
    connection = site.connection()
    try:
        method, _properties, body = connection.channel().basic_get(queue, auto_ack=True)
        return [] if method is None else [body]
    finally:
        connection.close()


def test_an_unbound_key_stops_crossing_and_the_upstream_binding_goes_with_the_last(pair, unique):
    up, down = pair
    exchange, first, second = unique("fed.x"), unique("q1"), unique("q2")
    down.set_upstream(unique("u"), {"uri": up.amqp_url})
    down.set_policy(unique("p"), f"^{exchange}$", {"federation-upstream": unique("u")})
    declare(up, exchange=exchange)
    declare(down, exchange=exchange, queue=first, binding="k")
    declare(down, queue=second)
    connection = down.connection()
    connection.channel().queue_bind(second, exchange, "k")
    down.wait_running("exchange", exchange)

    def upstream_keys() -> list[str]:
        return sorted(b["routing_key"] for b in up.get(f"/api/exchanges/%2F/{quote(exchange)}/bindings/source"))

    wait_until(lambda: upstream_keys() == ["k"], "one upstream binding for two local ones")
    channel = connection.channel()
    channel.queue_unbind(first, exchange, "k")
    assert poll(lambda: upstream_keys() == ["k"], 1), "still needed by the second queue"
    channel.queue_delete(second)  # its binding goes with it
    wait_until(lambda: upstream_keys() == [], "the upstream binding removed with the last local one")
    connection.close()


def test_confirms_coming_out_of_order_downstream_still_ack_everything_upstream(pair, unique):
    # Downstream, a persistent message for a durable queue is confirmed after its fsync, one
    # for a transient queue at once: single confirms pass each other, and the link must
    # settle each (and ack upstream only what is confirmed) however they come.
    up, down = pair
    exchange, on_disk, in_memory = unique("fed.x"), unique("disk-q"), unique("memory-q")
    down.set_upstream(unique("u"), {"uri": up.amqp_url, "prefetch-count": 20})
    down.set_policy(unique("p"), f"^{exchange}$", {"federation-upstream": unique("u")})
    declare(up, exchange=exchange)
    declare(down, exchange=exchange, queue=on_disk, binding="disk")
    connection = down.connection()
    channel = connection.channel()
    channel.queue_declare(in_memory, durable=False)
    channel.queue_bind(in_memory, exchange, "memory")
    connection.close()
    down.wait_running("exchange", exchange)
    upstream_queue = f"federation: {exchange} -> {cluster_name(down)}"
    wait_until(lambda: len(up.get(f"/api/exchanges/%2F/{quote(exchange)}/bindings/source")) == 2,
               "both bindings upstream")

    def settled() -> bool:
        queue = up.get(f"/api/queues/%2F/{quote(upstream_queue)}")
        return queue["messages"] == 0 and queue.get("messages_unacknowledged", 0) == 0

    connection = up.connection()
    channel = connection.channel()
    rounds, fast = 5, 3
    for round_ in range(rounds):
        # Back to back: the transient queue's confirms come before the durable one's, and the
        # round ends with nothing after them that a multiple confirm could cover them with.
        channel.basic_publish(exchange, "disk", b"disk %d" % round_, pika.BasicProperties(delivery_mode=2))
        for i in range(fast):
            channel.basic_publish(exchange, "memory", b"memory %d.%d" % (round_, i),
                                  pika.BasicProperties(delivery_mode=2))
        wait_until(settled, f"round {round_}: every message acknowledged upstream", within=10,
                   pump=connection.process_data_events)
    connection.close()
    assert len(get_all(down, on_disk, rounds)) == rounds
    assert len(get_all(down, in_memory, rounds * fast)) == rounds * fast
    count = rounds * (1 + fast)
    link = down.link("exchange", exchange)
    assert link is not None and link["messages_confirmed"] == link["messages_acked_upstream"] == count


def test_on_publish_acknowledges_everything_upstream_once_published_here(pair, unique):
    up, down = pair
    exchange, queue = unique("fed.x"), unique("fed-q")
    down.set_upstream(unique("u"), {"uri": up.amqp_url, "ack-mode": "on-publish", "prefetch-count": 10})
    down.set_policy(unique("p"), f"^{exchange}$", {"federation-upstream": unique("u")})
    declare(up, exchange=exchange)
    declare(down, exchange=exchange, queue=queue, binding="#")
    down.wait_running("exchange", exchange)
    wait_until(lambda: up.get(f"/api/exchanges/%2F/{quote(exchange)}/bindings/source"), "the binding upstream")
    publish_confirmed(up, exchange, "k", [b"m%d" % i for i in range(60)])
    assert [body for body, _headers in get_all(down, queue, 60)] == [b"m%d" % i for i in range(60)]
    upstream_queue = f"federation: {exchange} -> {cluster_name(down)}"
    wait_until(lambda: up.get(f"/api/queues/%2F/{quote(upstream_queue)}")["messages"] == 0,
               "every message acknowledged upstream (the prefetch of 10 would hold the rest otherwise)")
    link = down.link("exchange", exchange)
    assert link is not None and link["messages_acked_upstream"] == 60


def test_two_brokers_federating_each_other_do_not_loop(pair, unique):
    up, down = pair
    exchange, queue_up, queue_down = unique("fed.x"), unique("qu"), unique("qd")
    for here, there in ((down, up), (up, down)):
        here.set_upstream(unique("u"), {"uri": there.amqp_url})
        here.set_policy(unique("p"), f"^{exchange}$", {"federation-upstream": unique("u")})
    declare(up, exchange=exchange, queue=queue_up, binding="#")
    declare(down, exchange=exchange, queue=queue_down, binding="#")
    up.wait_running("exchange", exchange)
    down.wait_running("exchange", exchange)
    publish_confirmed(up, exchange, "k", [b"once"])
    [(body, headers)] = get_all(down, queue_down, 1)
    assert body == b"once" and len(headers["x-received-from"]) == 1
    [(body, _headers)] = get_all(up, queue_up, 1)
    assert body == b"once"
    # nothing comes back: up's copy is the original, down's the only federated one
    assert not poll(lambda: get_all_nowait(up, queue_up) or get_all_nowait(down, queue_down), 1.5)


def test_max_hops_two_carries_a_message_across_a_chain(tmp_path, unique):
    sites = [launch_site(tmp_path / f"s{n}") for n in range(3)]
    try:
        a, b, c = sites
        exchange, queue = unique("fed.x"), unique("q")
        b.set_upstream("to-a", {"uri": a.amqp_url, "max-hops": 2})
        c.set_upstream("to-b", {"uri": b.amqp_url, "max-hops": 2})
        for site in (b, c):
            site.set_policy("fed", f"^{exchange}$", {"federation-upstream-set": "all"})
        declare(a, exchange=exchange)
        declare(b, exchange=exchange)
        declare(c, exchange=exchange, queue=queue, binding="k")
        b.wait_running("exchange", exchange)
        c.wait_running("exchange", exchange)
        # c's binding reached b with 2 hops left, and a with 1
        wait_until(lambda: [x for x in a.get(f"/api/exchanges/%2F/{quote(exchange)}/bindings/source")
                            if x["routing_key"] == "k"], "c's binding propagated to a through b")
        publish_confirmed(a, exchange, "k", [b"two hops"])
        [(body, headers)] = get_all(c, queue, 1)
        assert body == b"two hops"
        assert [hop["cluster-name"] for hop in headers["x-received-from"]] == [cluster_name(b), cluster_name(a)]
    finally:
        for site in sites:
            site.broker.stop()


def test_a_federated_queue_fetches_only_while_it_has_consumers(pair, unique):
    up, down = pair
    queue = unique("fed.q")
    down.set_upstream(unique("u"), {"uri": up.amqp_url})
    down.set_policy(unique("p"), f"^{queue}$", {"federation-upstream": unique("u")}, apply_to="queues")
    declare(up, queue=queue)
    declare(down, queue=queue)
    link = down.wait_running("queue", queue)
    assert link["upstream_queue"] == queue and link["consumer_tag"].startswith("federation-link-")
    publish_confirmed(up, "", queue, [b"m%d" % n for n in range(20)])
    assert poll(lambda: up.get(f"/api/queues/%2F/{quote(queue)}")["messages"] == 20, 5)
    # no consumer here: they stay upstream
    assert not poll(lambda: down.get(f"/api/queues/%2F/{quote(queue)}")["messages"], 1)
    got = consume_messages(down, queue, 20)
    assert sorted(got) == sorted(b"m%d" % n for n in range(20))
    wait_until(lambda: up.get(f"/api/queues/%2F/{quote(queue)}")["messages"] == 0, "the upstream queue drained")


def test_a_federated_queue_leaves_messages_to_upstream_consumers_first(pair, unique):
    """The link consumes with priority -1: a consumer on the upstream itself takes precedence."""
    up, down = pair
    queue = unique("fed.q")
    down.set_upstream(unique("u"), {"uri": up.amqp_url})
    down.set_policy(unique("p"), f"^{queue}$", {"federation-upstream": unique("u")}, apply_to="queues")
    declare(up, queue=queue)
    declare(down, queue=queue)
    down.wait_running("queue", queue)
    assert up.get(f"/api/queues/%2F/{quote(queue)}")["consumers"] == 0, "no demand here yet: no link consumer"
    here = down.connection()
    here_channel = here.channel()
    here_channel.basic_consume(queue, lambda ch, method, properties, body: got_here.append(body), auto_ack=True)
    got_here: list[bytes] = []
    wait_until(lambda: up.get(f"/api/queues/%2F/{quote(queue)}")["consumers"] == 1, "the link consuming upstream",
               pump=lambda seconds: here.process_data_events(time_limit=seconds))
    there = up.connection()
    there_channel = there.channel()
    got_there: list[bytes] = []
    there_channel.basic_consume(queue, lambda ch, method, properties, body: got_there.append(body), auto_ack=True)
    publish_confirmed(up, "", queue, [b"m%d" % n for n in range(10)])
    wait_until(lambda: len(got_there) == 10, "the upstream's own consumer took all ten",
               pump=lambda seconds: there.process_data_events(time_limit=seconds))
    here.process_data_events(time_limit=0.5)
    assert got_here == []
    here.close()
    there.close()


def test_bad_upstreams_are_refused_with_the_key_named(pair):
    _up, down = pair
    reply = down.request("PUT", "/api/parameters/federation-upstream/%2F/bad", {"value": {"uri": "nope://x"}})
    assert reply.status_code == 400
    assert reply.json()["reason"] == (
        'Validation failed\n\n"nope://x" not a valid URI: {{unexpected_uri_scheme,"nope"},"nope://x"}\n')
    reply = down.request("PUT", "/api/parameters/federation-upstream/%2F/bad",
                         {"value": {"uri": "amqp://x", "bogus": 1}})
    assert reply.status_code == 400
    assert reply.json()["reason"] == 'Validation failed\n\nUnrecognised terms [{&lt;&lt;"bogus"&gt;&gt;,1}] in bad\n'
    reply = down.request("PUT", "/api/parameters/federation-upstream/%2F/bad",
                         {"value": {"uri": "amqp://x", "max-hops": "a"}})
    assert reply.status_code == 400 and "max-hops should be a number" in reply.json()["reason"]
    reply = down.request("PUT", "/api/policies/%2F/bad", {"pattern": ".", "definition": {
        "federation-upstream": "a", "federation-upstream-set": "b"}})
    assert reply.status_code == 400 and "cannot specify federation-upstream" in reply.json()["reason"]


def test_an_unreachable_upstream_and_a_refused_login_show_in_the_link_status(pair, unique, tmp_path):
    _up, down = pair
    exchange = unique("fed.x")
    with_refused = unique("refused")
    from interop_tests.broker_process import free_port

    unreachable_name = unique("unreachable")
    down.set_upstream(unreachable_name, {"uri": f"amqp://guest:guest@127.0.0.1:{free_port()}", "reconnect-delay": 0.5})
    down.set_upstream(with_refused, {"uri": _up.amqp_url.replace("guest:guest", "guest:wrong"), "reconnect-delay": 0.5})
    down.put(f"/api/parameters/federation-upstream-set/%2F/{quote(unique('set'))}",
             {"value": [{"upstream": unreachable_name}, {"upstream": with_refused}]})
    down.set_policy(unique("p"), f"^{exchange}$", {"federation-upstream-set": unique("set")})
    declare(down, exchange=exchange)

    def failing() -> list[dict] | None:
        links = [link for link in down.links() if link.get("exchange") == exchange]
        if len(links) == 2 and all(link["status"] == "error" and link["reconnects"] >= 2 for link in links):
            return links
        return None

    links = wait_until(failing, "both links in error, reconnecting", within=20)
    by_upstream = {link["upstream"]: link for link in links}
    assert "403 ACCESS_REFUSED - Login was refused" in by_upstream[with_refused]["error"]
    assert "Connection refused" in by_upstream[unreachable_name]["error"]
    assert down.get("/api/federation-links/state/down") and down.get("/api/overview")  # still serving


def test_deleting_the_policy_stops_the_link_and_cleans_up_upstream(pair, unique):
    up, down = pair
    exchange, policy = unique("fed.x"), unique("p")
    down.set_upstream(unique("u"), {"uri": up.amqp_url})
    down.set_policy(policy, f"^{exchange}$", {"federation-upstream": unique("u")})
    declare(down, exchange=exchange, queue=unique("q"), binding="k")
    down.wait_running("exchange", exchange)
    upstream_queue = f"federation: {exchange} -> {cluster_name(down)}"
    assert up.request("GET", f"/api/queues/%2F/{quote(upstream_queue)}").status_code == 200
    assert down.request("DELETE", f"/api/policies/%2F/{quote(policy)}").status_code == 204
    wait_until(lambda: down.link("exchange", exchange) is None, "the link gone from the list")
    wait_until(lambda: up.request("GET", f"/api/queues/%2F/{quote(upstream_queue)}").status_code == 404,
               "the upstream queue deleted")


def test_a_link_restarts_on_request(pair, unique):
    up, down = pair
    exchange = unique("fed.x")
    down.set_upstream(unique("u"), {"uri": up.amqp_url})
    down.set_policy(unique("p"), f"^{exchange}$", {"federation-upstream": unique("u")})
    declare(down, exchange=exchange)
    link = down.wait_running("exchange", exchange)
    reply = down.request("DELETE", f"/api/federation-links/vhost/%2F/{link['id']}/{link['node']}/restart")
    assert reply.status_code == 204
    assert down.request("DELETE", f"/api/federation-links/vhost/%2F/nosuchid/{link['node']}/restart").status_code == 404
    down.wait_running("exchange", exchange)


def test_ctl_federation_status_and_restart_federation_link(pair, unique):
    import io

    from amqp_server.ctl.main import main as ctl_main

    up, down = pair
    exchange = unique("fed.x")
    down.set_upstream(unique("u"), {"uri": up.amqp_url})
    down.set_policy(unique("p"), f"^{exchange}$", {"federation-upstream": unique("u")})
    declare(down, exchange=exchange)
    link = down.wait_running("exchange", exchange)
    port = down.api_url.rsplit(":", 1)[1]

    def ctl(*args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        code = ctl_main(["--port", port, "--username", "guest", "--password", "guest", *args], out=out, err=err)
        return code, out.getvalue(), err.getvalue()

    code, out, _err = ctl("federation_status")
    assert code == 0 and out.startswith("Listing federation links on node ")
    header, *rows = out.splitlines()[1:]
    assert header.split("\t")[:9] == ["exchange", "queue", "upstream_exchange", "upstream_queue", "type", "vhost",
                                      "upstream", "id", "status"]
    [row] = [row.split("\t") for row in rows if row.split("\t")[0] == exchange]
    assert (row[4], row[7], row[8]) == ("exchange", link["id"], "running")
    code, out, _err = ctl("-s", "federation_status", "--only-down")
    assert code == 0 and exchange not in out
    code, out, _err = ctl("restart_federation_link", link["id"])
    assert code == 0 and f"Restarting federation link {link['id']}" in out
    down.wait_running("exchange", exchange)
    code, _out, err = ctl("restart_federation_link", "nosuchid")
    assert (code, err.strip()) == (69, "Error:\nLink with the given ID was not found")
