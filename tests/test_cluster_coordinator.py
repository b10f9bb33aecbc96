"""The coordinator interface against real etcd and ZooKeeper: both backends, one suite."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from cluster import EventKind, HistoryLost, VersionConflict, connect, parse_cluster_address
from interop_tests.coordination_services import start_etcd, start_zookeeper

SESSION_TTL = 2.0


@pytest.fixture(scope="module", params=["etcd", "zookeeper"])
def service(request):
    directory = Path(tempfile.mkdtemp(prefix=f"coord-{request.param}-"))
    running = start_etcd(directory) if request.param == "etcd" else start_zookeeper(directory)
    yield running
    running.stop()


def _url(service) -> str:
    return service.url(f"test-{uuid.uuid4().hex[:8]}")


async def _open(url: str):
    return await connect(parse_cluster_address(url), session_ttl=SESSION_TTL)


def test_put_get_and_compare_and_set_conflicts(service):
    async def scenario():
        a, b = await _open(url := _url(service)), await _open(url)
        try:
            assert await a.get("queues/q1") is None
            created = await a.compare_and_set("queues/q1", b"first", None)
            with pytest.raises(VersionConflict) as conflict:
                await b.compare_and_set("queues/q1", b"second", None)  # both declare: one wins
            assert conflict.value.current.value == b"first"
            seen = await b.get("queues/q1")
            assert seen.value == b"first" and seen.version == created
            updated = await b.compare_and_set("queues/q1", b"changed", seen.version)
            with pytest.raises(VersionConflict):
                await a.compare_and_set("queues/q1", b"stale", seen.version)
            with pytest.raises(VersionConflict):
                await a.delete("queues/q1", expected_version=seen.version)
            assert await a.delete("queues/q1", expected_version=updated)
            assert await a.get("queues/q1") is None
            assert not await a.delete("queues/q1")
            await a.put("queues/q2", b"x")
            await a.put("queues/q2", b"y")
            items, _ = await b.list("queues")
            assert [(kv.key, kv.value) for kv in items] == [("queues/q2", b"y")]
        finally:
            await a.close()
            await b.close()

    asyncio.run(scenario())


HOLDER = """
import asyncio, sys
from cluster import connect, parse_cluster_address

async def main():
    c = await connect(parse_cluster_address(sys.argv[1]), session_ttl=float(sys.argv[2]))
    await c.put("nodes/holder", b"alive", ephemeral=True)
    print("registered", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def test_ephemeral_key_vanishes_within_the_session_ttl_after_kill_9_of_its_owner(service):
    url = _url(service)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, url, str(SESSION_TTL)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == b"registered\n"

        async def scenario():
            observer = await _open(url)
            try:
                assert (await observer.get("nodes/holder")).value == b"alive"
                holder.kill()  # SIGKILL: no goodbye, only the lease or session runs out
                holder.wait()
                killed_at = time.monotonic()
                while await observer.get("nodes/holder") is not None:
                    assert time.monotonic() - killed_at < SESSION_TTL + 3, "ephemeral key outlived its owner"
                    await asyncio.sleep(0.1)
            finally:
                await observer.close()

        asyncio.run(scenario())
    finally:
        holder.kill()
        holder.wait()


def test_closing_a_session_removes_its_ephemeral_keys_at_once(service):
    async def scenario():
        owner, observer = await _open(url := _url(service)), await _open(url)
        await owner.put("nodes/a", b"1", ephemeral=True)
        await owner.put("settings/b", b"2")
        await owner.close()
        assert await observer.get("nodes/a") is None
        assert (await observer.get("settings/b")).value == b"2"
        await observer.close()

    asyncio.run(scenario())


async def _take(iterator, count: int) -> list:
    return [await asyncio.wait_for(anext(iterator), 10) for _ in range(count)]


def test_watch_sees_changes_in_order_and_resumes_from_a_revision(service):
    async def scenario():
        writer, watcher = await _open(url := _url(service)), await _open(url)
        try:
            await writer.put("defs/old", b"before")
            listed, revision = await watcher.list("defs")
            events = watcher.watch("defs", revision, [kv.key for kv in listed])
            await writer.put("defs/a", b"1")
            first = await _take(events, 1)
            await writer.put("defs/a", b"2")
            second = await _take(events, 1)
            await writer.delete("defs/old")
            third = await _take(events, 1)
            await events.aclose()
            seen = first + second + third
            assert [(e.kind, e.key, e.value) for e in seen] == [
                (EventKind.PUT, "defs/a", b"1"), (EventKind.PUT, "defs/a", b"2"), (EventKind.DELETE, "defs/old", b"")]
            assert seen[0].revision < seen[1].revision < seen[2].revision

            # Resume: only what changed after the last revision seen.
            await writer.put("defs/a", b"3")
            resumed = watcher.watch("defs", seen[-1].revision, ["defs/a"])
            assert [(e.kind, e.key, e.value) for e in await _take(resumed, 1)] == [(EventKind.PUT, "defs/a", b"3")]
            await resumed.aclose()

            # A key removed while nobody watched: reported to a watcher that had it, by both.
            _, before = await watcher.list("defs")
            await writer.delete("defs/a")
            late = watcher.watch("defs", before, ["defs/a"])
            assert [(e.kind, e.key) for e in await _take(late, 1)] == [(EventKind.DELETE, "defs/a")]
            await late.aclose()
            # Without the keys it had, ZooKeeper (no history) says it cannot tell, never misses it.
            await writer.put("defs/b", b"x")
            await writer.delete("defs/b")
            blind = watcher.watch("defs", before)
            if service.scheme == "etcd":
                assert [(e.kind, e.key) for e in await _take(blind, 3)] == [
                    (EventKind.DELETE, "defs/a"), (EventKind.PUT, "defs/b"), (EventKind.DELETE, "defs/b")]
            else:
                with pytest.raises(HistoryLost):
                    await anext(blind)
            await blind.aclose()
        finally:
            await writer.close()
            await watcher.close()

    asyncio.run(scenario())


@pytest.mark.slow  # 18 s: a three-member etcd, its leader killed and a new one elected
def test_three_member_etcd_keeps_working_after_kill_9_of_its_leader():
    directory = Path(tempfile.mkdtemp(prefix="coord-etcd3-"))
    service = start_etcd(directory, members=3)
    try:
        async def scenario():
            client = await _open(url := _url(service))
            watcher = await _open(url)
            try:
                await client.put("nodes/n1", b"up", ephemeral=True)
                _, revision = await watcher.list("defs")
                events = watcher.watch("defs", revision)
                await client.put("defs/before", b"1")
                assert (await _take(events, 1))[0].key == "defs/before"
                leader = service.etcd_leader()
                service.kill9(leader)
                version = await client.compare_and_set("defs/after", b"2", None)
                assert (await client.get("defs/after")).version == version
                assert [(e.key, e.value) for e in await _take(events, 1)] == [("defs/after", b"2")]
                await asyncio.sleep(SESSION_TTL + 1)  # the session lease is still being renewed
                assert (await watcher.get("nodes/n1")).value == b"up"
            finally:
                await client.close()
                await watcher.close()

        asyncio.run(scenario())
    finally:
        service.stop()
