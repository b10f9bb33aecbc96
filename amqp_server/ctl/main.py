"""`amqp-server ctl <command> [options]`: parse the command line, run the command, exit.

Options may come before or after the command, as with rabbitmqctl. The broker is reached
through its management API: --host/--port (default localhost:15672) and --username/--password
(default guest/guest), or the AMQP_SERVER_CTL_HOST/PORT/USERNAME/PASSWORD environment variables.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TextIO

from amqp_server.ctl import admin_commands as admin
from amqp_server.ctl import (
    alarm_commands, federation_commands, policy_commands, queue_member_commands, shovel_commands, tls_commands,
)
from amqp_server.ctl.admin_commands import Session
from amqp_server.ctl.api_client import ApiError, ManagementClient
from amqp_server.ctl.exit_codes import EX_DATAERR, EX_OK, EX_USAGE, ArgumentError, CtlError
from amqp_server.ctl.formatting import write_json, write_table
from amqp_server.ctl.listings import LISTINGS, Listing
from amqp_server.ctl.cluster_status import cluster_status
from amqp_server.ctl.status import status

ENV_PREFIX = "AMQP_SERVER_CTL_"
DEFAULT_PORT = 15672


class _UsageError(Exception):
    pass


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{message}\n\n{self.format_usage()}")


# name -> (handler, positional arguments, one-line help); "name*" takes any number of values, "name+" one or more.
ADMIN_COMMANDS: dict[str, tuple[Callable[..., int], tuple[str, ...], str]] = {
    "add_user": (admin.add_user, ("username", "password"), "create a user (no tags, no permissions)"),
    "delete_user": (admin.delete_user, ("username",), "delete a user"),
    "change_password": (admin.change_password, ("username", "new_password"), "set a user's password"),
    "set_user_tags": (admin.set_user_tags, ("username", "tag*"), "replace a user's tags (administrator, ...)"),
    "set_permissions": (admin.set_permissions, ("username", "conf", "write", "read"),
                        "set a user's permissions in the vhost given with -p"),
    "clear_permissions": (admin.clear_permissions, ("username",), "remove a user's permissions in a vhost"),
    "add_vhost": (admin.add_vhost, ("vhost",), "create a virtual host"),
    "delete_vhost": (admin.delete_vhost, ("vhost",), "delete a virtual host and everything in it"),
    "purge_queue": (admin.purge_queue, ("queue",), "remove the ready messages of a queue"),
    "delete_queue": (admin.delete_queue, ("queue",), "delete a queue (--if-empty, --if-unused)"),
    "close_connection": (admin.close_connection, ("connection_name", "explanation"),
                         "close a connection, named as list_connections name shows it"),
    "export_definitions": (admin.export_definitions, ("path",), "write users, vhosts, permissions and topology "
                           "as JSON (path - for stdout)"),
    "import_definitions": (admin.import_definitions, ("path",), "load definitions from JSON (path - for stdin)"),
    "trace_on": (admin.trace_on, (), "turn the firehose tracer on for the vhost given with -p"),
    "trace_off": (admin.trace_off, (), "turn the firehose tracer off for the vhost given with -p"),
    "set_vm_memory_high_watermark": (alarm_commands.set_vm_memory_high_watermark, ("setting+",),
                                     "<fraction> | absolute <value>: the memory alarm's threshold, as a fraction "
                                     "of total memory or in bytes (units: 1GB, 512MiB); until restart"),
    "set_disk_free_limit": (alarm_commands.set_disk_free_limit, ("setting+",),
                            "<disk_limit> | mem_relative <fraction>: the free-disk alarm's limit in bytes "
                            "(units: 50MB, 1GiB) or times total memory; until restart"),
    "reload_certificates": (tls_commands.reload_certificates, (),
                            "read the TLS certificate, key and CA files again; open connections keep theirs"),
    "set_policy": (policy_commands.set_policy, ("name", "pattern", "definition"),
                   "set a policy in the vhost given with -p (--priority, --apply-to)"),
    "clear_policy": (policy_commands.clear_policy, ("name",), "remove a policy"),
    "set_operator_policy": (policy_commands.set_operator_policy, ("name", "pattern", "definition"),
                            "set an operator policy, which caps what policies and arguments set"),
    "clear_operator_policy": (policy_commands.clear_operator_policy, ("name",), "remove an operator policy"),
    "set_vhost_limits": (policy_commands.set_vhost_limits, ("definition",),
                         "replace the limits of the vhost given with -p: {\"max-connections\": N, \"max-queues\": N}"),
    "clear_vhost_limits": (policy_commands.clear_vhost_limits, (), "lift every limit of the vhost given with -p"),
    "list_vhost_limits": (policy_commands.list_vhost_limits, (), "the limits of the vhost given with -p, as JSON"),
    "set_user_limits": (policy_commands.set_user_limits, ("username", "definition"),
                        "replace a user's limits: {\"max-connections\": N, \"max-channels\": N}"),
    "clear_user_limits": (policy_commands.clear_user_limits, ("username", "limit"),
                          "lift one limit of a user (or all)"),
    "list_user_limits": (policy_commands.list_user_limits, (), "the limits of the user given with --user, as JSON"),
    "add_member": (queue_member_commands.add_member, ("queue", "node"),
                   "add a replica of a quorum queue (vhost given with -p) on a cluster node"),
    "delete_member": (queue_member_commands.delete_member, ("queue", "node"),
                      "remove a quorum queue's replica on a node (its leader hands over first)"),
    "transfer_leadership": (queue_member_commands.transfer_leadership, ("queue", "node"),
                            "move a quorum queue's leadership to one of its members once it has every record"),
    "delete_shovel": (shovel_commands.delete_shovel, ("name",), "delete a dynamic shovel of the vhost given with -p"),
    "restart_federation_link": (federation_commands.restart_federation_link, ("link_id",),
                                "restart the federation link with that id (federation_status lists the ids)"),
}
# Commands with options of their own besides the connection options.
_POLICY_SETTERS = ("set_policy", "set_operator_policy")
_VARIADIC = ("*", "+")  # argparse nargs markers


def _connection_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """The options every command takes. Subcommands get them without defaults, so a value given
    before the command is not reset by the subcommand's parser."""
    env = os.environ

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument("--host", default=default(env.get(ENV_PREFIX + "HOST", "localhost")),
                        help="management API host (default localhost)")
    parser.add_argument("--port", type=int, default=default(int(env.get(ENV_PREFIX + "PORT", DEFAULT_PORT))),
                        help=f"management API port (default {DEFAULT_PORT})")
    parser.add_argument("--username", default=default(env.get(ENV_PREFIX + "USERNAME", "guest")))
    parser.add_argument("--password", default=default(env.get(ENV_PREFIX + "PASSWORD", "guest")))
    parser.add_argument("-p", "--vhost", default=default("/"), help="virtual host (default /)")
    parser.add_argument("-q", "--quiet", action="store_true", default=default(False),
                        help="no progress messages")
    parser.add_argument("-s", "--silent", action="store_true", default=default(False),
                        help="no progress messages and no table headers")
    parser.add_argument("--no-table-headers", action="store_true", default=default(False))
    parser.add_argument("--formatter", choices=("table", "json"), default=default("table"))
    parser.add_argument("-t", "--timeout", type=float, default=default(60.0), help="seconds (default 60)")


