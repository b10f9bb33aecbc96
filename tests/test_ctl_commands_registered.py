"""Every command issue 6 asks of `amqp-server ctl` (and the alarm ones rabbitmqctl has) is there.

interop_tests/test_ctl_commands.py and test_ctl_alarm_commands.py run each against a broker.
"""

from __future__ import annotations

import io

from amqp_server.ctl.main import build_parser, main

ISSUE_COMMANDS = (
    "list_queues list_exchanges list_bindings list_connections list_channels list_consumers list_users add_user "
    "delete_user change_password set_permissions add_vhost delete_vhost purge_queue delete_queue close_connection "
    "export_definitions import_definitions status"
).split()
ALSO = ("trace_on", "trace_off", "set_vm_memory_high_watermark", "set_disk_free_limit", "cluster_status",
        "add_member", "delete_member", "transfer_leadership", "list_stream_consumers", "shovel_status", "delete_shovel",
        "federation_status", "restart_federation_link")


def test_every_command_is_registered_with_help():
    subcommands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    missing = [name for name in (*ISSUE_COMMANDS, *ALSO) if name not in subcommands]
    assert not missing
    out = io.StringIO()
    assert main(["help", "set_disk_free_limit"], out=out) == 0
    assert "mem_relative <fraction>" in out.getvalue()


def test_a_watermark_command_with_the_wrong_number_of_arguments_is_a_usage_error():
    err = io.StringIO()
    # Refused before any request: the port is never contacted.
    assert main(["--port", "1", "set_vm_memory_high_watermark", "relative", "0.5"], out=io.StringIO(), err=err) == 64
    assert "set_vm_memory_high_watermark <fraction> | absolute <value>" in err.getvalue()
    assert main(["--port", "1", "set_disk_free_limit"], out=io.StringIO(), err=io.StringIO()) == 64
