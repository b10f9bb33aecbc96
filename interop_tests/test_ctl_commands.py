"""`amqp-server ctl` against a running broker: rabbitmqctl's columns, messages and exit codes.

One broker with its management API on a free port serves the module; pika makes the objects
the listings must show and checks that changes (users, passwords, closed connections) are real.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from interop_tests.broker_process import BrokerProcess, free_port, launch
from interop_tests.pika_helpers import connect
from amqp_server.ctl.main import main as ctl_main

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("INTEROP_BROKER_URL")), reason="ctl talks to this project's management API"
)


class Ctl:
    """Runs `amqp-server ctl` in-process against one broker's management port."""

    def __init__(self, broker: BrokerProcess, management_port: int) -> None:
        self.broker = broker
        self.port = management_port

    def __call__(self, *args: str, user: str = "guest", password: str = "guest") -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        argv = ["--port", str(self.port), "--username", user, "--password", password, *args]
        code = ctl_main(argv, out=out, err=err)
        return code, out.getvalue(), err.getvalue()

    def rows(self, *args: str) -> list[list[str]]:
        """A listing's rows (--silent: no title, no header), split at tabs."""
        code, out, err = self("-s", *args)
        assert code == 0, err
        return [line.split("\t") for line in out.splitlines()]


@pytest.fixture(scope="module")
def ctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ctl]:
    port = free_port()
    broker = launch(tmp_path_factory.mktemp("ctl"), extra_args=("--management-port", str(port), "--metrics-port", "0"))
    try:
        yield Ctl(broker, port)
    finally:
        broker.stop()


def connection_name(ctl: Ctl, label: str) -> str:
    """The broker's name for the connection opened with `label` (from list_connections)."""
    [name] = [name for name, properties in ctl.rows("list_connections", "name", "client_properties")
              if f'{{"connection_name","{label}"}}' in properties]
    return name


def test_list_queues_default_and_chosen_columns(ctl, unique):
    queue = unique("ctl-q")
    with connect(ctl.broker) as connection:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True, arguments={"x-max-length": 10})
        channel.confirm_delivery()
        for body in (b"a", b"bc"):
            channel.basic_publish("", queue, body)

        code, out, _err = ctl("list_queues")
        assert code == 0
        lines = out.splitlines()
        assert lines[:2] == ["Listing queues for vhost / ...", "name\tmessages"]
        assert f"{queue}\t2" in lines

        rows = ctl.rows("list_queues", "name", "messages_ready", "consumers", "durable", "arguments", "message_bytes")
        assert [queue, "2", "0", "true", '[{"x-max-length",10}]', "3"] in rows


def test_unknown_column_is_a_usage_error(ctl):
    code, out, err = ctl("list_queues", "name", "colour")
    assert code == 64
    assert "Info key(s) colour are not supported" in err


def test_list_exchanges_and_bindings(ctl, unique):
    queue = unique("ctl-bound")
    with connect(ctl.broker) as connection:
        channel = connection.channel()
        channel.queue_declare(queue, auto_delete=True)
        channel.queue_bind(queue, "amq.topic", "a.*.c")
        assert ["amq.rabbitmq.trace", "topic"] in ctl.rows("list_exchanges")
        assert ["amq.rabbitmq.trace", "topic", "true"] in ctl.rows("list_exchanges", "name", "type", "internal")
        rows = ctl.rows("list_bindings")
        assert ["amq.topic", "exchange", queue, "queue", "a.*.c", "[]"] in rows
        assert ["", "exchange", queue, "queue", queue, "[]"] in rows  # the default exchange's binding


