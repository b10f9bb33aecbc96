"""RabbitMQ's own management CLI, rabbitmqadmin (Debian's rabbitmq-server package), against
this broker's management API, beside a pika client doing the messaging.

Skipped when /usr/bin/rabbitmqadmin is not installed.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pika
import pytest
from pika.exceptions import ConnectionClosedByBroker

from interop_tests.broker_process import free_port

RABBITMQADMIN = shutil.which("rabbitmqadmin")
pytestmark = pytest.mark.skipif(RABBITMQADMIN is None, reason="rabbitmqadmin is not installed")


@pytest.fixture
def admin(broker_factory):
    """(run rabbitmqadmin with these arguments -> stdout, the broker)."""
    port = free_port()
    broker = broker_factory(extra_args=("--management-port", str(port), "--metrics-port", "0"))

    def run(*args: str, user: str = "guest", password: str = "guest", check: bool = True) -> str:
        result = subprocess.run(
            [RABBITMQADMIN, "-H", "127.0.0.1", "-P", str(port), "-u", user, "-p", password, *args],
            capture_output=True, text=True, timeout=30,
        )
        if check:
            assert result.returncode == 0, result.stderr + result.stdout
        return result.stdout + result.stderr

    return run, broker


def listing(run, *args: str) -> list[dict]:
    return json.loads(run("-f", "raw_json", "list", *args))


def test_list_commands_show_what_a_pika_client_did(admin, unique):
    run, broker = admin
    queue = unique("admin-list")
    connection = pika.BlockingConnection(pika.URLParameters(broker.url()))
    channel = connection.channel()
    channel.queue_declare(queue, durable=True)
    channel.confirm_delivery()
    for index in range(3):
        channel.basic_publish("", queue, b"m%d" % index)
    channel.basic_consume(queue, lambda *args: None, consumer_tag="watcher")
    connection.process_data_events(time_limit=0.2)
    try:
        [listed] = [q for q in listing(run, "queues", "name", "messages", "messages_unacknowledged", "consumers")
                    if q["name"] == queue]
        assert listed == {"name": queue, "messages": 3, "messages_unacknowledged": 3, "consumers": 1}
        [conn] = listing(run, "connections", "name", "user", "channels")
        assert conn["user"] == "guest" and conn["channels"] == 1
        assert [c["consumer_tag"] for c in listing(run, "consumers")] == ["watcher"]
        assert len(listing(run, "channels")) == 1
        assert {"amq.direct", "amq.topic"} <= {e["name"] for e in listing(run, "exchanges")}
        assert {"/", "other"} <= {v["name"] for v in listing(run, "vhosts")}
        assert "guest" in {u["name"] for u in listing(run, "users")}
        assert listing(run, "nodes")[0]["name"]
        overview = json.loads(run("-f", "raw_json", "show", "overview"))
        assert overview[0]["object_totals"]["queues"] >= 1
        # The default table format, as an operator reads it.
        assert queue in run("list", "queues")
    finally:
        connection.close()


def test_declare_publish_get_purge_and_delete(admin, unique):
    run, broker = admin
    queue, exchange = unique("admin-q"), unique("admin-x")
    run("declare", "queue", f"name={queue}", "durable=true", 'arguments={"x-max-length": 100}')
    run("declare", "exchange", f"name={exchange}", "type=fanout")
    run("declare", "binding", f"source={exchange}", f"destination={queue}")
    run("publish", f"exchange={exchange}", "routing_key=any", "payload=via the api")
    [message] = json.loads(run("-f", "raw_json", "get", f"queue={queue}", "ackmode=ack_requeue_true"))
    assert (message["payload"], message["redelivered"]) == ("via the api", False)

    # An AMQP consumer gets the same message, now marked redelivered.
    connection = pika.BlockingConnection(pika.URLParameters(broker.url()))
    channel = connection.channel()
    method, properties, body = channel.basic_get(queue)
    assert (body, method.redelivered) == (b"via the api", True)
    channel.basic_nack(method.delivery_tag, requeue=True)
    assert channel.queue_declare(queue, passive=True).method.message_count == 1

    run("purge", "queue", f"name={queue}")
    assert channel.queue_declare(queue, passive=True).method.message_count == 0
    [binding] = [b for b in listing(run, "bindings") if b["source"] == exchange]
    run("delete", "binding", f"source={exchange}", "destination_type=queue", f"destination={queue}",
        f"properties_key={binding['properties_key']}")
    assert not [b for b in listing(run, "bindings") if b["source"] == exchange]
    run("delete", "exchange", f"name={exchange}")
    run("delete", "queue", f"name={queue}")
    assert queue not in {q["name"] for q in listing(run, "queues")}
    connection.close()


def test_users_vhosts_and_permissions(admin, unique):
    run, broker = admin
    user, vhost = unique("user"), unique("vhost")
    run("declare", "vhost", f"name={vhost}")
    run("declare", "user", f"name={user}", "password=s3cret", "tags=management")
    run("declare", "permission", f"vhost={vhost}", f"user={user}", "configure=.*", "write=.*", "read=.*")
    # The new user can use AMQP on the new vhost and the API for what it may see.
    connection = pika.BlockingConnection(pika.URLParameters(broker.url(user, "s3cret", vhost)))
    connection.channel().queue_declare("mine")
    assert [q["name"] for q in json.loads(run("-f", "raw_json", "list", "queues", "name",
                                              user=user, password="s3cret"))] == ["mine"]
    assert "Access refused" in run("list", "users", user=user, password="s3cret", check=False)
    connection.close()
    run("delete", "vhost", f"name={vhost}")
    run("delete", "user", f"name={user}")
    assert user not in {u["name"] for u in listing(run, "users")}


def test_close_connection_reaches_the_client(admin):
    run, broker = admin
    connection = pika.BlockingConnection(pika.URLParameters(broker.url()))
    [conn] = listing(run, "connections", "name")
    run("close", "connection", f"name={conn['name']}")
    with pytest.raises(ConnectionClosedByBroker) as closed:
        for _ in range(50):
            connection.process_data_events(time_limit=0.1)
    assert closed.value.reply_code == 320
    assert "Closed via management plugin" in closed.value.reply_text


def test_export_and_import_definitions(admin, broker_factory, unique, tmp_path):
    run, broker = admin
    queue, exchange = unique("defs-q"), unique("defs-x")
    run("declare", "exchange", f"name={exchange}", "type=topic")
    run("declare", "queue", f"name={queue}", "durable=true")
    run("declare", "binding", f"source={exchange}", f"destination={queue}", "routing_key=a.*")
    exported = tmp_path / "definitions.json"
    run("export", str(exported))
    document = json.loads(exported.read_text())
    assert queue in {q["name"] for q in document["queues"]}

    port = free_port()
    fresh = broker_factory(extra_args=("--management-port", str(port), "--metrics-port", "0"))
    subprocess.run([RABBITMQADMIN, "-H", "127.0.0.1", "-P", str(port), "-u", "guest", "-p", "guest",
                    "import", str(exported)], check=True, capture_output=True, timeout=30)
    connection = pika.BlockingConnection(pika.URLParameters(fresh.url()))
    channel = connection.channel()
    channel.basic_publish(exchange, "a.b", b"routed by imported binding")
    assert channel.basic_get(queue, auto_ack=True)[2] == b"routed by imported binding"
    connection.close()


def test_declare_list_and_delete_a_policy_and_an_operator_policy(admin, unique):
    run, broker = admin
    queue = unique("admin-pol")
    connection = pika.BlockingConnection(pika.URLParameters(broker.url()))
    channel = connection.channel()
    channel.queue_declare(queue)
    run("declare", "policy", f"name={queue}", f"pattern=^{queue}$", 'definition={"max-length": 1}',
        "apply-to=queues", "priority=3")
    run("declare", "operator_policy", "name=cap", f"pattern=^{queue}$", 'definition={"message-ttl": 60000}')
    [policy] = [p for p in listing(run, "policies") if p["name"] == queue]
    assert policy == {"vhost": "/", "name": queue, "pattern": f"^{queue}$", "apply-to": "queues",
                      "definition": {"max-length": 1}, "priority": 3}
    assert [p["name"] for p in listing(run, "operator_policies")] == ["cap"]
    [shown] = [q for q in listing(run, "queues", "name", "policy", "operator_policy") if q["name"] == queue]
    assert (shown["policy"], shown["operator_policy"]) == (queue, "cap")
    channel.confirm_delivery()
    for body in (b"m1", b"m2"):
        channel.basic_publish("", queue, body)
    assert channel.queue_declare(queue, passive=True).method.message_count == 1
    run("delete", "policy", f"name={queue}")
    run("delete", "operator_policy", "name=cap")
    assert listing(run, "policies") == [] and listing(run, "operator_policies") == []
    channel.basic_publish("", queue, b"m3")
    assert channel.queue_declare(queue, passive=True).method.message_count == 2
    connection.close()


def test_declare_list_and_delete_a_vhost_limit(admin, unique):
    run, broker = admin
    vhost = unique("admin-lim")
    run("declare", "vhost", f"name={vhost}")
    run("declare", "vhost_limit", f"vhost={vhost}", "name=max-queues", "value=1")
    assert [v for v in listing(run, "vhost_limits") if v["vhost"] == vhost] == [
        {"vhost": vhost, "value": {"max-queues": 1}}]
    run("declare", "permission", f"vhost={vhost}", "user=guest", "configure=.*", "write=.*", "read=.*")
    connection = pika.BlockingConnection(pika.URLParameters(broker.url(vhost=vhost)))
    channel = connection.channel()
    channel.queue_declare("first")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        channel.queue_declare("second")
    assert refused.value.reply_code == 406
    connection.close()
    run("delete", "vhost_limit", f"vhost={vhost}", "name=max-queues")
    assert not [v for v in listing(run, "vhost_limits") if v["vhost"] == vhost]
    run("delete", "vhost", f"name={vhost}")


def test_list_queues_shows_a_stream_with_its_type(admin, unique):
    """`rabbitmqadmin list queues name type messages`: a stream is listed with type stream and
    its records as messages (as RabbitMQ 3.10.8 lists one), beside a classic queue."""
    run, broker = admin
    stream, classic = unique("admin-stream"), unique("admin-classic")
    connection = pika.BlockingConnection(pika.URLParameters(broker.url()))
    channel = connection.channel()
    channel.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
    channel.queue_declare(classic, durable=True)
    channel.confirm_delivery()
    for index in range(4):
        channel.basic_publish("", stream, b"r%d" % index)
    channel.basic_publish("", classic, b"c")
    try:
        listed = {q["name"]: q for q in listing(run, "queues", "name", "type", "messages")}
        assert listed[stream] == {"name": stream, "type": "stream", "messages": 4}
        assert listed[classic] == {"name": classic, "type": "classic", "messages": 1}
        table = run("list", "queues", "name", "type", "messages")
        [row] = [line for line in table.splitlines() if stream in line]
        assert [cell.strip() for cell in row.strip("|").split("|")] == [stream, "stream", "4"]
        # Our figures are columns like any other.
        [offsets] = [q for q in listing(run, "queues", "name", "stream_first_offset", "stream_last_offset",
                                        "stream_segments") if q["name"] == stream]
        assert offsets == {"name": stream, "stream_first_offset": 0, "stream_last_offset": 3, "stream_segments": 1}
    finally:
        connection.close()
