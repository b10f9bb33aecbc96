"""`amqp-server ctl` policy and limit commands: rabbitmqctl 3.10's syntax, progress lines, columns
and exit codes, against a running broker whose queues a pika client holds."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pika
import pytest

from interop_tests.broker_process import free_port, launch
from interop_tests.test_ctl_commands import Ctl

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("INTEROP_BROKER_URL")), reason="ctl talks to this project's management API"
)


@pytest.fixture(scope="module")
def ctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ctl]:
    port = free_port()
    broker = launch(tmp_path_factory.mktemp("ctl-policies"),
                    extra_args=("--management-port", str(port), "--metrics-port", "0"))
    try:
        yield Ctl(broker, port)
    finally:
        broker.stop()


def test_set_list_and_clear_a_policy(ctl, unique):
    queue = unique("ctl-pol")
    connection = pika.BlockingConnection(pika.URLParameters(ctl.broker.url()))
    channel = connection.channel()
    channel.queue_declare(queue)
    code, out, err = ctl("set_policy", "--priority", "2", "--apply-to", "queues", queue, f"^{queue}$",
                         '{"max-length": 1}')
    assert code == 0, err
    assert out == (f'Setting policy "{queue}" for pattern "^{queue}$" to "{{"max-length": 1}}" with priority "2" '
                   'for vhost "/" ...\n')
    code, out, _err = ctl("list_policies")
    assert out.splitlines()[:2] == ['Listing policies for vhost "/" ...',
                                    "vhost\tname\tpattern\tapply-to\tdefinition\tpriority"]
    assert f'/\t{queue}\t^{queue}$\tqueues\t{{"max-length":1}}\t2' in out.splitlines()
    channel.confirm_delivery()
    for body in (b"a", b"b"):
        channel.basic_publish("", queue, body)
    assert channel.queue_declare(queue, passive=True).method.message_count == 1
    assert ctl.rows("list_queues", "name", "policy").count([queue, queue]) == 1
    code, out, _err = ctl("clear_policy", queue)
    assert (code, out) == (0, f'Clearing policy "{queue}" on vhost "/" ...\n')
    assert ctl.rows("list_policies") == []
    connection.close()


def test_a_refused_definition_prints_rabbitmqs_text_and_exits_69(ctl):
    code, _out, err = ctl("set_policy", "p", ".*", '{"max-priority": 10}')
    assert code == 69
    assert err == 'Error:\nValidation failed\n\n[{<<"max-priority">>,10}] are not recognised policy settings\n\n'
    code, _out, err = ctl("clear_policy", "nope")
    assert (code, err) == (69, "Error:\nParameter does not exist\n")
    code, out, err = ctl("set_policy", "--priority", "high", "p", ".*", '{"max-length": 1}')
    assert (code, out) == (64, ""), "refused before anything is set, as rabbitmqctl's option check does"
    assert err.startswith("Error (argument validation): Invalid options for this command:\n--priority : high\n")


def test_operator_policies(ctl, unique):
    name = unique("ctl-op")
    code, out, err = ctl("set_operator_policy", name, "^nothing$", '{"max-length-bytes": 1000}')
    assert code == 0, err
    assert out.startswith(f'Setting operator policy override "{name}" for pattern "^nothing$"')
    assert [name, "^nothing$", "all", '{"max-length-bytes":1000}', "0"] in [
        row[1:] for row in ctl.rows("list_operator_policies")]
    assert ctl("clear_operator_policy", name)[0] == 0
    assert ctl.rows("list_operator_policies") == []


def test_vhost_and_user_limits(ctl, unique):
    vhost = unique("ctl-lim")
    assert ctl("add_vhost", vhost)[0] == 0
    code, out, err = ctl("set_vhost_limits", "-p", vhost, '{"max-connections": 0, "max-queues": 5}')
    assert code == 0, err
    assert out == f'Setting vhost limits to "{{"max-connections": 0, "max-queues": 5}}" for vhost "{vhost}" ...\n'
    assert ctl("list_vhost_limits", "-p", vhost)[1].splitlines()[-1] == '{"max-connections":0,"max-queues":5}'
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError, match="connection limit"):
        pika.BlockingConnection(pika.URLParameters(ctl.broker.url(vhost=vhost)))
    assert ctl("set_vhost_limits", "-p", vhost, '{"max-queues": 5}')[0] == 0
    pika.BlockingConnection(pika.URLParameters(ctl.broker.url(vhost=vhost))).close()
    assert ctl("clear_vhost_limits", "-p", vhost)[0] == 0
    assert ctl("-q", "list_vhost_limits", "-p", vhost)[1] == "\n"
    code, out, err = ctl("set_user_limits", "guest", '{"max-channels": 4}')
    assert code == 0, err
    assert ctl("list_user_limits", "--user", "guest")[1].splitlines()[-1] == '{"max-channels":4}'
    assert ctl("clear_user_limits", "guest", "all")[0] == 0
    assert ctl("list_user_limits")[1] == 'Listing limits for user "guest" ...\n{}\n'
    assert ctl("delete_vhost", vhost)[0] == 0


def test_limits_refused_as_rabbitmqctl_refuses_them_change_nothing(ctl, unique):
    vhost = unique("ctl-lim-bad")
    assert ctl("add_vhost", vhost)[0] == 0
    assert ctl("set_vhost_limits", "-p", vhost, '{"max-queues": 4}')[0] == 0
    code, _out, err = ctl("set_vhost_limits", "-p", vhost, '{"max-connections": 2, "bogus": 1}')
    assert (code, err) == (69, 'Error:\nValidation failed\n\nUnrecognised terms [{<<"bogus">>,1}] in limits\n\n')
    assert ctl("-q", "list_vhost_limits", "-p", vhost)[1] == '{"max-queues":4}\n'
    code, _out, err = ctl("set_user_limits", "guest", '{"max-connections": 2, "max-queues": 1}')
    assert (code, err) == (69, 'Error:\nUnrecognised terms [{<<"max-queues">>,1}] in user-limits\n')
    code, _out, err = ctl("set_user_limits", "guest", '{"max-channels": "x"}')
    assert (code, err) == (69, 'Error:\nmax-channels should be a number, actually was <<"x">>\n')
    assert ctl("-q", "list_user_limits", "--user", "guest")[1] == "{}\n"
    assert ctl("delete_vhost", vhost)[0] == 0


def test_set_vhost_limits_replaces_and_set_user_limits_merges(ctl, unique):
    """As rabbitmqctl: a vhost's limits are one runtime parameter, set whole; a user's limits
    are merged with those the user has."""
    vhost = unique("ctl-lim-merge")
    assert ctl("add_vhost", vhost)[0] == 0
    assert ctl("set_vhost_limits", "-p", vhost, '{"max-connections": 7}')[0] == 0
    assert ctl("set_vhost_limits", "-p", vhost, '{"max-queues": 4}')[0] == 0
    assert ctl("-q", "list_vhost_limits", "-p", vhost)[1] == '{"max-queues":4}\n'
    assert ctl("set_user_limits", "guest", '{"max-connections": 70}')[0] == 0
    assert ctl("set_user_limits", "guest", '{"max-channels": 40}')[0] == 0
    assert ctl("-q", "list_user_limits", "--user", "guest")[1] == '{"max-channels":40,"max-connections":70}\n'
    assert ctl("clear_user_limits", "guest", "all")[0] == 0
    assert ctl("delete_vhost", vhost)[0] == 0
