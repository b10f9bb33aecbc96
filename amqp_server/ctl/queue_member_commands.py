"""`add_member`, `delete_member` and `transfer_leadership`: rabbitmq-queues' commands for a
replicated (quorum) queue's group, with its arguments (`<queue> <node>`, the vhost given with
-p). They call this broker's own routes (amqp_server/management/replication_routes.py).

    add_member <queue> <node>            a new replica on <node>; it gets the whole log
    delete_member <queue> <node>         the replica on <node> goes (a leader hands over first)
    transfer_leadership <queue> <node>   <node> leads once it holds every record
"""

from __future__ import annotations

from amqp_server.ctl.admin_commands import Session, _call
from amqp_server.ctl.api_client import quote
from amqp_server.ctl.exit_codes import EX_OK


def _queue_path(session: Session, queue: str) -> str:
    return f"/api/amqp-server/queues/{quote(session.vhost)}/{quote(queue)}"


def add_member(session: Session, queue: str, node: str) -> int:
    session.info(f"Adding a replica for queue {queue} on node {node}...")
    _call(lambda: session.client.post(_queue_path(session, queue) + "/members", {"node": node}))
    return EX_OK


def delete_member(session: Session, queue: str, node: str) -> int:
    session.info(f"Removing a replica of queue {queue} on node {node}...")
    _call(lambda: session.client.delete(_queue_path(session, queue) + f"/members/{quote(node)}"))
    return EX_OK


def transfer_leadership(session: Session, queue: str, node: str) -> int:
    session.info(f"Transferring leadership of queue {queue} to node {node}...")
    _call(lambda: session.client.post(_queue_path(session, queue) + "/leader", {"node": node}))
    return EX_OK
