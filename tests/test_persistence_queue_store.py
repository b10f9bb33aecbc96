"""A queue store rolls segments over, remembers what happened to each message across a restart,
and gives disk space back (or archives it) once messages are settled."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pamqp import commands

from persistence.queue_store import QueueStore
from persistence.segment_file import HEADER_SIZE, SegmentScan, list_segments
from persistence.segment_layout import QUEUE_META, queue_path, read_queue_meta
from persistence.store_recovery import RecoveredMessage

PROPS = b"\x10\x00\x02"
RECORD_BYTES = 63  # a message record with exchange "ex", routing key "rk", PROPS and a 20-byte body
SMALL = HEADER_SIZE + 10 * RECORD_BYTES  # ten messages a segment


def open_store(root: Path, **options) -> tuple[QueueStore, object]:
    store = QueueStore.for_queue(root, "vh", "q", **options)
    return store, store.recover()


def publish(store: QueueStore, seqs) -> None:
    for seq in seqs:
        store.append_message(seq, 1000 + seq, "ex", "rk", PROPS, f"message {seq:>12}".encode())


def restart(store: QueueStore, root: Path, **options):
    store.close()
    return open_store(root, **options)


def test_segments_roll_over_at_the_configured_size_and_are_named_by_first_sequence(tmp_path):
    store, _ = open_store(tmp_path, segment_size=SMALL)
    publish(store, range(1, 36))
    store.flush()
    segments = list_segments(store.directory)
    assert [sid for sid, _ in segments] == [1, 11, 21, 31]
    assert all(path.stat().st_size <= SMALL for _, path in segments)
    for sid, path in segments:
        scan = SegmentScan(path)
        assert scan.header.segment_id == sid
        assert sum(1 for _ in scan.records()) == (10 if sid < 31 else 5)
        scan.close()


def test_a_message_bigger_than_a_segment_gets_a_segment_of_its_own(tmp_path):
    store, _ = open_store(tmp_path, segment_size=SMALL)
    publish(store, [1])
    store.append_message(2, 1, "ex", "rk", PROPS, b"x" * (3 * SMALL))
    publish(store, [3])
    assert store.segment_ids == [1, 2, 3]
    assert store.read_message(2).body == b"x" * (3 * SMALL)


def test_sequence_numbers_must_grow(tmp_path):
    store, _ = open_store(tmp_path)
    publish(store, [5])
    with pytest.raises(ValueError):
        publish(store, [5])


def test_recovery_reflects_every_kind_of_state_record(tmp_path):
    store, _ = open_store(tmp_path)
    publish(store, range(1, 11))
    store.append_state(1, "acked", 2000)
    store.append_state(2, "dropped", 2000, reason="maxlen")
    store.append_state(3, "dead_lettered", 2000, reason="rejected")
    store.append_state(4, "expired", 2000)
    store.append_state(5, "delivered", 2000, delivery_count=0)
    store.append_state(6, "delivered", 2000, delivery_count=0)
    store.append_state(6, "requeued", 2001, delivery_count=1)
    store.append_state(7, "delivered", 2000, delivery_count=0)
    store.append_state(7, "waiting_retry", 2001, delivery_count=1, due_at_ms=9000)
    store.append_state(8, "delivered", 2000)
    store.append_state(8, "acked", 2001)
    store, recovery = restart(store, tmp_path)
    assert list(recovery) == [
        RecoveredMessage(5, 0, redelivered=True, unacked_at_crash=True, due_at_ms=None, published_at_ms=1005),
        RecoveredMessage(6, 1, redelivered=True, unacked_at_crash=False, due_at_ms=None, published_at_ms=1006),
        RecoveredMessage(7, 1, redelivered=True, unacked_at_crash=False, due_at_ms=9000, published_at_ms=1007),
        RecoveredMessage(9, 0, redelivered=False, unacked_at_crash=False, due_at_ms=None, published_at_ms=1009),
        RecoveredMessage(10, 0, redelivered=False, unacked_at_crash=False, due_at_ms=None, published_at_ms=1010),
    ]
    assert store.message_count == 5


def test_settled_is_final_and_unknown_messages_are_an_error(tmp_path):
    store, _ = open_store(tmp_path)
    publish(store, [1])
    assert store.append_state(1, "acked", 1) is True
    assert store.append_state(1, "requeued", 2, delivery_count=1) is False
    with pytest.raises(KeyError):
        store.append_state(99, "acked", 1)
    store, recovery = restart(store, tmp_path)
    assert len(recovery) == 0


def test_unacked_at_crash_comes_back_ready_and_redelivered_after_a_second_restart_too(tmp_path):
    store, _ = open_store(tmp_path)
    publish(store, [1, 2])
    store.append_state(1, "delivered", 5)
    store, first = restart(store, tmp_path)
    assert [(m.seq, m.redelivered) for m in first] == [(1, True), (2, False)]
    store, second = restart(store, tmp_path)
    assert [(m.seq, m.redelivered) for m in second] == [(1, True), (2, False)]


def test_settled_segments_are_deleted_and_a_drained_queue_leaves_almost_nothing(tmp_path):
    store, _ = open_store(tmp_path, segment_size=SMALL, drain_rollover_size=SMALL // 2)
    publish(store, range(1, 36))
    for seq in range(1, 11):
        store.append_state(seq, "acked", 1)
    assert store.segment_ids == [11, 21, 31], "the first segment went as soon as its last message was acked"
    for seq in range(11, 36):
        store.append_state(seq, "delivered", 1)
        store.append_state(seq, "acked", 1)
    store.flush()
    files = list_segments(store.directory)
    assert len(files) == 1 and files[0][1].stat().st_size == HEADER_SIZE
    assert files[0][0] == 36, "the fresh tail keeps the sequence going"
    store, recovery = restart(store, tmp_path, segment_size=SMALL)
    assert len(recovery) == 0 and recovery.next_seq == 36


def test_a_segment_holding_states_of_an_older_live_segment_is_kept_until_that_one_goes(tmp_path):
    store, _ = open_store(tmp_path, segment_size=SMALL)
    publish(store, range(1, 11))  # segment 1
    publish(store, range(11, 21))  # segment 11
    store.append_state(1, "delivered", 1, delivery_count=0)
    store.append_state(1, "requeued", 1, delivery_count=1)  # written into segment 11
    for seq in range(11, 21):
        store.append_state(seq, "acked", 1)
    publish(store, [21])  # segment 21 becomes the tail; segment 11 is all acked
    assert store.segment_ids == [1, 11, 21], "segment 11 holds the requeue of message 1"
    store, recovery = restart(store, tmp_path, segment_size=SMALL)
    assert [(m.seq, m.delivery_count) for m in recovery][:2] == [(1, 1), (2, 0)]
    for seq in range(1, 11):
        store.append_state(seq, "acked", 1)
    assert store.segment_ids == [21]


def test_archive_keeps_settled_segments_readable_under_the_same_layout(tmp_path):
    store, _ = open_store(tmp_path, segment_size=SMALL, archive=True)
    publish(store, range(1, 21))
    for seq in range(1, 11):
        store.append_state(seq, "acked", 7)
    archive = queue_path(tmp_path, "vh", "q", archive=True)
    assert archive.relative_to(tmp_path / "archive") == store.directory.relative_to(tmp_path / "queues")
    assert read_queue_meta(archive) == ("vh", "q")
    [(sid, archived)] = list_segments(archive)
    assert sid == 1 and store.segment_ids == [11]
    scan = SegmentScan(archived)
    assert sum(1 for _ in scan.records()) == 10
    scan.close()


def test_purge_settles_ready_messages_but_not_those_with_a_consumer(tmp_path):
    store, _ = open_store(tmp_path, segment_size=SMALL)
    publish(store, range(1, 26))
    store.append_state(3, "delivered", 1)
    store.append_state(22, "delivered", 1)
    assert store.purge() == 23
    assert store.segment_ids == [1, 21], "segment 11 held only purged messages"
    store, recovery = restart(store, tmp_path, segment_size=SMALL)
    assert [m.seq for m in recovery] == [3, 22]
    assert store.purge() == 2  # after the restart they are ready again
    store.flush()
    assert [path.stat().st_size for _, path in list_segments(store.directory)] == [HEADER_SIZE]


def test_delete_frees_the_files_and_archive_keeps_them(tmp_path):
    store, _ = open_store(tmp_path, segment_size=SMALL)
    publish(store, range(1, 15))
    store.delete()
    assert not store.directory.exists()

    archived, _ = open_store(tmp_path / "b", segment_size=SMALL, archive=True)
    publish(archived, range(1, 15))
    archived.delete()
    assert not archived.directory.exists()
    archive = queue_path(tmp_path / "b", "vh", "q", archive=True)
    assert [sid for sid, _ in list_segments(archive)] == [1, 11]
    assert (archive / QUEUE_META).exists()


def test_a_recreated_queue_continues_sequence_numbers_after_its_archive(tmp_path):
    store, _ = open_store(tmp_path, segment_size=SMALL, archive=True)
    publish(store, range(1, 15))
    store.delete()
    store, recovery = open_store(tmp_path, segment_size=SMALL, archive=True)
    assert len(recovery) == 0 and recovery.next_seq == 15
    publish(store, range(15, 30))
    for seq in range(15, 30):
        store.append_state(seq, "acked", 1)
    archive = queue_path(tmp_path, "vh", "q", archive=True)
    assert [sid for sid, _ in list_segments(archive)] == [1, 11, 15]
    assert store.segment_ids == [25], "the tail stays until it is worth rolling over"


def test_read_message_finds_any_message_in_buffer_tail_or_old_segments(tmp_path):
    store, _ = open_store(tmp_path, segment_size=SMALL)
    publish(store, range(1, 26))
    assert store.read_message(25).body == f"message {25:>12}".encode()  # still in the write buffer
    assert [store.read_message(seq).seq for seq in (1, 17, 3, 24)] == [1, 17, 3, 24]
    with pytest.raises(KeyError):
        store.read_message(26)


def test_writes_are_batched_into_one_os_write(tmp_path, monkeypatch):
    store, _ = open_store(tmp_path)
    publish(store, [1])  # creates the segment
    writes = []
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: writes.append(len(data)) or real_write(fd, data))
    publish(store, range(2, 102))
    store.append_state(2, "acked", 1)
    assert writes == []
    store.flush()
    assert len(writes) == 1


def test_on_dirty_fires_once_per_batch(tmp_path):
    dirty = []
    store, _ = open_store(tmp_path, on_dirty=dirty.append)
    publish(store, range(1, 50))
    assert dirty == [store]
    store.flush()
    publish(store, [50])
    assert dirty == [store, store]


def test_a_segment_is_removed_only_after_the_removal_of_what_it_refers_to_is_durable(tmp_path):
    events = []
    store, _ = open_store(tmp_path, segment_size=SMALL, sync_directory=lambda d: events.append(present()))

    def present():
        return [sid for sid, _ in list_segments(store.directory)]

    publish(store, range(1, 11))  # segment 1
    publish(store, range(11, 21))  # segment 11
    store.append_state(1, "requeued", 1, delivery_count=1)  # segment 11 now refers to segment 1
    for seq in range(11, 21):
        store.append_state(seq, "acked", 1)
    publish(store, [21])  # segment 21 is the tail
    for seq in range(1, 11):
        store.append_state(seq, "acked", 1)
    # Segment 1 went first; the directory was fsynced while segment 11 still existed; then 11 went.
    assert events == [[11, 21]]
    assert present() == [21]


def test_after_a_sync_round_no_extra_directory_fsync_is_needed(tmp_path):
    events = []
    store, _ = open_store(tmp_path, segment_size=SMALL, sync_directory=events.append)
    publish(store, range(1, 21))
    store.append_state(1, "requeued", 1, delivery_count=1)  # written into segment 11
    publish(store, [21])
    for seq in range(1, 11):
        store.append_state(seq, "acked", 1)
    assert store.segment_ids == [11, 21]
    job = store.prepare_sync()  # what a group-commit round does: the removal of segment 1 is fsynced
    assert str(store.directory) in job.directories
    job.discard()
    store.sync_done(job, None)
    for seq in range(11, 21):
        store.append_state(seq, "acked", 1)
    assert store.segment_ids == [21] and events == []


def test_a_failed_write_leaves_no_torn_record_and_is_retried(tmp_path, monkeypatch):
    store, _ = open_store(tmp_path)
    publish(store, [1])
    store.flush()
    publish(store, [2, 3])
    real_write = os.write

    def write_half_then_fail(fd, data):
        real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", write_half_then_fail)
    with pytest.raises(OSError):
        store.flush()
    monkeypatch.setattr(os, "write", real_write)
    store.flush()
    store, recovery = restart(store, tmp_path)
    assert list(recovery.seqs) == [1, 2, 3] and recovery.problems == []


def test_sealed_segments_are_announced_once_complete_and_the_tail_never(tmp_path):
    sealed: list[Path] = []
    store, _ = open_store(tmp_path, segment_size=SMALL, on_segment_sealed=sealed.append)
    publish(store, range(1, 36))
    assert [path.name for path in sealed] == [f"{sid:020d}.seg" for sid in (1, 11, 21)]
    for path in sealed:  # everything it will ever hold is already in the file
        scan = SegmentScan(path)
        assert sum(1 for _ in scan.records()) == 10
        scan.close()


def test_recovery_keeps_the_properties_of_surviving_messages_with_an_expiration(tmp_path):
    with_expiration = commands.Basic.Properties(expiration="5000", message_id="m").marshal()
    store, _ = open_store(tmp_path)
    store.append_message(1, 1000, "ex", "rk", with_expiration, b"expires, acked")
    store.append_message(2, 1000, "ex", "rk", PROPS, b"never expires")
    store.append_message(3, 1000, "ex", "rk", with_expiration, b"expires, still ready")
    store.append_state(1, "acked", 2000)
    store, recovery = restart(store, tmp_path)
    assert [message.seq for message in recovery] == [2, 3]
    assert recovery.expiring_properties == {3: with_expiration}
