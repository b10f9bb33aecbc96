"""Group commit: a callback runs only after an fsync covering its write, and one fsync serves many
requests in flight."""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from pathlib import Path

import pytest

from persistence.group_commit import GroupCommitter, parse_sync_mode
from persistence.queue_store import QueueStore
from persistence.segment_layout import ensure_queue_directory, queue_path

PROPS = b"\x10\x00\x02"


class FakeFsync:
    """Records, for each fsync, the file's size at that moment, and takes a little while like a disk."""

    def __init__(self, delay: float = 0.002, fail: bool = False) -> None:
        self.delay = delay
        self.fail = fail
        self.synced_sizes: dict[tuple[int, int], int] = {}  # (dev, inode) -> size made durable
        self.calls = 0
        self.call_times: list[float] = []
        self.threads: set[str] = set()
        self.lock = threading.Lock()

    def __call__(self, fd: int) -> None:
        stat = os.fstat(fd)
        time.sleep(self.delay)
        with self.lock:
            self.calls += 1
            self.call_times.append(time.monotonic())
            self.threads.add(threading.current_thread().name)
            if self.fail:
                raise OSError(5, "Input/output error")
            key = (stat.st_dev, stat.st_ino)
            self.synced_sizes[key] = max(self.synced_sizes.get(key, 0), stat.st_size)

    def durable_size(self, path: Path) -> int:
        stat = os.stat(path)
        return self.synced_sizes.get((stat.st_dev, stat.st_ino), 0)


def new_store(root: Path, name: str = "q") -> QueueStore:
    # The queue directory made durable beforehand, so the fsyncs counted are the records' only
    # (a new store's own directory fsyncs join its first round: see the test for that).
    ensure_queue_directory(queue_path(root, "/", name), "/", name)
    store = QueueStore.for_queue(root, "/", name)
    store.recover()
    return store


async def publish_and_wait(committer: GroupCommitter, store: QueueStore, seq: int, fake: FakeFsync) -> None:
    store.append_message(seq, 0, "ex", "rk", PROPS, b"x" * 100)
    end = store.disk_bytes()  # this message's record ends here
    done = asyncio.get_running_loop().create_future()

    def on_durable(error):
        assert error is None
        assert fake.durable_size(store._tail.path) >= end, "callback ran before its record was fsynced"
        done.set_result(None)

    committer.request_sync(store, on_durable)
    await done


def sync_one_message(root: Path, mode: str, fake: FakeFsync) -> tuple[QueueStore, list[BaseException | None]]:
    """Append one message to a new store, request a sync in `mode` and wait until the committer is idle.

    Returns the store and what the sync callback was called with.
    """
    async def main():
        store = new_store(root)
        committer = GroupCommitter(mode, sync_file=fake)
        results = []
        store.append_message(1, 0, "ex", "rk", PROPS, b"body")
        committer.request_sync(store, results.append)
        await committer.idle()
        committer.close()
        return store, results

    return asyncio.run(main())


def test_100_concurrent_requests_share_a_few_fsyncs_and_each_waits_for_its_own(tmp_path):
    fake = FakeFsync(delay=0.005)

    async def main():
        store = new_store(tmp_path)
        committer = GroupCommitter("always", sync_file=fake)
        await asyncio.gather(*(publish_and_wait(committer, store, seq, fake) for seq in range(1, 101)))
        committer.close()
        return committer.rounds

    rounds = asyncio.run(main())
    assert fake.calls <= 3 and rounds <= 3, (fake.calls, rounds)
    assert threading.current_thread().name not in fake.threads, "fsync must not block the event loop"


def test_requests_arriving_during_a_round_are_covered_by_the_next_one(tmp_path):
    fake = FakeFsync(delay=0.01)

    seqs = itertools.count(1)

    async def publisher(committer, store):
        for _ in range(20):
            await publish_and_wait(committer, store, next(seqs), fake)

    async def main():
        store = new_store(tmp_path)
        committer = GroupCommitter("always", sync_file=fake)
        # 16 publishers with one message in flight each: 320 confirms.
        await asyncio.gather(*(publisher(committer, store) for _ in range(16)))
        committer.close()

    asyncio.run(main())
    assert fake.calls < 320 / 8, fake.calls


def test_one_round_fsyncs_each_store_once(tmp_path):
    fake = FakeFsync()

    async def main():
        stores = [new_store(tmp_path, f"q{n}") for n in range(10)]
        committer = GroupCommitter("always", sync_file=fake)
        await asyncio.gather(*(publish_and_wait(committer, store, 1, fake) for store in stores))
        committer.close()
        return committer.rounds

    assert asyncio.run(main()) == 1
    assert fake.calls == 10 + 10, "each store's tail segment, plus its directory for the new segment file"


