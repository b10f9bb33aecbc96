"""`ReplicaManager`: a group record naming a node is enough for that node to hold a replica of
the queue, and deleting the group removes every member's copy; `group_members` sizes groups as
RabbitMQ sizes quorum queues."""

from __future__ import annotations

import asyncio

import pytest

from cluster.replication.manager import ReplicaManager, group_members
from cluster.replication.replica import Role
from interop_tests.waiting import wait_until_async
from persistence.group_commit import GroupCommitter
from tests.memory_coordinator import MemoryCoordinator, MemoryService


def test_group_size_defaults_to_three_or_the_cluster_and_starts_with_this_node():
    assert group_members("n2", ["n1", "n2", "n3", "n4", "n5"]) == ["n2", "n1", "n3"]
    assert group_members("n1", ["n1", "n2"]) == ["n1", "n2"]  # a smaller cluster: all of it
    assert group_members("n1", ["n1", "n2", "n3", "n4", "n5"], size=5) == ["n1", "n2", "n3", "n4", "n5"]
    assert group_members("n1", ["n1", "n2", "n3"], size=1) == ["n1"]
    with pytest.raises(ValueError):
        group_members("n1", ["n1"], size=0)


@pytest.mark.parametrize("watch", [False, True])
def test_members_follow_a_group_that_names_them_and_drop_it_when_deleted(tmp_path, watch):
    """(watch: the managers watch the records and leases, and a settled replica reads its keys
    only every 30 s unless woken: everything here happens through the watches.)"""
    async def scenario():
        service = MemoryService()
        managers = {n: ReplicaManager(node=n, coordinator=MemoryCoordinator(service), data_dir=tmp_path / n,
                                      committer=GroupCommitter("always"), secret=b"s3cret", poll_interval=0.05,
                                      replica_poll_interval=0.02, watch=watch, idle_poll_interval=30.0)
                    for n in ("a", "b", "c", "d")}
        for manager in managers.values():
            await manager.start("127.0.0.1")
        commits: list[int] = []
        roles: list[Role] = []
        members = group_members("a", managers)  # a, b, c: d holds nothing
        replica = managers["a"].host("/:q", members, commits.append, roles.append)
        await wait_until_async(lambda: roles and roles[-1] is Role.LEADER, "a leads")  # the declaring node leads
        index = replica.publish(b"first")
        await wait_until_async(lambda: commits and commits[-1] >= index, "the first entry committed")
        for name in ("b", "c"):
            await wait_until_async(lambda: "/:q" in managers[name].replicas
                                   and managers[name].replicas["/:q"].log.durable_index >= index,
                                   f"{name}'s replica has the entry on disk")
        assert managers["d"].replicas == {}
        await managers["a"].delete_group("/:q")
        for name in ("b", "c"):
            await wait_until_async(lambda: "/:q" not in managers[name].replicas
                                   and not any((tmp_path / name / "replicas").iterdir()),
                                   f"{name} dropped the group and its files")
        assert not any(key.startswith(("replicas/", "replica-leases/")) for key in service.keys)
        for manager in managers.values():
            await manager.close()
    asyncio.run(scenario())


def test_a_group_deleted_and_made_again_under_the_same_name_is_not_mixed_with_the_old_one(tmp_path):
    """A member away while the group was deleted and made again, and one that did not notice the
    deletion, both end with the new group's entries only (an old log matching the new one by
    index and term would otherwise pass for it)."""
    async def scenario():
        service = MemoryService()

        def manager(name: str, poll: float = 0.05) -> ReplicaManager:
            return ReplicaManager(node=name, coordinator=MemoryCoordinator(service), data_dir=tmp_path / name,
                                  committer=GroupCommitter("always"), secret=b"s3cret", poll_interval=poll,
                                  replica_poll_interval=0.02)

        managers = {"a": manager("a"), "b": manager("b"), "c": manager("c", poll=3600)}  # c lists groups once
        for one in managers.values():
            await one.start("127.0.0.1")
        commits: list[int] = []
        roles: list[Role] = []
        replica = managers["a"].host("/:q", ["a", "b", "c"], commits.append, roles.append)
        await wait_until_async(lambda: roles and roles[-1] is Role.LEADER, "a leads")
        for body in (b"old-1", b"old-2"):
            index = replica.publish(body)
        await managers["c"].sync_groups()
        for name in ("b", "c"):
            await wait_until_async(lambda: "/:q" in managers[name].replicas
                                   and managers[name].replicas["/:q"].log.durable_index >= index,
                                   f"{name}'s replica has the old entries on disk")
        await wait_until_async(lambda: (tmp_path / "b" / "replicas").exists() and any(
            (d / "incarnation").exists() for d in (tmp_path / "b" / "replicas").iterdir()),
            "b's replica directory has its incarnation")
        await managers["b"].close()  # b is away while the queue is deleted and declared again

        await managers["a"].delete_group("/:q")
        roles.clear()
        replica = managers["a"].host("/:q", ["a", "b", "c"], commits.append, roles.append)
        await wait_until_async(lambda: roles and roles[-1] is Role.LEADER, "a leads the new incarnation")
        index = replica.publish(b"new-1")

        managers["b"] = manager("b")
        await managers["b"].start("127.0.0.1")
        await managers["c"].sync_groups()  # c notices only now
        for name in ("b", "c"):
            await wait_until_async(lambda: "/:q" in managers[name].replicas
                                   and managers[name].replicas["/:q"].log.durable_index >= index,
                                   f"{name}'s replica has the new incarnation's entry")
            log = managers[name].replicas["/:q"].log
            assert [bytes(payload) for _, _, payload in log.entries() if payload] == [b"new-1"], name
        for one in managers.values():
            await one.close()
    asyncio.run(scenario())


