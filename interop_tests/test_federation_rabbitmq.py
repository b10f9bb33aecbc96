"""Federation with RabbitMQ as a peer: Debian's rabbitmq-server 3.10.8, started by the test on free
ports (rabbitmq_nodes.py), with its federation plugin (scripts/install-test-system-packages
installs it).

- This broker federates an exchange and a queue from a RabbitMQ upstream (it declares there
  what RabbitMQ's own plugin would: the same queue, x-federation-upstream exchange and binding
  arguments, checked by name);
- RabbitMQ federates an exchange and a queue from this broker (its plugin declares here an
  x-federation-upstream exchange and consumes with priority -1);
- a RabbitMQ without the federation plugin as upstream: it has no x-federation-upstream type,
  so the link uses a fanout exchange there and checks max-hops here alone;
- kill -9 of the RabbitMQ upstream while messages flow loses none (on-confirm).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from interop_tests.federation_faults import Publisher, Tally, drain
from interop_tests.federation_helpers import (
    Site,
    consume_messages,
    declare,
    get_all,
    launch_site,
    publish_confirmed,
    quote,
    rabbit_site,
)
from interop_tests.rabbitmq_nodes import FEDERATION, start_rabbitmq
from interop_tests.waiting import wait_until

@pytest.fixture(scope="module")
def rabbit() -> Iterator[Site]:
    node = start_rabbitmq(FEDERATION)
    try:
        yield rabbit_site(node)
    finally:
        node.stop()


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    site = launch_site(tmp_path_factory.mktemp("ours") / "ours")
    try:
        yield site
    finally:
        site.broker.stop()


def test_our_exchange_federated_from_rabbitmq(rabbit, ours, unique):
    exchange, queue, upstream = unique("fed.x"), unique("q"), unique("rabbit")
    declare(rabbit, exchange=exchange)
    declare(ours, exchange=exchange, queue=queue, binding="a.*")
    ours.set_upstream(upstream, {"uri": rabbit.amqp_url})
    ours.set_policy(unique("p"), f"^{exchange}$", {"federation-upstream": upstream})
    ours.wait_running("exchange", exchange)
    our_name = ours.get("/api/cluster-name")["name"]
    upstream_queue = f"federation: {exchange} -> {our_name}"
    internal = wait_until(lambda: [x for x in rabbit.get("/api/exchanges/%2F")
                                   if x["name"].startswith(upstream_queue + " ")], "the internal exchange on RabbitMQ")
    assert internal[0]["type"] == "x-federation-upstream"
    assert internal[0]["arguments"] == {"x-downstream-name": our_name, "x-downstream-vhost": "/",
                                        "x-internal-purpose": "federation", "x-max-hops": 1}
    assert (internal[0]["internal"], internal[0]["auto_delete"], internal[0]["durable"]) == (True, True, True)
    assert rabbit.get(f"/api/queues/%2F/{quote(upstream_queue)}")["arguments"] == {
        "x-internal-purpose": "federation"}
    bindings = wait_until(lambda: [b for b in rabbit.get(f"/api/exchanges/%2F/{quote(exchange)}/bindings/source")
                                   if b["routing_key"] == "a.*"], "our binding on RabbitMQ")
    assert bindings[0]["arguments"]["x-bound-from"][0]["cluster-name"] == our_name
    publish_confirmed(rabbit, exchange, "a.b", [b"from rabbit"], headers={"h": 1})
    publish_confirmed(rabbit, exchange, "x.y", [b"unbound"])
    [(body, headers)] = get_all(ours, queue, 1)
    assert body == b"from rabbit" and headers["h"] == 1
    [hop] = headers["x-received-from"]
    assert hop["cluster-name"] == rabbit.broker.name and hop["exchange"] == exchange


def test_our_queue_federated_from_rabbitmq(rabbit, ours, unique):
    queue, upstream = unique("fed.q"), unique("rabbit")
    declare(rabbit, queue=queue)
    declare(ours, queue=queue)
    ours.set_upstream(upstream, {"uri": rabbit.amqp_url})
    ours.set_policy(unique("p"), f"^{queue}$", {"federation-upstream": upstream}, apply_to="queues")
    ours.wait_running("queue", queue)
    publish_confirmed(rabbit, "", queue, [b"r%d" % n for n in range(30)])
    wait_until(lambda: rabbit.get(f"/api/queues/%2F/{quote(queue)}").get("messages") == 30, "30 on RabbitMQ", 15)
    got = consume_messages(ours, queue, 30)
    assert sorted(got) == sorted(b"r%d" % n for n in range(30))


def test_rabbitmq_federates_an_exchange_from_us(rabbit, ours, unique):
    exchange, queue, upstream = unique("fed.x"), unique("q"), unique("ours")
    declare(ours, exchange=exchange)
    declare(rabbit, exchange=exchange, queue=queue, binding="k.#")
    rabbit.set_upstream(upstream, {"uri": ours.amqp_url})
    rabbit.set_policy(unique("p"), f"^{exchange}$", {"federation-upstream": upstream})
    rabbit.wait_running("exchange", exchange)
    # what RabbitMQ's plugin made here: an x-federation-upstream exchange of ours, bound to ours
    wait_until(lambda: [b for b in ours.get(f"/api/exchanges/%2F/{quote(exchange)}/bindings/source")
                        if b["routing_key"] == "k.#"], "RabbitMQ's binding propagated to us")
    made = [x for x in ours.get("/api/exchanges/%2F") if x["name"].startswith(f"federation: {exchange} -> ")]
    assert made and made[0]["type"] == "x-federation-upstream"
    publish_confirmed(ours, exchange, "k.1", [b"from us"])
    [(body, headers)] = get_all(rabbit, queue, 1)
    assert body == b"from us"
    assert headers["x-received-from"][0]["cluster-name"] == ours.get("/api/cluster-name")["name"]


def test_rabbitmq_federates_a_queue_from_us(rabbit, ours, unique):
    queue, upstream = unique("fed.q"), unique("ours")
    declare(ours, queue=queue)
    declare(rabbit, queue=queue)
    rabbit.set_upstream(upstream, {"uri": ours.amqp_url})
    rabbit.set_policy(unique("p"), f"^{queue}$", {"federation-upstream": upstream}, apply_to="queues")
    rabbit.wait_running("queue", queue)
    publish_confirmed(ours, "", queue, [b"o%d" % n for n in range(20)])
    got = consume_messages(rabbit, queue, 20)
    assert sorted(got) == sorted(b"o%d" % n for n in range(20))
    wait_until(lambda: ours.get(f"/api/queues/%2F/{quote(queue)}")["messages"] == 0, "drained here")


def test_a_rabbitmq_without_the_plugin_is_federated_through_a_fanout_exchange(tmp_path, ours, unique):
    node = start_rabbitmq()  # the management plugin only
    try:
        plain = rabbit_site(node)
        exchange, queue, upstream = unique("fed.x"), unique("q"), unique("plain")
        declare(plain, exchange=exchange)
        declare(ours, exchange=exchange, queue=queue, binding="k")
        ours.set_upstream(upstream, {"uri": plain.amqp_url})
        ours.set_policy(unique("p"), f"^{exchange}$", {"federation-upstream": upstream})
        ours.wait_running("exchange", exchange)
        made = [x for x in plain.get("/api/exchanges/%2F") if x["name"].startswith(f"federation: {exchange} -> ")]
        assert made and made[0]["type"] == "fanout"
        publish_confirmed(plain, exchange, "k", [b"fresh"])
        # one that already crossed a link: max-hops 1 drops it here
        publish_confirmed(plain, exchange, "k", [b"seen"], headers={"x-received-from": [
            {"uri": "amqp://elsewhere", "exchange": exchange, "redelivered": False, "cluster-name": "x", "vhost": "/"}]})
        [(body, _headers)] = get_all(ours, queue, 1)
        assert body == b"fresh"
        wait_until(lambda: (ours.link("exchange", exchange) or {}).get("messages_dropped") == 1,
                   "the message past max-hops dropped by the link")
        assert get_all(ours, queue, 0) == [], "the message past max-hops was dropped, not delivered"
    finally:
        node.stop()


def test_nothing_is_lost_when_the_rabbitmq_upstream_is_killed(tmp_path, unique):
    node = start_rabbitmq(FEDERATION)
    down = launch_site(tmp_path / "down")
    try:
        rabbit = rabbit_site(node)
        declare(rabbit, exchange="orders")
        declare(down, exchange="orders", queue="orders-here", binding="#")
        down.set_upstream("rabbit", {"uri": rabbit.amqp_url, "reconnect-delay": 0.5, "prefetch-count": 50})
        down.set_policy("fed", "^orders$", {"federation-upstream": "rabbit"})
        down.wait_running("exchange", "orders")
        tally = Tally()
        publisher = Publisher(rabbit, "orders", "k", 800, tally)
        publisher.start()
        wait_until(lambda: len(tally.confirmed) >= 250, "publishing under way", 60)
        node.kill9()
        time.sleep(0.5)
        node.start_again()
        down.wait_running("exchange", "orders", within=60)
        publisher.join(timeout=180)
        assert not publisher.is_alive()
        drain(down, "orders-here", tally, expect_at_least=800, within=60)
        print(f"confirmed {len(tally.confirmed)}, duplicates {tally.duplicates}")
        assert tally.lost == [], f"{len(tally.lost)} lost: {tally.lost[:20]}"
    finally:
        down.broker.kill()
        node.stop()
