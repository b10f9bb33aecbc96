"""A class owns its state: nothing outside a class assigns its attributes or changes its
collections (issue 14, "Structure"; issue 22, point 4).

The product packages are parsed (not imported) and every assignment, augmented assignment,
annotated assignment or `del` of `X.attr` with X other than `self`/`cls`, and every
`setattr`/`delattr` on something other than `self`, is a finding. So is every change of a
collection held in such an attribute: a call of a mutating method on it (MUTATORS:
`other.items.append(x)`, `channel.timed_out.discard(tag)`, `queue.ready.pop()`), a heapq or
bisect function given it, and an item assignment, augmented item assignment or item `del`
(`other.table[key] = value`, `del other.table[key]`). A local name or a parameter is not
looked into (a handler that is handed the store it changes changes it through the store's
methods), and a method is told from a list's only by its name.

A finding is in ALLOWED (reviewed: not another class's state, the reason beside it), in
KNOWN_OFFENDERS (another class's state, left for the branch that owns the code, the owner
beside it), or fails the test: give the owning class a method that states the change instead,
or move the attribute to the class that writes it, or hand the function the object it
changes. The per-message path (Queue.dispatch and ack, ReadyMessages.append and pop) uses the
owners' methods too, at no more instructions per message than its inline writes took
(docs/benchmarks.md, "Hot path, issue 14").

Findings are keyed by file, enclosing function and the assigned expression (a collection's
change by the collection and the method, `other.items.append()`, or `other.table[]`), not line
numbers, so unrelated edits do not churn the lists; an entry that no longer matches anything
fails too, so the lists only shrink with the code.
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


# Methods that change the collection they are called on (list, dict, set, deque, OrderedDict),
# and the heapq and bisect functions that change the list they are given first.
MUTATORS = frozenset((
    "append", "appendleft", "extend", "extendleft", "insert", "pop", "popleft", "popitem", "remove", "discard",
    "add", "clear", "update", "setdefault", "sort", "reverse", "rotate", "move_to_end", "difference_update",
    "intersection_update", "symmetric_difference_update", "__setitem__", "__delitem__",
))
MUTATING_FUNCTIONS = frozenset(("heappush", "heappop", "heapify", "heapreplace", "heappushpop", "insort",
                                "insort_left", "insort_right"))


def _outside_collection(expr: ast.expr) -> ast.Attribute | None:
    """The attribute `X.attr` (X not `self`/`cls`) that `expr` is, or indexes into (`X.attr[k]`,
    `X.attr[k][j]`); None for a local, a parameter or an attribute of self."""
    while isinstance(expr, ast.Subscript):
        expr = expr.value
    if isinstance(expr, ast.Attribute) and not (isinstance(expr.value, ast.Name) and expr.value.id in OWN):
        return expr
    return None


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
                elif isinstance(item, ast.Subscript):
                    # other.x[k] = v, other.x[k] += v, del other.x[k]: a change of other's collection
                    collection = _outside_collection(item)
                    if collection is not None:
                        self._add(f"{ast.unparse(collection)}[]", node.lineno)  # type: ignore[attr-defined]
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
        elif isinstance(func, ast.Attribute) and func.attr in MUTATORS:
            collection = _outside_collection(func.value)
            if collection is not None:
                self._add(f"{ast.unparse(collection)}.{func.attr}()", node.lineno)
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name in MUTATING_FUNCTIONS and node.args:
            collection = _outside_collection(node.args[0])
            if collection is not None:
                self._add(f"{name}({ast.unparse(collection)})", node.lineno)
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

LIBRARY = ("a standard-library or aiohttp object configured through its documented attributes (ssl.SSLContext, "
           "ctypes function prototype, logging.LogRecord in a Formatter, os.environ, aiohttp Application.cleanup_ctx)")
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
                  "StoreWait, PagedRun, SegmentEntry, Timer, _Round), kept and mutated only by the one class of the module "
                  "that owns it")
USER_ROWS = "a User row of AccessControl's user table, a dataclass of the same module that only AccessControl changes"
IMPORT_PLAN = ("the _Plan a definitions import makes, private to this module: its checks fill it in turn before _apply "
               "carries it out")

ALLOWED: dict[str, str] = {
    "amqp_server/broker/alarms.py::glibc_malloc_trim::trim.argtypes": LIBRARY,
    "amqp_server/broker/alarms.py::glibc_malloc_trim::trim.restype": LIBRARY,
    "amqp_server/peer_link/uri.py::PeerAddress.ssl_context::context.check_hostname": LIBRARY,
    "amqp_server/peer_link/uri.py::PeerAddress.ssl_context::context.verify_mode": LIBRARY,
    "amqp_server/channel/answers.py::GetReply.got::connection.broker.stats.get": COUNTERS,
    "amqp_server/channel/answers.py::GetReply.empty::self._channel.connection.broker.stats.get_empty": COUNTERS,
    "amqp_server/broker/broker.py::Broker._queue_deleted::self.stats.queues_deleted": COUNTERS,
    "amqp_server/broker/broker.py::Broker.connection_closed::self.stats.connections_closed": COUNTERS,
    "amqp_server/broker/broker.py::Broker.connection_opened::self.stats.connections_opened": COUNTERS,
    "amqp_server/channel/channel.py::Channel._complete_publish::stats.received": COUNTERS,
    "amqp_server/channel/channel.py::Channel._complete_publish::stats.received_bytes": COUNTERS,
    "amqp_server/channel/channel.py::Channel._complete_publish::stats.received_confirm": COUNTERS,
    "amqp_server/channel/channel.py::Channel.flush_confirms::self.connection.broker.stats.confirmed": COUNTERS,
    "amqp_server/channel/channel.py::Channel.enqueue::broker.stats.dropped": COUNTERS,
    "amqp_server/channel/channel.py::Channel.enqueue::broker.stats.returned": COUNTERS,
    "amqp_server/channel/channel.py::Channel.enqueue::broker.stats.routed": COUNTERS,
    "amqp_server/channel/channel.py::PublisherConfirms.hold_until_stored::wait.refused": PRIVATE_RECORD,
    "cluster/links/link.py::MirrorChannel.frame::incoming.body_size": PRIVATE_RECORD,
    "cluster/links/link.py::MirrorChannel.frame::incoming.raw_header": PRIVATE_RECORD,
    "cluster/links/link.py::MirrorChannel.frame::incoming.received": PRIVATE_RECORD,
    "amqp_server/config/settings.py::_apply_overrides::setattr(target)": CONFIG,
    "amqp_server/config/settings.py::_parse_document::config.definitions_file": CONFIG,
    "amqp_server/config/settings.py::_parse_document::config.permissions": CONFIG,
    "amqp_server/config/settings.py::_parse_document::config.queue_defaults": CONFIG,
    "amqp_server/config/settings.py::_parse_document::config.shovels": CONFIG,
    "amqp_server/config/settings.py::_parse_document::config.storage.archive_vhosts": CONFIG,
    "amqp_server/config/settings.py::_parse_document::config.users": CONFIG,
    "amqp_server/config/settings.py::_parse_document::config.vhosts": CONFIG,
    "amqp_server/config/settings.py::_parse_document::setattr(target)": CONFIG,  # each section's part of the configuration
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
    "cluster/replication/leader.py::LeaderReplication.outgoing::follower.told_commit": PRIVATE_RECORD,
    "cluster/replication/leader.py::LeaderReplication.outgoing::follower.window_base": PRIVATE_RECORD,
    "persistence/definition_table.py::DefinitionTable.from_document::table._extras": OWN_CLASSMETHOD,
    "persistence/store_recovery.py::_Replay._collect_survivors::entry.states": RECOVERY,
    "persistence/store_recovery.py::_Replay._collect_survivors::recovery.next_seq": RECOVERY,
    "persistence/store_recovery.py::_Replay._replay_file::entry.size": RECOVERY,
    "persistence/queue_store.py::QueueStore._reset_drained_tail::tail.size": PRIVATE_RECORD,
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
    "queues/stream_queue.py::StreamQueue.ack::self.stats.acked": COUNTERS,
    "queues/stream_queue.py::StreamQueue.ack_many::self.stats.acked": COUNTERS,
    "queues/stream_queue.py::StreamQueue.dispatch::stats.delivered": COUNTERS,
    "queues/stream_queue.py::StreamQueue.publish::self.stats.published": COUNTERS,
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
    "cluster/links/remote_queue.py::RemoteQueue.dispatch::remote.last_message": PRIVATE_RECORD,
    "cluster/links/remote_queue.py::RemoteQueue.owner_cancelled::remote.active": PRIVATE_RECORD,
    "amqp_server/broker/access_control.py::AccessControl.change_password::user.password_hash": USER_ROWS,
    "amqp_server/broker/access_control.py::AccessControl.set_user::user.password_hash": USER_ROWS,
    "amqp_server/broker/access_control.py::AccessControl.set_user::user.tags": USER_ROWS,
    # -- changes of collections (issue 22) --
    "amqp_server/channel/channel.py::Channel._complete_publish::stats.received_sizes[]": COUNTERS,
    "amqp_server/channel/channel.py::PublisherConfirms.hold_until_stored::wait.refused.add()": PRIVATE_RECORD,
    "amqp_server/channel/channel.py::PublisherConfirms.hold_until_stored::wait.seqs.append()": PRIVATE_RECORD,
    "amqp_server/management/app.py::build_management_app::app.cleanup_ctx.append()": LIBRARY,
    "amqp_server/management/definitions_import.py::_check_access::plan.not_applied.append()": IMPORT_PLAN,
    "amqp_server/management/definitions_import.py::_check_access::plan.permissions.append()": IMPORT_PLAN,
    "amqp_server/management/definitions_import.py::_check_access::plan.users.append()": IMPORT_PLAN,
    "amqp_server/management/definitions_import.py::_check_access::plan.vhosts.append()": IMPORT_PLAN,
    "amqp_server/management/definitions_import.py::_check_policies::plan.not_applied.append()": IMPORT_PLAN,
    "amqp_server/management/definitions_import.py::_check_policies::plan.parameters.append()": IMPORT_PLAN,
    "amqp_server/management/definitions_import.py::_check_policies::plan.vhosts.append()": IMPORT_PLAN,
    "amqp_server/management/definitions_import.py::_check_topology::plan.bindings.append()": IMPORT_PLAN,
    "amqp_server/management/definitions_import.py::_check_topology::plan.exchanges.append()": IMPORT_PLAN,
    "amqp_server/management/definitions_import.py::_check_topology::plan.not_applied.append()": IMPORT_PLAN,
    "amqp_server/management/definitions_import.py::_check_topology::plan.queues.append()": IMPORT_PLAN,
    "amqp_server/management/definitions_import.py::_plan_policy::plan.not_applied.append()": IMPORT_PLAN,
    "amqp_server/management/definitions_import.py::_plan_policy::plan.policies.append()": IMPORT_PLAN,
    "amqp_server/metrics/broker_view.py::take_snapshot::snapshot.queue_stats.add()": SUMMARY,
    "cluster/links/link.py::MirrorChannel.frame::incoming.parts.append()": PRIVATE_RECORD,
    "cluster/links/remote_queue.py::RemoteQueue.delete::remote.waiting.clear()": PRIVATE_RECORD,
    "cluster/links/remote_queue.py::RemoteQueue.delivered::remote.waiting.append()": PRIVATE_RECORD,
    "cluster/links/remote_queue.py::RemoteQueue.owner_cancelled::remote.waiting.popleft()": PRIVATE_RECORD,
    "cluster/links/remote_queue.py::RemoteQueue.remove_consumer::remote.waiting.popleft()": PRIVATE_RECORD,
    "persistence/group_commit.py::GroupCommitter._start_round::round_.errors[]": PRIVATE_RECORD,
    "persistence/group_commit.py::GroupCommitter._start_round::round_.jobs[]": PRIVATE_RECORD,
    "persistence/group_commit.py::GroupCommitter.request_sync::self._pending.requests.setdefault()": PRIVATE_RECORD,
    "persistence/store_recovery.py::_Replay._apply_purge::current.refs.add()": RECOVERY,
    "persistence/store_recovery.py::_Replay._apply_purge::self.recovery.due_at_ms.pop()": RECOVERY,
    "persistence/store_recovery.py::_Replay._apply_purge::self.recovery.expiring_properties.pop()": RECOVERY,
    "persistence/store_recovery.py::_Replay._apply_state::current.refs.add()": RECOVERY,
    "persistence/store_recovery.py::_Replay._apply_state::entry.states[]": RECOVERY,
    "persistence/store_recovery.py::_Replay._apply_state::self.recovery.due_at_ms.pop()": RECOVERY,
    "persistence/store_recovery.py::_Replay._apply_state::self.recovery.due_at_ms[]": RECOVERY,
    "persistence/store_recovery.py::_Replay._apply_state::self.recovery.expiring_properties.pop()": RECOVERY,
    "persistence/store_recovery.py::_Replay._collect_survivors::recovery.body_sizes.append()": RECOVERY,
    "persistence/store_recovery.py::_Replay._collect_survivors::recovery.body_sizes.extend()": RECOVERY,
    "persistence/store_recovery.py::_Replay._collect_survivors::recovery.delivery_counts.append()": RECOVERY,
    "persistence/store_recovery.py::_Replay._collect_survivors::recovery.delivery_counts.extend()": RECOVERY,
    "persistence/store_recovery.py::_Replay._collect_survivors::recovery.flags.append()": RECOVERY,
    "persistence/store_recovery.py::_Replay._collect_survivors::recovery.flags.extend()": RECOVERY,
    "persistence/store_recovery.py::_Replay._collect_survivors::recovery.published_at_ms.append()": RECOVERY,
    "persistence/store_recovery.py::_Replay._collect_survivors::recovery.published_at_ms.extend()": RECOVERY,
    "persistence/store_recovery.py::_Replay._collect_survivors::recovery.seqs.append()": RECOVERY,
    "persistence/store_recovery.py::_Replay._collect_survivors::recovery.seqs.extend()": RECOVERY,
    "persistence/store_recovery.py::_Replay._problem::self.recovery.problems.append()": RECOVERY,
    "persistence/queue_store.py::QueueStore._reset_drained_tail::tail.refs.clear()": PRIVATE_RECORD,
    "persistence/queue_store.py::QueueStore.append_state::entry.states[]": PRIVATE_RECORD,
    "persistence/queue_store.py::QueueStore.append_state::tail.refs.add()": PRIVATE_RECORD,
    "persistence/queue_store.py::QueueStore.purge::tail.refs.update()": PRIVATE_RECORD,
    "persistence/queue_store.py::QueueStore.prepare_sync::job.fds.append()": SYNC_JOB,
    "spark/report.py::summarize::q.by_state[]": SUMMARY,
    "spark/report.py::summarize::q.top_routing_keys.append()": SUMMARY,
    "spark/session.py::prepare_environment::os.environ.setdefault()": LIBRARY,
    "spark/session.py::prepare_environment::os.environ[]": LIBRARY,
}

# -- another class's state, left to the branch that owns the code ----------------------------
#
# Found when the check was extended to collections (issue 22, point 4), outside amqp_server/channel/,
# whose handlers were changed to take the objects they change. Each is for its owner to fix.

QUEUES_OWNER = "queues/: the queue's ready list is changed from outside Queue (for the branch splitting queues/queue.py)"
KNOWN_OFFENDERS: dict[str, str] = {
    "queues/length_limit.py::drop_head_over_limit::queue.ready.pop()": QUEUES_OWNER,
    "queues/message_ttl.py::MessageExpiry.expire_due::queue.ready.remove()": QUEUES_OWNER,
    "queues/congestion.py::CongestedQueues.add::queue.flow_waiters[]": (
        "queues/: a publisher's CongestedQueues registers itself in Queue.flow_waiters; Queue should offer the "
        "registration (for the branch splitting queues/queue.py)"),
    "queues/congestion.py::CongestedQueues.clear::queue.flow_waiters.pop()": (
        "queues/: as CongestedQueues.add, the unregistration (for the branch splitting queues/queue.py)"),
}

def test_nothing_outside_a_class_assigns_its_attributes() -> None:
    found = outside_assignments()
    new = {key: lines for key, lines in found.items() if key not in ALLOWED and key not in KNOWN_OFFENDERS}
    assert not new, (
        "attributes assigned, or collections changed, from outside their class (give the owner a method that "
        "states the change, move the attribute to the class that writes it, or hand the function the object "
        "it changes):\n"
        + "\n".join(f"  {key} (line {', '.join(map(str, lines))})" for key, lines in sorted(new.items()))
    )


def test_every_listed_exception_still_exists() -> None:
    found = outside_assignments()
    stale = sorted(key for key in [*ALLOWED, *KNOWN_OFFENDERS] if key not in found)
    assert not stale, "no longer found, remove from the lists:\n" + "\n".join(f"  {key}" for key in stale)


def test_every_exception_says_why() -> None:
    assert all(reason.strip() for reason in [*ALLOWED.values(), *KNOWN_OFFENDERS.values()])
    assert not set(ALLOWED) & set(KNOWN_OFFENDERS)


def test_no_known_offender_is_in_the_channel() -> None:
    # amqp_server/channel/ was changed to hand its handlers the objects they change (issue 22, point 4).
    assert not [key for key in KNOWN_OFFENDERS if key.startswith("amqp_server/channel/")]


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


def test_the_checker_finds_each_kind_of_outside_collection_change(tmp_path: Path) -> None:
    package = tmp_path / "queues"
    package.mkdir()
    (package / "m.py").write_text(
        "import heapq\n"
        "class A:\n"
        "    def f(self, channel, queue, local, unacked):\n"
        "        self.mine.append(1)\n"
        "        self.table[1] = 2\n"
        "        local.append(1)\n"
        "        local[1] = 2\n"
        "        unacked.pop(3)\n"
        "        channel.timed_out.discard(3)\n"
        "        channel.consumers.pop('tag', None)\n"
        "        queue.ready.append(4)\n"
        "        self.other.items.clear()\n"
        "        channel.table[1] = 2\n"
        "        channel.counts[1][2] += 1\n"
        "        del queue.waiters[self]\n"
        "        heapq.heappush(queue.heap, 5)\n"
        "        channel.unacked.pop_up_to(3)\n"
        "        queue.ready.count\n"
    )
    assert sorted(outside_assignments(tmp_path)) == [
        "queues/m.py::A.f::channel.consumers.pop()",
        "queues/m.py::A.f::channel.counts[]",
        "queues/m.py::A.f::channel.table[]",
        "queues/m.py::A.f::channel.timed_out.discard()",
        "queues/m.py::A.f::heappush(queue.heap)",
        "queues/m.py::A.f::queue.ready.append()",
        "queues/m.py::A.f::queue.waiters[]",
        "queues/m.py::A.f::self.other.items.clear()",
    ]


if __name__ == "__main__":
    for key, lines in sorted(outside_assignments().items()):
        print(key, lines)
