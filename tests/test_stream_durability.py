"""A stream's records are confirmed and readable only once fsynced; consumer offsets are durable
and coalesced (persistence/stream_log.py, stream_offsets.py, with the real GroupCommitter).

The durability checks are run twice more against deliberately broken builds (a stream that
forgets to hand its files to the fsync round, and one that lets readers see written but
unsynced records), to show that the checks catch what they are meant to."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path

import pytest

from persistence import stream_offsets
from persistence.group_commit import GroupCommitter, SyncJob
from persistence.stream_log import StreamLog
from persistence.stream_offsets import StreamOffsets

PROPS = b"\x10\x00\x02"


class FakeFsync:
    """Records, per file, the size it had when fsynced (what is durable), and each fsync's file."""

    def __init__(self, delay: float = 0.003, fail: bool = False) -> None:
        self.delay = delay
        self.fail = fail
        self.synced_sizes: dict[tuple[int, int], int] = {}
        self.events: list[str] = []  # the path of each fsync, in order
        self.lock = threading.Lock()

    def __call__(self, fd: int) -> None:
        stat = os.fstat(fd)
        target = os.readlink(f"/proc/self/fd/{fd}")
        time.sleep(self.delay)
        with self.lock:
            if self.fail:
                raise OSError(5, "Input/output error")
            key = (stat.st_dev, stat.st_ino)
            self.synced_sizes[key] = max(self.synced_sizes.get(key, 0), stat.st_size)
            self.events.append(target)

    def durable_size(self, path: Path) -> int:
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            return 0
        return self.synced_sizes.get((stat.st_dev, stat.st_ino), 0)


def check_durability(root: Path, publishers: int = 8, each: int = 30) -> list[str]:
    """Publishers append and wait for their confirm, as with confirms in flight, while a consumer
    at the tail reads everything it can. Returns every confirm and every read that came before
    the record was fsynced."""
    fake = FakeFsync()
    violations: list[str] = []
    ends: dict[int, tuple[Path, int]] = {}  # offset -> (its segment, the position where it ends)

    def durable(offset: int) -> bool:
        path, end = ends[offset]
        return fake.durable_size(path) >= end

    async def main() -> None:
        committer = GroupCommitter("always", sync_file=fake)
        log = StreamLog.open(root / "s", "/", "s", max_segment_bytes=8 * 1024, committer=committer)
        loop = asyncio.get_running_loop()
        done = False

        def on_committed(next_offset: int) -> None:
            for offset in range(next_offset):
                if offset in ends and not durable(offset):
                    violations.append(f"offset {offset} committed before it was fsynced")

        log.on_committed = on_committed

        async def publisher(k: int) -> None:
            for n in range(each):
                offset = log.append("ex", f"p{k}", PROPS, b"x" * (50 + n))
                tail = log._tail
                ends[offset] = (tail.path, tail.size + len(log._buffer))
                confirmed = loop.create_future()

                def on_durable(error, offset=offset, confirmed=confirmed):
                    assert error is None
                    if not durable(offset):
                        violations.append(f"confirm of offset {offset} before it was fsynced")
                    confirmed.set_result(None)

                committer.request_sync(log, on_durable)
                await confirmed

        async def consumer() -> None:
            cursor = log.reader(0)
            seen = 0
            while not done or seen < publishers * each:
                for record in cursor.read(1000):
                    seen += 1
                    if not durable(record.offset):
                        violations.append(f"offset {record.offset} read before it was fsynced")
                await asyncio.sleep(0)

        reading = asyncio.ensure_future(consumer())
        await asyncio.gather(*(publisher(k) for k in range(publishers)))
        done = True
        await asyncio.wait_for(reading, 10)
        await committer.idle()
        assert len(log.segments()) > 3, "the records spread over several segments"
        log.close()
        committer.close()

    asyncio.run(main())
    return violations


def test_confirms_and_reads_wait_for_the_fsync(tmp_path):
    assert check_durability(tmp_path) == []


def test_the_check_catches_a_stream_that_confirms_before_the_fsync(tmp_path, monkeypatch):
    real = StreamLog.prepare_sync

    def forgets_its_files(self) -> SyncJob:
        job = real(self)
        job.discard()  # closes the fds it should have handed to the round
        job.paths, job.directories = [], []
        return job

    monkeypatch.setattr(StreamLog, "prepare_sync", forgets_its_files)
    violations = check_durability(tmp_path)
    assert any(v.startswith("confirm of offset") for v in violations)


def test_the_check_catches_a_stream_that_shows_unsynced_records_to_readers(tmp_path, monkeypatch):
    monkeypatch.setattr(StreamLog, "readable_end", lambda self, seg: seg.size)  # written, not fsynced
    violations = check_durability(tmp_path)
    assert any("read before it was fsynced" in v for v in violations)