def test_connections_channels_and_consumers_are_listed(ctl, unique):
    queue, label = unique("ctl-consumed"), unique("ctl-connection")
    with connect(ctl.broker, label=label) as connection:
        channel = connection.channel()
        channel.queue_declare(queue, auto_delete=True)
        channel.basic_qos(prefetch_count=7)
        channel.basic_consume(queue, lambda *_: None, consumer_tag="ctl-tag")
        name = connection_name(ctl, label)
        client_port = name.split(" -> ")[0].rsplit(":", 1)[1]

        assert ["guest", "127.0.0.1", client_port, "running"] in ctl.rows("list_connections")
        columns = ("name", "vhost", "protocol", "channels", "user", "pid")
        assert [name, "/", "{0,9,1}", "1", "guest", name] in ctl.rows("list_connections", *columns)
        assert [f"{name} (1)", "guest", "1", "0"] in ctl.rows("list_channels")
        assert [queue, f"{name} (1)", "ctl-tag", "true", "7", "true", "[]"] in ctl.rows("list_consumers")


def test_streams_and_their_consumers_are_listed(ctl, unique):
    """list_queues shows a stream's type and records; list_stream_consumers (rabbitmq-streams')
    lists each consumer of a stream with the offset it reads next, and no other consumer."""
    stream, classic, label = unique("ctl-stream"), unique("ctl-classic"), unique("ctl-reader")
    with connect(ctl.broker, label=label) as connection:
        channel = connection.channel()
        channel.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
        channel.queue_declare(classic, auto_delete=True)
        channel.confirm_delivery()
        for index in range(6):
            channel.basic_publish("", stream, b"r%d" % index)
        assert [stream, "stream", "6"] in ctl.rows("list_queues", "name", "type", "messages")
        assert [classic, "classic", "0"] in ctl.rows("list_queues", "name", "type", "messages")

        channel.basic_qos(prefetch_count=2)
        delivered: list[int] = []
        channel.basic_consume(stream, lambda _ch, _m, properties, _b: delivered.append(
            properties.headers["x-stream-offset"]), consumer_tag="from-one", arguments={"x-stream-offset": 1})
        channel.basic_consume(classic, lambda *_: None, consumer_tag="not-a-stream-consumer")
        for _ in range(100):
            if len(delivered) == 2:
                break
            connection.process_data_events(time_limit=0.1)
        assert delivered == [1, 2]
        name = connection_name(ctl, label)

        code, out, _err = ctl("list_stream_consumers")
        assert code == 0
        assert out.splitlines() == ["Listing stream consumers ...", "stream\tconsumer_tag\toffset",
                                    f"{stream}\tfrom-one\t3"]
        rows = ctl.rows("list_stream_consumers", "consumer_tag", "offset", "connection_pid", "channel_pid",
                        "prefetch_count", "arguments")
        assert rows == [["from-one", "3", name, f"{name} (1)", "2", '[{"x-stream-offset",1}]']]
        code, _out, err = ctl("list_stream_consumers", "subscription_id")
        assert code == 64 and "Info key(s) subscription_id are not supported" in err


def test_users_passwords_and_permissions_take_effect(ctl, unique):
    user = unique("ctl-user")
    code, out, _err = ctl("add_user", user, "first")
    assert code == 0 and out.startswith(f'Adding user "{user}" ...')
    code, _out, err = ctl("add_user", user, "again")
    assert code == 70 and f'User "{user}" already exists' in err

    assert ctl("set_permissions", "-p", "/", user, ".*", ".*", ".*")[0] == 0
    assert ["/", ".*", ".*", ".*"] in ctl.rows("list_user_permissions", user)
    assert ctl("set_user_tags", user, "monitoring")[0] == 0
    assert [user, "[monitoring]"] in ctl.rows("list_users")
    connect(ctl.broker, user, "first").close()

    assert ctl("change_password", user, "second")[0] == 0
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(ctl.broker, user, "first")
    connect(ctl.broker, user, "second").close()
    assert [user, "[monitoring]"] in ctl.rows("list_users")  # tags survive a password change

    assert ctl("delete_user", user)[0] == 0
    code, _out, err = ctl("delete_user", user)
    assert code == 67 and f'User "{user}" does not exist' in err
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(ctl.broker, user, "second")


