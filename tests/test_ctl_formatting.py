"""ctl prints values and tables as rabbitmqctl does (outputs copied from rabbitmqctl 3.10)."""

from __future__ import annotations

import io

from amqp_server.ctl.formatting import cell, write_json, write_table
from amqp_server.ctl.listings import LISTINGS
from amqp_server.ctl.main import build_parser


def test_cells_look_like_rabbitmqctl_output():
    assert cell(True) == "true" and cell(False) == "false"
    assert cell(None) == ""
    assert cell(["monitoring", "management"]) == "[monitoring, management]"
    assert cell([]) == "[]"
    assert cell({"x-max-length": 5}) == '[{"x-max-length",5}]'
    assert cell({}) == "[]"
    properties = {"product": "Pika Python Client Library", "capabilities": {"basic.nack": True}}
    assert cell(properties) == '[{"product","Pika Python Client Library"},{"capabilities",[{"basic.nack",true}]}]'


def test_table_is_tab_separated_with_a_header_row():
    out = io.StringIO()
    write_table(out, ["name", "messages"], [["q1", 0], ["q2", 12]])
    assert out.getvalue() == "name\tmessages\nq1\t0\nq2\t12\n"
    out = io.StringIO()
    write_table(out, ["name"], [["q1"]], headers=False)
    assert out.getvalue() == "q1\n"


def test_json_formatter_prints_one_object_per_line():
    out = io.StringIO()
    write_json(out, ["user", "tags"], [["remote", []], ["guest", ["administrator"]]])
    assert out.getvalue() == '[\n{"user":"remote","tags":[]}\n,{"user":"guest","tags":["administrator"]}\n]\n'


def test_default_columns_are_rabbitmqctls():
    assert LISTINGS["list_queues"].defaults == ("name", "messages")
    assert LISTINGS["list_exchanges"].defaults == ("name", "type")
    assert LISTINGS["list_connections"].defaults == ("user", "peer_host", "peer_port", "state")
    assert LISTINGS["list_channels"].defaults == ("pid", "user", "consumer_count", "messages_unacknowledged")
    assert LISTINGS["list_users"].defaults == ("user", "tags")


def test_binding_columns_come_from_the_api_fields():
    listing = LISTINGS["list_bindings"]
    item = {"source": "amq.topic", "destination": "q", "destination_type": "queue", "routing_key": "a.#", "arguments": {}}
    assert [listing.value(item, column) for column in listing.defaults] == ["amq.topic", "exchange", "q", "queue", "a.#", {}]


def test_options_may_follow_the_command_and_do_not_clash_with_its_arguments():
    args = build_parser().parse_args(
        ["add_user", "bob", "secret", "--username", "admin", "--password", "adminpw", "-p", "v1"]
    )
    assert (args.arg_username, args.arg_password) == ("bob", "secret")
    assert (args.username, args.password, args.vhost) == ("admin", "adminpw", "v1")
    args = build_parser().parse_args(["--port", "15000", "-p", "v2", "list_queues", "name", "consumers"])
    assert (args.port, args.vhost, args.columns) == (15000, "v2", ["name", "consumers"])