def test_with_fsync_never_records_are_committed_once_written(tmp_path):
    fake = FakeFsync()

    async def main() -> list[int]:
        committer = GroupCommitter("never", sync_file=fake)
        committed: list[int] = []
        log = StreamLog.open(tmp_path / "s", "/", "s", committer=committer, on_committed=committed.append)
        for _ in range(10):
            log.append("ex", "rk", PROPS, b"x")
        await committer.idle()
        assert [r.offset for r in log.reader(0).read()] == list(range(10))
        committer.close()
        return committed

    assert asyncio.run(main()) == [10]
    assert fake.events == []


def test_a_failed_fsync_stops_the_stream(tmp_path):
    fake = FakeFsync(fail=True)
    errors: list[OSError | None] = []

    async def main() -> StreamLog:
        committer = GroupCommitter("always", sync_file=fake)
        log = StreamLog.open(tmp_path / "s", "/", "s", committer=committer)
        log.append("ex", "rk", PROPS, b"x")
        committer.request_sync(log, errors.append)
        await committer.idle()
        committer.close()
        return log

    log = asyncio.run(main())
    assert errors and isinstance(errors[0], OSError)
    assert log.next_offset == 0, "nothing became readable"
    with pytest.raises(OSError):
        log.append("ex", "rk", PROPS, b"y")


# ---- consumer offsets --------------------------------------------------------------------------


def test_consumer_offsets_survive_a_restart(tmp_path):
    fake = FakeFsync()

    async def main() -> None:
        committer = GroupCommitter("always", sync_file=fake)
        log = StreamLog.open(tmp_path / "s", "/", "s", committer=committer)
        for _ in range(100):
            log.append("ex", "rk", PROPS, b"x")
        log.offsets.store("billing", 41)
        log.offsets.store("audit", 7)
        durable = asyncio.get_running_loop().create_future()
        log.offsets.when_durable(durable.set_result)
        assert await durable is None
        await committer.idle()
        committer.close()
        # A crash: no close, nothing written on the way out.
        os.close(log._tail_fd)

    asyncio.run(main())
    again = StreamLog.open(tmp_path / "s", "/", "s")
    assert again.offsets.items() == {"billing": 41, "audit": 7}
    again.offsets.store("billing", 99)
    again.offsets.remove("audit")
    again.close()  # without a committer: written with atomic_file on close
    third = StreamLog.open(tmp_path / "s", "/", "s")
    assert third.offsets.items() == {"billing": 99}


def test_consumer_offsets_are_durable_only_after_the_rename_is_fsynced(tmp_path, monkeypatch):
    fake = FakeFsync()
    renamed_at: list[int] = []
    real_replace = os.replace

    def replace(src, dst):
        real_replace(src, dst)
        if str(dst).endswith("consumer-offsets.json"):
            renamed_at.append(len(fake.events))

    monkeypatch.setattr(stream_offsets.os, "replace", replace)

    async def main() -> None:
        committer = GroupCommitter("always", sync_file=fake)
        (tmp_path / "s").mkdir()
        offsets = StreamOffsets(tmp_path / "s", committer)
        offsets.store("c", 5)
        durable = asyncio.get_running_loop().create_future()

        def on_durable(error):
            # The temporary file was fsynced, then renamed, then the directory fsynced.
            assert renamed_at, "renamed"
            before, after = fake.events[: renamed_at[0]], fake.events[renamed_at[0] :]
            assert any(".consumer-offsets.json." in e for e in before)
            assert str(tmp_path / "s") in after
            assert json.loads((tmp_path / "s" / "consumer-offsets.json").read_bytes())["offsets"] == {"c": 5}
            durable.set_result(error)

        offsets.when_durable(on_durable)
        assert await durable is None
        await committer.idle()
        committer.close()

    asyncio.run(main())


def test_many_acks_cost_one_write_per_round(tmp_path, monkeypatch):
    fake = FakeFsync(delay=0.005)
    writes = 0
    real_write = stream_offsets._write_all

    def counting(fd, data):
        nonlocal writes
        writes += 1
        real_write(fd, data)

    monkeypatch.setattr(stream_offsets, "_write_all", counting)

    async def main() -> int:
        committer = GroupCommitter("always", sync_file=fake)
        (tmp_path / "s").mkdir()
        offsets = StreamOffsets(tmp_path / "s", committer)
        for n in range(2000):
            offsets.store(f"consumer-{n % 10}", n)
            if n % 100 == 0:
                await asyncio.sleep(0.001)
        await committer.idle()
        committer.close()
        return committer.rounds

    rounds = asyncio.run(main())
    assert writes <= rounds and writes < 60, (writes, rounds)
    stored = json.loads((tmp_path / "s" / "consumer-offsets.json").read_bytes())["offsets"]
    assert stored == {f"consumer-{k}": 1990 + k for k in range(10)}, "the latest value of each"


def test_a_leftover_temporary_offsets_file_is_not_read(tmp_path):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "consumer-offsets.json").write_text('{"format_version":1,"offsets":{"a":1}}')
    (tmp_path / "s" / ".consumer-offsets.json.9.tmp").write_text('{"format_version":1,"offsets":{"a":2')
    offsets = StreamOffsets(tmp_path / "s")
    assert offsets.items() == {"a": 1}
    assert not (tmp_path / "s" / ".consumer-offsets.json.9.tmp").exists()