def build_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(
        prog="amqp-server ctl",
        description="Manage a running amqp-server through its management API, as rabbitmqctl does.",
    )
    _connection_options(parser, suppress=False)
    commands = parser.add_subparsers(dest="command", metavar="<command>", parser_class=_ArgumentParser)
    for name, listing in LISTINGS.items():
        sub = commands.add_parser(name, help=f"columns: {', '.join(listing.defaults)} (default)")
        _connection_options(sub, suppress=True)
        if listing.needs_arg:
            sub.add_argument(f"arg_{listing.needs_arg}", metavar=listing.needs_arg)
        if listing.accepts_columns:
            sub.add_argument("columns", nargs="*", metavar="column", help=f"any of: {' '.join(listing.columns)}")
    for name, (_handler, arguments, help_text) in ADMIN_COMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        _connection_options(sub, suppress=True)
        for argument in arguments:
            # Positional values live under "arg_<name>": "username" and "password" would
            # otherwise overwrite the --username/--password used to reach the API.
            bare = argument.rstrip("*+")
            sub.add_argument(f"arg_{bare}", metavar=bare, nargs=argument[-1] if argument[-1] in _VARIADIC else None)
        if name == "delete_queue":
            sub.add_argument("-e", "--if-empty", action="store_true", help="only if it has no ready messages")
            sub.add_argument("-u", "--if-unused", action="store_true", help="only if it has no consumers")
        if name in _POLICY_SETTERS:
            sub.add_argument("--priority", default="0", help="the policy's priority (default 0)")
            sub.add_argument("--apply-to", dest="apply_to", default="all",
                             help="queues, classic_queues, quorum_queues, streams, exchanges or all (default)")
        if name == "list_user_limits":
            sub.add_argument("--user", dest="limits_user", help="the user whose limits to list")
    sub = commands.add_parser("status", help="node status: memory, alarms, disk, file descriptors, listeners")
    _connection_options(sub, suppress=True)
    sub = commands.add_parser("cluster_status", help="the cluster's name and its live nodes")
    _connection_options(sub, suppress=True)
    sub = commands.add_parser("shovel_status", help="every shovel: its state, source, destination and reconnects")
    _connection_options(sub, suppress=True)
    sub = commands.add_parser("federation_status", help="every federation link: its state, error and reconnects")
    sub.add_argument("--only-down", action="store_true", help="only the links neither starting nor running")
    _connection_options(sub, suppress=True)
    sub = commands.add_parser("help", help="help on one command")
    sub.add_argument("topic", nargs="?")
    return parser


