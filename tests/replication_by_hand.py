"""Driving the replication core's state machines by hand, sans-I/O (the tests of queue and
stream replicas): a group-commit round is a call (`fsync`), frames move by a call (`frame`), and
`replicate_queue` runs a leader and one follower of a queue's log until the leader has nothing
more to send, as a replica's shell (cluster/replication/replica.py) would."""

from __future__ import annotations

from cluster.replication.follower import FollowerReplication
from cluster.replication.leader import LeaderReplication
from cluster.replication.queue_log import QueueReplicaLog
from cluster.replication.wire import Ack, FrameReader, Mismatch, Reset
from persistence.group_commit import Syncable, sync_job


def fsync(log: Syncable) -> None:
    """One group-commit round of ``log``, done by hand."""
    job = log.prepare_sync()
    sync_job(job)
    log.sync_done(job, None)


def frame(data: bytes):
    (decoded,) = FrameReader().feed(data)
    return decoded


def replicate_queue(leader: LeaderReplication, leader_log: QueueReplicaLog, name: str,
                    follower: FollowerReplication, log: QueueReplicaLog,
                    sent: list[type] | None = None) -> None:
    """Send, fsync and acknowledge until ``leader`` has nothing more for follower ``name`` (whose
    log is ``log``). Each log hears the commit index as the shell tells it: the leader's when an
    acknowledgement raises it, the follower's ``committed_index`` after each round; then both
    fold what is committed. ``sent`` collects the kind of each frame the follower was sent."""
    while (data := leader.outgoing(name)) is not None:
        message = frame(data)
        if sent is not None:
            sent.append(type(message))
        reply = follower.on_reset(message) if isinstance(message, Reset) else follower.on_append(message)
        if reply is not None:
            answer = frame(reply)
            assert isinstance(answer, Mismatch)
            leader.on_mismatch(name, answer)
            continue
        fsync(log)
        ack = follower.ack()
        if ack is not None:
            acknowledged = frame(ack)
            assert isinstance(acknowledged, Ack)
            if leader.on_ack(name, acknowledged):
                leader_log.committed(leader.commit_index)
        log.committed(follower.committed_index)
    leader_log.apply_committed()
    log.apply_committed()