def test_vhosts_can_be_added_used_and_deleted(ctl, unique):
    vhost = unique("ctl-vhost")
    assert ctl("add_vhost", vhost)[0] == 0
    assert [vhost] in ctl.rows("list_vhosts")
    assert ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")[0] == 0
    with connect(ctl.broker, vhost=vhost) as connection:
        connection.channel().queue_declare("inside")
    assert [["inside", "0"]] == ctl.rows("list_queues", "-p", vhost)
    assert ctl("delete_vhost", vhost)[0] == 0
    code, _out, err = ctl("delete_vhost", vhost)
    assert code == 65 and "does not exist" in err
    code, _out, err = ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    assert code == 69 and f"Virtual host {vhost} does not exist" in err


def test_purge_and_delete_queue(ctl, unique):
    queue = unique("ctl-purged")
    with connect(ctl.broker) as connection:
        channel = connection.channel()
        channel.queue_declare(queue)
        channel.confirm_delivery()
        for _ in range(3):
            channel.basic_publish("", queue, b"m")
        code, out, _err = ctl("purge_queue", queue)
        assert code == 0 and out == f"Purging queue '{queue}' in vhost '/' ...\n"
        assert [queue, "0"] in ctl.rows("list_queues")
        channel.basic_publish("", queue, b"m")
        code, out, _err = ctl("delete_queue", queue)
        assert code == 0
        assert out.splitlines()[-1] == "Queue was successfully deleted with 1 ready messages"
        assert queue not in [row[0] for row in ctl.rows("list_queues")]
    code, _out, err = ctl("delete_queue", queue)
    assert code == 69 and "not found" in err


def test_close_connection_reaches_the_client_and_the_log(ctl, unique):
    label = unique("ctl-closed")
    connection = connect(ctl.broker, label=label)
    name = connection_name(ctl, label)
    code, out, _err = ctl("close_connection", name, "maintenance window")
    assert code == 0 and out == f"Closing connection {name}, reason: maintenance window...\n"
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        connection.process_data_events(2)
    assert closed.value.reply_code == 320
    assert closed.value.reply_text == "CONNECTION_FORCED - maintenance window"
    # One line for the open and one for the close, with who, where and what client.
    log = ctl.broker.log_text()
    assert f"connection {name}: user 'guest' authenticated and granted access to vhost '/' " \
        "(client Pika Python Client Library)" in log
    assert f"closing AMQP connection {name}, vhost: '/', user: 'guest', client: 'Pika Python Client Library': " \
        "CONNECTION_FORCED - maintenance window" in log


def test_export_and_import_definitions_round_trip(ctl, unique, tmp_path):
    queue = unique("ctl-durable")
    with connect(ctl.broker) as connection:
        connection.channel().queue_declare(queue, durable=True)
    exported = tmp_path / "definitions.json"
    code, _out, _err = ctl("export_definitions", str(exported))
    assert code == 0 and f'"name": "{queue}"' in exported.read_text()
    assert ctl("delete_queue", queue)[0] == 0
    code, out, _err = ctl("import_definitions", str(exported))
    assert code == 0 and out.endswith("Successfully imported definitions.\n")
    assert [queue, "0"] in ctl.rows("list_queues")


def test_status_reports_memory_alarms_and_listeners(ctl):
    code, out, _err = ctl("status")
    assert code == 0
    assert out.startswith("Status of node ")
    assert "Alarms\n\n(none)\n" in out
    assert "Total memory used: " in out and "Low free disk space watermark: 0.05 gb" in out
    assert f"port: {ctl.broker.port}, protocol: amqp" in out


def test_wrong_credentials_and_unreachable_api_are_reported(ctl):
    code, _out, err = ctl("list_queues", password="wrong")
    assert code == 77 and "refused the credentials" in err
    out, err = io.StringIO(), io.StringIO()
    code = ctl_main(["--port", str(free_port()), "list_queues"], out=out, err=err)
    assert code == 69 and "unable to reach the management API" in err.getvalue()


def test_the_amqp_server_command_runs_ctl(ctl):
    result = subprocess.run(
        [sys.executable, "-m", "amqp_server", "ctl", "--port", str(ctl.port), "-q", "list_vhosts"],
        capture_output=True, text=True, timeout=30, cwd=Path(__file__).resolve().parent.parent,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "name" and "/" in result.stdout.splitlines()
