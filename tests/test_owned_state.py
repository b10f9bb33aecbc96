"""A class owns its state: nothing outside a class assigns its attributes (issue 14, "Structure").

The product packages are parsed (not imported) and every assignment, augmented assignment,
annotated assignment or `del` of `X.attr` with X other than `self`/`cls`, and every
`setattr`/`delattr` on something other than `self`, is a finding. A finding is in ALLOWED
(reviewed: not another class's state, the reason beside it) or fails the test: give the owning
class a method that states the change instead, or move the attribute to the class that writes
it. There is no list of tolerated debt: the per-message path (Queue.dispatch and ack,
ReadyMessages.append and pop) uses the owners' methods too, at no more instructions per
message than its inline writes took (docs/benchmarks.md, "Hot path, issue 14").

Findings are keyed by file, enclosing function and the assigned expression, not line numbers,
so unrelated edits do not churn the list; an entry that no longer matches anything fails too,
so the list only shrinks with the code.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("amqp_server", "queues", "exchanges", "persistence", "cluster", "spark")
OWN = ("self", "cls")


def _flatten(target: ast.expr):
    if isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from _flatten(element)
    elif isinstance(target, ast.Starred):
        yield from _flatten(target.value)
    else:
        yield target


class _Finder(ast.NodeVisitor):
    def __init__(self, path: str) -> None:
        self.path = path
        self.scope: list[str] = []
        self.found: dict[str, list[int]] = {}

    def _add(self, what: str, line: int) -> None:
        key = f"{self.path}::{'.'.join(self.scope) or '<module>'}::{what}"
        self.found.setdefault(key, []).append(line)

    def _scoped(self, node: ast.AST) -> None:
        self.scope.append(node.name)  # type: ignore[attr-defined]
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def _targets(self, node: ast.AST, targets: list[ast.expr]) -> None:
        for target in targets:
            for item in _flatten(target):
                if isinstance(item, ast.Attribute) and not (
                    isinstance(item.value, ast.Name) and item.value.id in OWN
                ):
                    self._add(ast.unparse(item), node.lineno)  # type: ignore[attr-defined]
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        self._targets(node, node.targets)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._targets(node, [node.target])

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._targets(node, [node.target])

    def visit_Delete(self, node: ast.Delete) -> None:
        self._targets(node, node.targets)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("setattr", "delattr") and node.args:
            obj = node.args[0]
            if not (isinstance(obj, ast.Name) and obj.id in OWN):
                self._add(f"{func.id}({ast.unparse(obj)})", node.lineno)
        self.generic_visit(node)


def outside_assignments(root: Path = ROOT) -> dict[str, list[int]]:
    """Every outside assignment in the product packages: key -> line numbers."""
    found: dict[str, list[int]] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")) if (root / package).is_dir() else ():
            finder = _Finder(path.relative_to(root).as_posix())
            finder.visit(ast.parse(path.read_text(), str(path)))
            found.update(finder.found)
    return found


# -- reviewed: not another class's state ------------------------------------------------------

LIBRARY = "a standard-library object configured through its documented attributes (ssl.SSLContext, ctypes function prototype, logging.LogRecord in a Formatter)"
OWN_CLASSMETHOD = "a classmethod constructor finishing the instance of its own class it has just made"
CONFIG = "the Config dataclass tree being built by its loader in this module, before anyone else sees it"
SUMMARY = "a summary record (dataclass) created in this function and filled by it before it is returned"
MESSAGE_BUILT = "a Message (or pamqp Properties) created a line above in this function and filled before it is handed on"
RECOVERY = "recovery's result records (Recovery, SegmentEntry) being assembled while the journal files are replayed"
SYNC_JOB = "the SyncJob created in this function, filled before it is handed to the group committer"
COUNTERS = ("a counters record (BrokerStats, QueueStats: documented as plain integers bumped on the hot path), a "
            "__slots__ bag of independent counts with no invariant between them, bumped where the event happens; "
            "a method per count would be a call per message")
PRIVATE_RECORD = ("a record class private to this module (_Held, _Window, _Incoming, _Worker, _Follower, RemoteConsumer, "
                  "StoreWait, PagedRun, SegmentEntry, Timer), kept and mutated only by the one class of the module that owns it")
USER_ROWS = "a User row of AccessControl's user table, a dataclass of the same module that only AccessControl changes"

ALLOWED: dict[str, str] = {
    "amqp_server/broker/alarms.py::glibc_malloc_trim::trim.argtypes": LIBRARY,
    "amqp_server/broker/alarms.py::glibc_malloc_trim::trim.restype": LIBRARY,
    "amqp_server/channel/basic_methods.py::basic_get::connection.broker.stats.get": COUNTERS,
    "amqp_server/channel/basic_methods.py::basic_get::connection.broker.stats.get_empty": COUNTERS,
    "amqp_server/broker/broker.py::Broker._queue_deleted::self.stats.queues_deleted": COUNTERS,
    "amqp_server/broker/broker.py::Broker.connection_closed::self.stats.connections_closed": COUNTERS,
    "amqp_server/broker/broker.py::Broker.connection_opened::self.stats.connections_opened": COUNTERS,
    "amqp_server/channel/channel.py::Channel._complete_publish::stats.received": COUNTERS,
    "amqp_server/channel/channel.py::Channel._complete_publish::stats.received_bytes": COUNTERS,
    "amqp_server/channel/channel.py::Channel._complete_publish::stats.received_confirm": COUNTERS,
    "amqp_server/channel/channel.py::Channel.flush_confirms::self.connection.broker.stats.confirmed": COUNTERS,
    "amqp_server/channel/channel.py::Channel.route_publish::broker.stats.dropped": COUNTERS,
    "amqp_server/channel/channel.py::Channel.route_publish::broker.stats.returned": COUNTERS,
    "amqp_server/channel/channel.py::Channel.route_publish::broker.stats.routed": COUNTERS,
    "amqp_server/channel/channel.py::PublisherConfirms.hold_until_stored::wait.refused": PRIVATE_RECORD,
    "cluster/links/link.py::MirrorChannel.frame::incoming.body_size": PRIVATE_RECORD,
    "cluster/links/link.py::MirrorChannel.frame::incoming.raw_header": PRIVATE_RECORD,
    "cluster/links/link.py::MirrorChannel.frame::incoming.received": PRIVATE_RECORD,
    "cluster/links/remote_queue.py::RemoteQueue._fetched::broker.stats.get": COUNTERS,
    "cluster/links/remote_queue.py::RemoteQueue._fetched::broker.stats.get_empty": COUNTERS,
    "amqp_server/config/settings.py::_apply_overrides::setattr(target)": CONFIG,
    "amqp_server/config/settings.py::_parse_document::config.definitions_file": CONFIG,
    "amqp_server/config/settings.py::_parse_document::config.permissions": CONFIG,
    "amqp_server/config/settings.py::_parse_document::config.queue_defaults": CONFIG,
    "amqp_server/config/settings.py::_parse_document::config.storage.archive_vhosts": CONFIG,
    "amqp_server/config/settings.py::_parse_document::config.users": CONFIG,
    "amqp_server/config/settings.py::_parse_document::config.vhosts": CONFIG,
    "amqp_server/config/settings.py::_parse_document::setattr(config)": CONFIG,
    "amqp_server/config/settings.py::_parse_document::setattr(config.cluster)": CONFIG,
    "amqp_server/config/settings.py::_parse_document::setattr(config.limits)": CONFIG,
    "amqp_server/config/settings.py::_parse_document::setattr(config.management)": CONFIG,
    "amqp_server/config/settings.py::_parse_document::setattr(config.storage)": CONFIG,
    "amqp_server/config/settings.py::_parse_document::setattr(config.tls)": CONFIG,
    "amqp_server/config/settings.py::load_config::config.config_file": CONFIG,
    "amqp_server/config/settings.py::load_config::config.data_dir": CONFIG,
    "amqp_server/config/settings.py::load_config::config.definitions_file": CONFIG,
    "amqp_server/config/settings.py::load_config::setattr(config.cluster)": CONFIG,
    "amqp_server/config/settings.py::load_config::setattr(config.management)": CONFIG,
    "amqp_server/connection/connection.py::Connection._open_channel::self.broker.stats.channels_opened": COUNTERS,
    "amqp_server/connection/connection.py::Connection._release::self.broker.stats.channels_closed": COUNTERS,
    "amqp_server/connection/connection.py::Connection.close_channel::self.broker.stats.channels_closed": COUNTERS,
    "amqp_server/connection/connection.py::Connection.fail_channel::self.broker.stats.channels_closed": COUNTERS,
    "amqp_server/channel/declarations.py::queue_declare::connection.broker.stats.queues_created": COUNTERS,
    "amqp_server/channel/declarations.py::queue_declare::connection.broker.stats.queues_declared": COUNTERS,
    "amqp_server/runtime/log_escaping.py::EscapingFormatter.formatMessage::record.message": LIBRARY,
    "amqp_server/management/api_publish.py::publish::broker.stats.dropped": COUNTERS,
    "amqp_server/management/api_publish.py::publish::broker.stats.received": COUNTERS,
    "amqp_server/management/api_publish.py::publish::broker.stats.routed": COUNTERS,
    "amqp_server/management/definitions_import.py::_apply::broker.stats.queues_created": COUNTERS,
    "amqp_server/management/definitions_import.py::_apply::broker.stats.queues_declared": COUNTERS,
    "amqp_server/management/login_throttle.py::LoginThrottle.record_failure::window.failures": PRIVATE_RECORD,
    "amqp_server/management/queue_routes.py::put_queue::broker.stats.queues_created": COUNTERS,
    "amqp_server/management/queue_routes.py::put_queue::broker.stats.queues_declared": COUNTERS,
    "amqp_server/metrics/broker_view.py::take_snapshot::snapshot.channel_prefetch": SUMMARY,
    "amqp_server/metrics/broker_view.py::take_snapshot::snapshot.channel_unacked": SUMMARY,
    "amqp_server/metrics/broker_view.py::take_snapshot::snapshot.channels": SUMMARY,
    "amqp_server/metrics/broker_view.py::take_snapshot::snapshot.consumer_prefetch": SUMMARY,
    "amqp_server/metrics/broker_view.py::take_snapshot::snapshot.consumers": SUMMARY,
    "amqp_server/metrics/broker_view.py::take_snapshot::snapshot.dead_lettered": SUMMARY,
    "amqp_server/metrics/broker_view.py::take_snapshot::snapshot.exchanges": SUMMARY,
    "amqp_server/metrics/broker_view.py::take_snapshot::snapshot.messages_ready": SUMMARY,
    "amqp_server/metrics/broker_view.py::take_snapshot::snapshot.messages_ready_bytes": SUMMARY,
    "amqp_server/metrics/broker_view.py::take_snapshot::snapshot.messages_unacked": SUMMARY,
    "amqp_server/metrics/broker_view.py::take_snapshot::snapshot.publishers": SUMMARY,
    "amqp_server/metrics/broker_view.py::take_snapshot::snapshot.queues": SUMMARY,
    "amqp_server/metrics/broker_view.py::take_snapshot::snapshot.received_confirm": SUMMARY,
    "amqp_server/metrics/broker_view.py::take_snapshot::snapshot.tx_uncommitted_acks": SUMMARY,
    "amqp_server/metrics/broker_view.py::take_snapshot::snapshot.tx_uncommitted_messages": SUMMARY,
    "amqp_server/metrics/broker_view.py::take_snapshot::snapshot.unconfirmed": SUMMARY,
    "amqp_server/channel/ordered_replies.py::OrderedReplies._done::entry.ready": PRIVATE_RECORD,
    "amqp_server/channel/ordered_replies.py::OrderedReplies.fill::entry.frame": PRIVATE_RECORD,
    "amqp_server/channel/ordered_replies.py::OrderedReplies.fill_later::entry.frame": PRIVATE_RECORD,
    "amqp_server/channel/ordered_replies.py::OrderedReplies.release::entry.failure": PRIVATE_RECORD,
    "amqp_server/channel/settlement.py::apply_settlement::stats.acked": COUNTERS,
    "amqp_server/config/tls.py::build_server_context::context.maximum_version": LIBRARY,
    "amqp_server/config/tls.py::build_server_context::context.minimum_version": LIBRARY,
    "amqp_server/config/tls.py::build_server_context::context.options": LIBRARY,
    "amqp_server/config/tls.py::build_server_context::context.verify_mode": LIBRARY,
    "amqp_server/runtime/workers.py::Supervisor._exited::worker.channel": PRIVATE_RECORD,
    "amqp_server/runtime/workers.py::Supervisor._exited::worker.process": PRIVATE_RECORD,
    "amqp_server/runtime/workers.py::Supervisor._exited::worker.restart_at": PRIVATE_RECORD,
    "amqp_server/runtime/workers.py::Supervisor._on_time::worker.heard_at": PRIVATE_RECORD,
    "amqp_server/runtime/workers.py::Supervisor._spawn::worker.channel": PRIVATE_RECORD,
    "amqp_server/runtime/workers.py::Supervisor._spawn::worker.heard_at": PRIVATE_RECORD,
    "amqp_server/runtime/workers.py::Supervisor._spawn::worker.process": PRIVATE_RECORD,
    "amqp_server/runtime/workers.py::Supervisor._spawn::worker.restart_at": PRIVATE_RECORD,
    "amqp_server/runtime/workers.py::Supervisor._stop::worker.restart_at": PRIVATE_RECORD,
    "amqp_server/runtime/workers.py::Supervisor._worker_readable::worker.heard_at": PRIVATE_RECORD,
    "cluster/etcd.py::EtcdCoordinator.open::coordinator._keepalive": OWN_CLASSMETHOD,
    "cluster/replication/leader.py::LeaderReplication.follower_connected::follower.awaiting": PRIVATE_RECORD,
    "cluster/replication/leader.py::LeaderReplication.follower_connected::follower.connected": PRIVATE_RECORD,
    "cluster/replication/leader.py::LeaderReplication.follower_connected::follower.match_index": PRIVATE_RECORD,
    "cluster/replication/leader.py::LeaderReplication.follower_connected::follower.next_index": PRIVATE_RECORD,
    "cluster/replication/leader.py::LeaderReplication.follower_connected::follower.probing": PRIVATE_RECORD,
    "cluster/replication/leader.py::LeaderReplication.follower_connected::follower.window_base": PRIVATE_RECORD,
    "cluster/replication/leader.py::LeaderReplication.follower_lost::follower.connected": PRIVATE_RECORD,
    "cluster/replication/leader.py::LeaderReplication.follower_lost::follower.in_sync": PRIVATE_RECORD,
    "cluster/replication/leader.py::LeaderReplication.on_ack::follower.awaiting": PRIVATE_RECORD,
    "cluster/replication/leader.py::LeaderReplication.on_ack::follower.in_sync": PRIVATE_RECORD,
    "cluster/replication/leader.py::LeaderReplication.on_ack::follower.match_index": PRIVATE_RECORD,
    "cluster/replication/leader.py::LeaderReplication.on_ack::follower.next_index": PRIVATE_RECORD,
    "cluster/replication/leader.py::LeaderReplication.on_ack::follower.probing": PRIVATE_RECORD,
    "cluster/replication/leader.py::LeaderReplication.on_mismatch::follower.awaiting": PRIVATE_RECORD,
    "cluster/replication/leader.py::LeaderReplication.on_mismatch::follower.match_index": PRIVATE_RECORD,
    "cluster/replication/leader.py::LeaderReplication.on_mismatch::follower.next_index": PRIVATE_RECORD,
    "cluster/replication/leader.py::LeaderReplication.on_mismatch::follower.probing": PRIVATE_RECORD,
    "cluster/replication/leader.py::LeaderReplication.on_mismatch::follower.window_base": PRIVATE_RECORD,
    "cluster/replication/leader.py::LeaderReplication.outgoing::follower.awaiting": PRIVATE_RECORD,
    "cluster/replication/leader.py::LeaderReplication.outgoing::follower.next_index": PRIVATE_RECORD,
    "persistence/definition_table.py::DefinitionTable.from_document::table._extras": OWN_CLASSMETHOD,
    "persistence/store_recovery.py::_Replay._collect_survivors::entry.states": RECOVERY,
    "persistence/store_recovery.py::_Replay._collect_survivors::recovery.next_seq": RECOVERY,
    "persistence/store_recovery.py::_Replay._replay_file::entry.size": RECOVERY,
    "persistence/queue_store.py::QueueStore._reset_drained_tail::tail.size": PRIVATE_RECORD,
    "persistence/queue_store.py::QueueStore.flush::tail.size": PRIVATE_RECORD,
    "persistence/queue_store.py::QueueStore.prepare_sync::job.directories": SYNC_JOB,
    "persistence/queue_store.py::QueueStore.prepare_sync::job.paths": SYNC_JOB,
    "persistence/queue_store.py::QueueStore.recover::recovery.next_seq": RECOVERY,
    "queues/dead_letter.py::dead_lettered::copy.published_at": MESSAGE_BUILT,
    "queues/dead_letter.py::hand_off::setattr(stats)": COUNTERS,
    "queues/delays/delayed_exchange.py::_released_copy::copy.published_at": MESSAGE_BUILT,
    "queues/journal.py::QueueJournal.load_message::message.published_at": MESSAGE_BUILT,
    "queues/message.py::Message.with_raw_properties::copy.published_at": MESSAGE_BUILT,
    "queues/message.py::_decode_properties_leniently::setattr(properties)": MESSAGE_BUILT,
    "queues/queue.py::Queue.ack::self.stats.acked": COUNTERS,
    "queues/queue.py::Queue.dispatch::stats.delivered": COUNTERS,
    "queues/queue.py::Queue.dispatch::stats.delivered_no_ack": COUNTERS,
    "queues/queue.py::Queue.dispatch::stats.redelivered": COUNTERS,
    "queues/queue.py::Queue.get::self.stats.get": COUNTERS,
    "queues/queue.py::Queue.get::self.stats.get_empty": COUNTERS,
    "queues/queue.py::Queue.get::self.stats.get_no_ack": COUNTERS,
    "queues/queue.py::Queue.get::self.stats.redelivered": COUNTERS,
    "queues/queue.py::Queue.publish::self.stats.published": COUNTERS,
    "queues/ready_messages.py::ReadyMessages._load_from::run.start": PRIVATE_RECORD,
    "queues/ready_messages.py::ReadyMessages.take_paged::run.start": PRIVATE_RECORD,
    "queues/timers.py::Timers.run_due::timer.callback": PRIVATE_RECORD,
    "queues/timers.py::Timers.run_due::timer.cancelled": PRIVATE_RECORD,
    "spark/report.py::summarize::q.bytes": SUMMARY,
    "spark/report.py::summarize::q.dead_lettered": SUMMARY,
    "spark/report.py::summarize::q.messages": SUMMARY,
    "spark/report.py::summarize::q.oldest_ready_age_s": SUMMARY,
    "spark/report.py::summarize::q.redelivered": SUMMARY,
    "cluster/links/remote_queue.py::RemoteQueue._consume_answered::remote.active": PRIVATE_RECORD,
    "cluster/links/remote_queue.py::RemoteQueue._consume_on_owner::remote.mirror": PRIVATE_RECORD,
    "cluster/links/remote_queue.py::RemoteQueue._cancel::remote.parked": PRIVATE_RECORD,
    "cluster/links/remote_queue.py::RemoteQueue._park::remote.parked": PRIVATE_RECORD,
    "cluster/links/remote_queue.py::RemoteQueue.owner_cancelled::remote.active": PRIVATE_RECORD,
    "amqp_server/broker/access_control.py::AccessControl.change_password::user.password_hash": USER_ROWS,
    "amqp_server/broker/access_control.py::AccessControl.set_user::user.password_hash": USER_ROWS,
    "amqp_server/broker/access_control.py::AccessControl.set_user::user.tags": USER_ROWS,
}

def test_nothing_outside_a_class_assigns_its_attributes() -> None:
    found = outside_assignments()
    new = {key: lines for key, lines in found.items() if key not in ALLOWED}
    assert not new, (
        "attributes assigned from outside their class (give the owner a method that states the change, "
        "or move the attribute to the class that writes it):\n"
        + "\n".join(f"  {key} (line {', '.join(map(str, lines))})" for key, lines in sorted(new.items()))
    )


def test_every_listed_exception_still_exists() -> None:
    found = outside_assignments()
    stale = sorted(key for key in ALLOWED if key not in found)
    assert not stale, "no longer found, remove from the lists:\n" + "\n".join(f"  {key}" for key in stale)


def test_every_exception_says_why() -> None:
    assert all(reason.strip() for reason in ALLOWED.values())


def test_the_checker_finds_each_kind_of_outside_assignment(tmp_path: Path) -> None:
    package = tmp_path / "queues"
    package.mkdir()
    (package / "m.py").write_text(
        "class A:\n"
        "    def f(self, budget, entry, obj):\n"
        "        self.mine = 1\n"
        "        budget.held += 1\n"
        "        entry.persisted = True\n"
        "        self.other.count: int = 0\n"
        "        del obj.attr\n"
        "        setattr(obj, 'x', 1)\n"
        "        setattr(self, 'y', 1)\n"
    )
    assert sorted(outside_assignments(tmp_path)) == [
        "queues/m.py::A.f::budget.held",
        "queues/m.py::A.f::entry.persisted",
        "queues/m.py::A.f::obj.attr",
        "queues/m.py::A.f::self.other.count",
        "queues/m.py::A.f::setattr(obj)",
    ]


if __name__ == "__main__":
    for key, lines in sorted(outside_assignments().items()):
        print(key, lines)