def test_batch_mode_spaces_rounds_but_still_waits_for_the_fsync(tmp_path):
    """batch-ms:40: a round never starts sooner than 40 ms after the previous one started, and
    each publish's callback still waits for the fsync of its own round (publish_and_wait).

    The instants compared are the committer's own round starts, read where a round asks the
    store for its job (on the event loop, in `_start_round`): load only makes them later, never
    closer. (The fsyncs' times in the worker thread are not round starts: a thread that gets the
    CPU late for one round and on time for the next brings two fsyncs closer than the rounds.)"""
    fake = FakeFsync(delay=0.0)
    interval = 0.040

    async def main() -> tuple[list[float], int]:
        store = new_store(tmp_path)
        committer = GroupCommitter("batch-ms:40", sync_file=fake)
        round_starts: list[float] = []
        prepare = store.prepare_sync

        def prepare_and_note_the_round_start():
            round_starts.append(committer._last_start)  # set just before the round asks its stores
            return prepare()

        store.prepare_sync = prepare_and_note_the_round_start  # type: ignore[method-assign]
        for seq in range(1, 5):
            await publish_and_wait(committer, store, seq, fake)
        committer.close()
        return round_starts, committer.rounds

    round_starts, rounds = asyncio.run(main())
    assert rounds == len(round_starts) == 4, "each publish waited for a round of its own"
    gaps = [later - earlier for earlier, later in zip(round_starts, round_starts[1:])]
    # (asyncio may run a timer up to its clock's resolution early)
    resolution = time.get_clock_info("monotonic").resolution
    assert min(gaps) >= interval - resolution, gaps
    assert fake.calls >= 4, "every round fsynced"


def test_never_mode_confirms_once_written_without_any_fsync(tmp_path):
    fake = FakeFsync()

    store, results = sync_one_message(tmp_path, "never", fake)
    assert results == [None] and fake.calls == 0
    assert store._tail.path.stat().st_size == store.disk_bytes(), "the record was written to the OS"


def test_a_failed_fsync_is_reported_and_the_store_stops_accepting_writes(tmp_path):
    fake = FakeFsync(fail=True)

    store, results = sync_one_message(tmp_path, "always", fake)
    assert len(results) == 1 and isinstance(results[0], OSError)
    with pytest.raises(OSError):
        store.append_message(2, 0, "ex", "rk", PROPS, b"body")


def test_request_flush_writes_buffered_records_within_one_loop_iteration(tmp_path):
    async def main():
        committer = GroupCommitter("always", sync_file=FakeFsync())
        store = QueueStore.for_queue(tmp_path, "/", "q", on_dirty=committer.request_flush)
        store.recover()
        store.append_message(1, 0, "ex", "rk", PROPS, b"body")
        before = store._tail.path.stat().st_size
        await asyncio.sleep(0)
        after = store._tail.path.stat().st_size
        committer.close()
        return before, after, store.disk_bytes()

    before, after, total = asyncio.run(main())
    assert before < after == total


@pytest.mark.parametrize("mode", ["sometimes", "batch-ms:0", "batch-ms:x"])
def test_bad_modes_are_refused(mode):
    with pytest.raises(ValueError):
        parse_sync_mode(mode)


def test_a_new_queue_directory_is_made_durable_by_the_first_round_not_when_created(tmp_path):
    """Declaring a durable queue creates its directory without waiting for the disk (it runs on
    the event loop); the first round fsyncs the new names before any record is acknowledged."""
    fake = FakeFsync()

    async def main():
        store = QueueStore.for_queue(tmp_path, "/", "fresh", sync_directory=fake_directory_sync)
        store.recover()
        assert fake.calls == 0, "nothing fsynced while declaring"
        committer = GroupCommitter("always", sync_file=fake)
        await publish_and_wait(committer, store, 1, fake)
        committer.close()

    synced_directories: list[Path] = []

    def fake_directory_sync(path: Path) -> None:
        synced_directories.append(path)

    asyncio.run(main())
    directory = queue_path(tmp_path, "/", "fresh")
    for path in (directory / "queue.json", directory.parent / "vhost.json", directory, directory.parent):
        assert fake.durable_size(path) > 0, f"{path} not fsynced by the round"
    assert synced_directories == [], "nothing fsynced outside the round"
