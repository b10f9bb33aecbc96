"""Shared definitions on etcd and on ZooKeeper: what is declared, bound, deleted or created on one
node is there on every other node; concurrent conflicting declares give one winner and a 406;
a node that was down catches up; a restarted node takes back its queues and their messages, and
drops the files of those deleted while it was down;
10,000 bindings; with the coordination service stopped, new declarations are refused while the
existing queues keep working."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid

import pika
import pika.exceptions
import pytest

from cluster import connect, parse_cluster_address
from interop_tests.cluster_nodes import ClusterNode, restart_node, start_node
from interop_tests.waiting import wait_until
from persistence.segment_layout import list_queue_directories
from interop_tests.coordination_services import start_etcd, start_zookeeper


@pytest.fixture(params=["etcd", "zookeeper"])
def coordination(request, tmp_path):
    service = start_etcd(tmp_path / "etcd") if request.param == "etcd" else start_zookeeper(tmp_path / "zk")
    yield service
    service.stop()


@pytest.fixture
def cluster_url(coordination):
    return coordination.url(f"defs-{uuid.uuid4().hex[:6]}")


@pytest.fixture
def nodes(cluster_url, tmp_path):
    """Start nodes with `nodes(name, ...)`; every node started is killed at the end."""
    started: list[ClusterNode] = []

    def start(*names: str) -> list[ClusterNode]:
        for name in names:
            started.append(start_node(tmp_path, cluster_url, name))
        return started[-len(names):]

    yield start
    for node in started:
        node.broker.kill()


def _passive_declare_code(node: ClusterNode, queue: str) -> int:
    """200 if a passive declare of `queue` on `node` succeeds, else the channel.close code."""
    with node.connect() as connection:
        try:
            connection.channel().queue_declare(queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker as refused:
            return refused.reply_code
    return 200


def _can_log_in(node: ClusterNode, user: str, password: str) -> bool:
    try:
        node.connect(user, password).close()
    except (pika.exceptions.ProbableAuthenticationError, pika.exceptions.ProbableAccessDeniedError):
        return False  # no such user (or password) here, or no permission on the vhost yet
    return True


def test_declared_on_one_node_bound_on_another_deleted_on_a_third(nodes):
    alpha, beta, gamma = nodes("alpha", "beta", "gamma")
    with alpha.connect() as connection:
        channel = connection.channel()
        channel.exchange_declare("orders", "direct", durable=True)
        channel.queue_declare("invoices", durable=True, arguments={"x-max-length": 100})

    for node in (beta, gamma):
        wait_until(lambda node=node: "invoices" in node.queue_names(), f"{node.name} lists the queue")
        assert _passive_declare_code(node, "invoices") == 200
        with node.connect() as connection:
            connection.channel().exchange_declare("orders", passive=True)
    listed = {queue["name"]: queue for queue in gamma.api_json("queues")}["invoices"]
    assert listed["arguments"] == {"x-max-length": 100} and listed["durable"]
    assert listed["node"] == "alpha" and listed["state"] == "running"

    with beta.connect() as connection:
        connection.channel().queue_bind("invoices", "orders", "paid")
    wait_until(lambda: any(b["source"] == "orders" and b["routing_key"] == "paid"
                           for b in alpha.api_json("queues/%2F/invoices/bindings")), "alpha has beta's binding")
    # The binding made on beta routes on alpha, which holds the queue's messages.
    with alpha.connect() as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("orders", "paid", b"invoice 1")
        _method, _properties, body = channel.basic_get("invoices", auto_ack=True)
    assert body == b"invoice 1"

    with gamma.connect() as connection:
        connection.channel().queue_delete("invoices")
    for node in (alpha, beta):
        wait_until(lambda node=node: "invoices" not in node.queue_names(), f"{node.name} dropped the queue")
    assert _passive_declare_code(alpha, "invoices") == 404


def test_an_exclusive_queue_is_seen_everywhere_usable_only_by_its_connection_and_goes_with_it(nodes):
    alpha, beta = nodes("alpha", "beta")
    owner = alpha.connect()
    name = owner.channel().queue_declare("", exclusive=True).method.queue
    wait_until(lambda: name in beta.queue_names(), "beta lists the exclusive queue")
    listed = {queue["name"]: queue for queue in beta.api_json("queues")}[name]
    assert listed["exclusive"] and listed["node"] == "alpha"
    with beta.connect() as connection:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            connection.channel().queue_declare(name, passive=True)
    assert refused.value.reply_code == 405
    assert refused.value.reply_text == (
        f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{name}' in vhost '/'. It could be "
        "originally declared on another connection or the exclusive property value does not match that of "
        "the original declaration.")
    owner.close()  # the queue goes with its connection, on every node
    wait_until(lambda: name not in beta.queue_names(), "beta dropped the exclusive queue")


def test_concurrent_conflicting_declares_have_one_winner_and_a_406(nodes):
    alpha, beta = nodes("alpha", "beta")
    outcomes: dict[str, list[tuple]] = {}

    def declare(node: ClusterNode, name: str, length: int, barrier: threading.Barrier) -> None:
        with node.connect() as connection:
            channel = connection.channel()
            barrier.wait()
            try:
                channel.queue_declare(name, durable=True, arguments={"x-max-length": length})
                outcomes[name].append(("ok", length))
            except pika.exceptions.ChannelClosedByBroker as refused:
                outcomes[name].append((refused.reply_code, refused.reply_text, length))

    for round_number in range(8):
        name = f"race-{round_number}"
        outcomes[name] = []
        barrier = threading.Barrier(2)
        threads = [threading.Thread(target=declare, args=(node, name, length, barrier))
                   for node, length in ((alpha, 1), (beta, 2))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        results = outcomes[name]
        winners = [result for result in results if result[0] == "ok"]
        losers = [result for result in results if result[0] != "ok"]
        assert len(winners) == 1 and len(losers) == 1, results
        won, lost = winners[0][1], losers[0][2]
        assert losers[0][:2] == (406, f"PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue '{name}' "
                                      f"in vhost '/': received '{lost}' but current is '{won}'")
        for node in (alpha, beta):
            def winner_listed(node=node):
                return {q["name"]: q["arguments"] for q in node.api_json("queues")}.get(name) == {"x-max-length": won}
            wait_until(winner_listed, f"{node.name} has the winner's definition of {name}")


def test_users_and_permissions_made_on_one_node_log_in_on_another(nodes, cluster_url):
    alpha, beta, gamma = nodes("alpha", "beta", "gamma")
    assert alpha.api_write("PUT", "users/carol", {"password": "s3cret-pw", "tags": ""}).status_code == 201
    assert alpha.api_write("PUT", "permissions/%2F/carol",
                           {"configure": ".*", "write": ".*", "read": ".*"}).status_code == 201
    wait_until(lambda: _can_log_in(beta, "carol", "s3cret-pw"), "carol logs in on beta")
    assert not _can_log_in(gamma, "carol", "wrong")

    async def stored_user() -> bytes:
        coordinator = await connect(parse_cluster_address(cluster_url))
        try:
            item = await coordinator.get("definitions/users/carol")
            return item.value
        finally:
            await coordinator.close()

    stored = asyncio.run(stored_user())
    assert b"password_hash" in stored and b"s3cret-pw" not in stored  # the hash only, never the password

    assert gamma.api_write("DELETE", "users/carol").status_code == 204
    wait_until(lambda: not _can_log_in(alpha, "carol", "s3cret-pw"), "carol is refused on alpha")


def test_policies_and_limits_set_on_one_node_apply_on_another(nodes):
    alpha, beta = nodes("alpha", "beta")
    assert alpha.api_write("PUT", "policies/%2F/short-lived", {
        "pattern": "^short\\.", "apply-to": "queues", "definition": {"message-ttl": 60000}}).status_code == 201
    assert alpha.api_write("PUT", "vhost-limits/%2F/max-queues", {"value": 2}).status_code == 204
    wait_until(lambda: [p["name"] for p in beta.api_json("policies")] == ["short-lived"], "beta has the policy")
    wait_until(lambda: beta.api_json("vhost-limits") == [{"vhost": "/", "value": {"max-queues": 2}}],
               "beta has the vhost limit")

    with beta.connect() as connection:  # the policy applies to a queue declared on beta
        connection.channel().queue_declare("short.one")
    listed = {q["name"]: q for q in beta.api_json("queues")}["short.one"]
    assert listed["policy"] == "short-lived"
    with alpha.connect() as connection:
        connection.channel().queue_declare("other")
    wait_until(lambda: beta.queue_names() == {"short.one", "other"}, "beta counts alpha's queue")
    with beta.connect() as connection:  # the limit counts the cluster's queues, as RabbitMQ's does
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            connection.channel().queue_declare("third")
    assert (refused.value.reply_code, refused.value.reply_text) == (
        406, "PRECONDITION_FAILED - cannot declare queue 'third': queue limit in vhost '/' (2) is reached")

    assert beta.api_write("DELETE", "policies/%2F/short-lived").status_code == 204
    wait_until(lambda: alpha.api_json("policies") == [], "alpha lost the policy deleted on beta")


def test_a_definitions_file_given_to_a_joining_node_is_imported_into_the_cluster(cluster_url, tmp_path):
    document = {
        "queues": [{"name": "from-file", "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}}],
        "policies": [{"vhost": "/", "name": "filed", "pattern": "^from-file$", "apply-to": "queues",
                      "definition": {"max-length": 10}, "priority": 0}],
    }
    path = tmp_path / "definitions.json"
    path.write_text(json.dumps(document))
    beta = start_node(tmp_path, cluster_url, "beta")  # the cluster exists before alpha joins it
    alpha = None
    try:
        alpha = start_node(tmp_path, cluster_url, "alpha", extra_args=("--definitions", str(path)))
        assert "from-file" in alpha.queue_names()
        wait_until(lambda: "from-file" in beta.queue_names(), "beta lists the queue from alpha's file")
        assert [p["name"] for p in beta.api_json("policies")] == ["filed"]
    finally:
        for node in (alpha, beta):
            if node is not None:
                node.broker.kill()


def test_a_node_that_was_down_catches_up_when_it_returns(nodes):
    alpha, beta = nodes("alpha", "beta")
    with alpha.connect() as connection:
        connection.channel().queue_declare("before", durable=True)
    wait_until(lambda: "before" in beta.queue_names(), "beta lists the first queue")

    beta.broker.stop()
    with alpha.connect() as connection:
        channel = connection.channel()
        channel.queue_declare("while-down", durable=True)
        channel.queue_bind("while-down", "amq.topic", "news.#")
        channel.queue_delete("before")
    assert alpha.api_write("PUT", "vhosts/later").status_code == 201

    restart_node(beta)  # it accepts clients only once it has caught up
    assert beta.queue_names() == {"while-down"}
    assert "later" in {vhost["name"] for vhost in beta.api_json("vhosts")}
    assert [(b["source"], b["routing_key"]) for b in beta.api_json("queues/%2F/while-down/bindings")
            if b["source"]] == [("amq.topic", "news.#")]


def test_a_restarted_node_takes_back_its_queues_and_their_persistent_messages(nodes):
    alpha, beta = nodes("alpha", "beta")
    with alpha.connect() as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("ledger", durable=True)
        for number in range(50):
            channel.basic_publish("", "ledger", str(number).encode(), pika.BasicProperties(delivery_mode=2))

    def ledger_state():
        return {q["name"]: (q["node"], q["state"]) for q in beta.api_json("queues")}.get("ledger")

    assert wait_until(lambda: ledger_state() == ("alpha", "running"), "beta sees alpha holding the ledger")
    alpha.broker.kill()  # kill -9: its ownership lapses with its session, the definition stays
    wait_until(lambda: ledger_state() == ("alpha", "down"), "beta sees the ledger's owner down")
    with beta.connect() as connection:  # RabbitMQ's answer for a queue whose home node is down
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            connection.channel().queue_declare("ledger", passive=True)
    assert (refused.value.reply_code, refused.value.reply_text) == (
        404, "NOT_FOUND - home node 'alpha' of durable queue 'ledger' in vhost '/' is down or inaccessible")

    restart_node(alpha)
    wait_until(lambda: ledger_state() == ("alpha", "running"), "beta sees alpha holding the ledger again")
    with alpha.connect() as connection:
        channel = connection.channel()
        bodies = []
        while True:
            method, _properties, body = channel.basic_get("ledger", auto_ack=True)
            if method is None:
                break
            bodies.append(body)
    assert bodies == [str(number).encode() for number in range(50)]


def test_a_queue_deleted_while_its_owner_was_down_leaves_no_files_there(nodes):
    alpha, beta = nodes("alpha", "beta")
    with alpha.connect() as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        for queue in ("doomed", "kept"):
            channel.queue_declare(queue, durable=True)
            for number in range(20):
                channel.basic_publish("", queue, f"{queue} {number}".encode(), pika.BasicProperties(delivery_mode=2))
    wait_until(lambda: {"doomed", "kept"} <= beta.queue_names(), "beta lists both queues")

    def queues_with_files() -> set[str]:
        return {entry.queue for entry in list_queue_directories(alpha.broker.data_dir)}

    assert queues_with_files() == {"doomed", "kept"}
    alpha.broker.stop()
    # The management API deletes a queue whose owner is down (AMQP's queue.delete gets the 404).
    assert beta.api_write("DELETE", "queues/%2F/doomed").status_code == 204
    with beta.connect() as connection:  # a new queue of that name, beta's: none of the old messages
        connection.channel().queue_declare("doomed", durable=True)

    restart_node(alpha)  # it accepts clients only once it has caught up
    assert alpha.queue_names() == {"kept", "doomed"}
    assert queues_with_files() == {"kept"}
    with alpha.connect() as connection:
        channel = connection.channel()
        assert channel.queue_declare("doomed", passive=True).method.message_count == 0
        bodies = []
        while (fetched := channel.basic_get("kept", auto_ack=True))[0] is not None:
            bodies.append(fetched[2])
    assert bodies == [f"kept {number}".encode() for number in range(20)]


def test_a_transient_queue_goes_with_its_dead_owner_and_its_bindings_with_it(nodes):
    alpha, beta = nodes("alpha", "beta")
    with alpha.connect() as connection:
        channel = connection.channel()
        channel.queue_declare("scratch")  # not durable
        channel.queue_bind("scratch", "amq.topic", "scratch.#")
        channel.queue_declare("kept", durable=True)
    wait_until(lambda: {"scratch", "kept"} <= beta.queue_names(), "beta lists both queues")

    alpha.broker.kill()  # as RabbitMQ drops a lost node's transient queues
    wait_until(lambda: "scratch" not in beta.queue_names(), "beta dropped the transient queue")
    assert "kept" in beta.queue_names()
    assert not [b for b in beta.api_json("bindings") if b["destination"] == "scratch"]

    restart_node(alpha)
    assert alpha.queue_names() == {"kept"}
    with alpha.connect() as connection:  # a new queue of that name starts without the old binding
        connection.channel().queue_declare("scratch")
    wait_until(lambda: "scratch" in beta.queue_names(), "beta lists the new queue")
    for node in (alpha, beta):  # the old binding's key went with the old queue
        assert [b["source"] for b in node.api_json("queues/%2F/scratch/bindings")] == [""]


def test_ten_thousand_bindings_on_one_exchange(nodes):
    alpha, beta = nodes("alpha", "beta")
    count = 10_000
    document = {
        "exchanges": [{"name": "wide", "vhost": "/", "type": "direct", "durable": True, "auto_delete": False,
                       "internal": False, "arguments": {}}],
        "queues": [{"name": "sink", "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}}],
        "bindings": [{"source": "wide", "vhost": "/", "destination": "sink", "destination_type": "queue",
                      "routing_key": f"key-{number}", "arguments": {}} for number in range(count)],
    }
    # The import is answered once all 10,000 bindings are committed in the coordination service.
    assert alpha.api_write("POST", "definitions", document).status_code in (201, 204)
    wait_until(lambda: len(beta.api_json("exchanges/%2F/wide/bindings/source")) == count,
               "beta has all 10,000 bindings", within=120)
    with beta.connect() as connection:  # made on alpha, unbound on beta
        connection.channel().queue_unbind("sink", "wide", "key-0")
    wait_until(lambda: len(alpha.api_json("exchanges/%2F/wide/bindings/source")) == count - 1,
               "alpha lost the binding removed on beta")
    with alpha.connect() as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("wide", f"key-{count - 1}", b"last")
        channel.basic_publish("wide", "key-0", b"unbound")
        _method, _properties, body = channel.basic_get("sink", auto_ack=True)
        assert body == b"last"
        assert channel.basic_get("sink", auto_ack=True)[0] is None


def test_with_the_coordination_service_stopped_declarations_are_refused_and_queues_keep_working(
        nodes, coordination):
    alpha, beta = nodes("alpha", "beta")
    with alpha.connect() as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("steady", durable=True)
        channel.basic_publish("", "steady", b"before", pika.BasicProperties(delivery_mode=2))

    coordination.stop()
    with alpha.connect() as connection:
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as refused:
            connection.channel().queue_declare("brand-new", durable=True)
    assert refused.value.reply_code == 541
    assert "coordination service" in refused.value.reply_text

    with alpha.connect() as connection:  # the queue's owner keeps serving it
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("steady", durable=True)  # an equivalent redeclare changes nothing
        channel.basic_publish("", "steady", b"during", pika.BasicProperties(delivery_mode=2))
        bodies = [channel.basic_get("steady", auto_ack=True)[2] for _ in range(2)]
    assert bodies == [b"before", b"during"]
    assert "brand-new" not in alpha.queue_names()