def run_listing(session: Session, listing: Listing, args: argparse.Namespace, headers: bool) -> int:
    columns = list(getattr(args, "columns", None) or listing.defaults)
    unknown = [column for column in columns if column not in listing.columns]
    if unknown:
        raise CtlError(EX_USAGE, f"Info key(s) {','.join(unknown)} are not supported")
    arg = getattr(args, f"arg_{listing.needs_arg}") if listing.needs_arg else None
    title, path = listing.resolve(session.vhost, arg)
    session.info(title)
    try:
        items = session.client.get(path)
    except ApiError as error:
        if error.status == 404:
            what = f"User \"{arg}\"" if listing.needs_arg else f"Virtual host {session.vhost}"
            raise CtlError(EX_DATAERR, f"{what} does not exist") from None
        raise CtlError(EX_DATAERR, error.reason or error.error) from None
    rows = [[listing.value(item, column) for column in columns] for item in listing.listed(items)]
    if args.formatter == "json":
        write_json(session.out, columns, rows)
    else:
        write_table(session.out, columns, rows, headers)
    return EX_OK


def run(args: argparse.Namespace, parser: argparse.ArgumentParser, out: TextIO) -> int:
    if args.command in (None, "help"):
        topic = getattr(args, "topic", None)
        # The subcommands' parsers by name (argparse keeps no public handle on them; typeshed
        # types its private _subparsers Optional).
        commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
        if topic and isinstance(commands, dict) and topic in commands:
            commands[topic].print_help(out)
        else:
            parser.print_help(out)
        return EX_OK if args.command == "help" else EX_USAGE
    client = ManagementClient(args.host, args.port, args.username, args.password, args.timeout)
    session = Session(client, args.vhost, out, quiet=args.quiet or args.silent)
    if args.command in LISTINGS:
        headers = not (args.silent or args.no_table_headers)
        return run_listing(session, LISTINGS[args.command], args, headers)
    if args.command == "status":
        return status(session, args.formatter)
    if args.command == "cluster_status":
        return cluster_status(session, args.formatter)
    if args.command == "shovel_status":
        return shovel_commands.shovel_status(session, args.formatter, not (args.silent or args.no_table_headers))
    if args.command == "federation_status":
        return federation_commands.federation_status(session, args.only_down, args.formatter,
                                                     not (args.silent or args.no_table_headers))
    handler, arguments, _help = ADMIN_COMMANDS[args.command]
    values: list[Any] = []
    for argument in arguments:
        value = getattr(args, "arg_" + argument.rstrip("*+"))
        values.extend(value) if argument[-1] in _VARIADIC else values.append(value)
    if args.command == "delete_queue":
        return handler(session, *values, if_empty=args.if_empty, if_unused=args.if_unused)
    if args.command in _POLICY_SETTERS:
        return handler(session, *values, priority=args.priority, apply_to=args.apply_to)
    if args.command == "list_user_limits":
        return handler(session, args.limits_user)
    return handler(session, *values)


def _positionals(args: argparse.Namespace) -> list[str]:
    values: list[str] = []
    for key, value in vars(args).items():
        if key.startswith("arg_"):
            values.extend(value) if isinstance(value, list) else values.append(str(value))
    return values


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run one ctl command; returns the exit code (rabbitmqctl's sysexits codes)."""
    out = out or sys.stdout
    err = err or sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
        return run(args, parser, out)
    except _UsageError as error:
        err.write(f"Error (argument validation): {error}")
        return EX_USAGE
    except ArgumentError as error:
        out.flush()
        given = " ".join([args.command, *_positionals(args)])
        err.write(f"Error (argument validation): {error.message}\nArguments given:\n\t{given}\n")
        return error.code
    except CtlError as error:
        out.flush()
        err.write(f"Error:\n{error.message}\n")
        return error.code