def test_a_leader_whose_disk_alarm_goes_on_hands_its_queue_to_a_member_with_room(tmp_path):
    """a leads; its disk alarm goes on (c's too): a hands the leadership to b, the only member
    whose node has room, and the queue stays writable there. a's alarm off again, nothing moves
    back by itself."""
    async def scenario():
        service = MemoryService()
        alarms = {"a": False, "b": False, "c": False}
        managers = {n: ReplicaManager(node=n, coordinator=MemoryCoordinator(service), data_dir=tmp_path / n,
                                      committer=GroupCommitter("always"), secret=b"s3cret", poll_interval=0.05,
                                      replica_poll_interval=0.02, disk_alarm=lambda n=n: alarms[n],
                                      disk_check_interval=0.05)
                    for n in alarms}
        for manager in managers.values():
            await manager.start("127.0.0.1")
        roles: list[Role] = []
        replica = managers["a"].host("/:q", ["a", "b", "c"], lambda index: None, roles.append)
        await wait_until_async(lambda: roles and roles[-1] is Role.LEADER, "a leads")
        index = replica.publish(b"before the alarm")
        await wait_until_async(lambda: replica.commit_index >= index, "committed")
        await wait_until_async(lambda: set(replica.record.in_sync) == {"a", "b", "c"} if replica.record else False,
                               "b and c in sync")
        alarms["c"] = True
        alarms["a"] = True

        def leader() -> str | None:
            leading = [n for n, m in managers.items() if m.replicas["/:q"].role is Role.LEADER]
            return leading[0] if len(leading) == 1 else None

        await wait_until_async(lambda: leader() == "b", "b (the member with room) leads")
        assert roles[-1] is Role.FOLLOWER  # a stepped down
        new = managers["b"].replicas["/:q"]
        index = new.publish(b"after the alarm")
        await wait_until_async(lambda: new.commit_index >= index, "the queue is writable on b")
        alarms["a"] = alarms["c"] = False
        await wait_until_async(lambda: "replica-low-disk/a" not in service.keys
                               and "replica-low-disk/c" not in service.keys, "the alarms cleared in the service")
        assert leader() == "b"
        for manager in managers.values():
            await manager.close()
    asyncio.run(scenario())


def test_a_leader_with_the_disk_alarm_stays_when_no_member_has_room(tmp_path):
    async def scenario():
        service = MemoryService()
        managers = {n: ReplicaManager(node=n, coordinator=MemoryCoordinator(service), data_dir=tmp_path / n,
                                      committer=GroupCommitter("always"), secret=b"s3cret", poll_interval=0.05,
                                      replica_poll_interval=0.02, disk_alarm=lambda: True,
                                      disk_check_interval=0.05)
                    for n in ("a", "b")}
        for manager in managers.values():
            await manager.start("127.0.0.1")
        roles: list[Role] = []
        replica = managers["a"].host("/:q", ["a", "b"], lambda index: None, roles.append)
        await wait_until_async(lambda: roles and roles[-1] is Role.LEADER, "a leads")
        await wait_until_async(lambda: "replica-low-disk/b" in service.keys and "replica-low-disk/a" in service.keys,
                               "both alarms recorded")
        index = replica.publish(b"x")
        await wait_until_async(lambda: replica.commit_index >= index, "committed")
        await wait_until_async(lambda: replica._low_disk == {"a", "b"}, "a's leader knows both alarms")
        # Nothing to wait for when nothing should happen: a few of its steps (every 20 ms) pass.
        for _ in range(5):
            replica.wake()
            await asyncio.sleep(0.05)
        assert replica.role is Role.LEADER and replica.record is not None and not replica.record.transfer_to
        for manager in managers.values():
            await manager.close()
    asyncio.run(scenario())
