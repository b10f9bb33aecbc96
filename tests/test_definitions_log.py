"""The file definition store (format 3): one log record per change, compaction into the
snapshot, torn tails cut, crashes during compaction lose nothing, format 1 still read."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from persistence.definitions import FileDefinitionStore
from persistence.definitions_codec import DefinitionsError
from persistence.definitions_log import LOG_HEADER, encode_record
from persistence.group_commit import GroupCommitter


def queue(name: str, vhost: str = "/") -> dict:
    return {"name": name, "vhost": vhost, "durable": True, "auto_delete": False, "arguments": {"x-n": b"\x00"}}


def put_record(entry: dict) -> bytes:
    """A log line putting a queue, as the store writes it (arguments already in the file's encoding)."""
    encoded = {**entry, "arguments": {}}
    return encode_record(json.dumps({"op": "put", "kind": "queues", "entry": encoded}))


def binding(source: str, queue_name: str, key: str = "k") -> dict:
    return {"source": source, "vhost": "/", "destination": queue_name, "destination_type": "queue",
            "routing_key": key, "arguments": {}}


def exchange(name: str) -> dict:
    return {"name": name, "vhost": "/", "type": "direct", "durable": True, "auto_delete": False,
            "internal": False, "arguments": {}}


def logs(directory: Path) -> list[Path]:
    return sorted(directory.glob("definitions-*.log"))


def reopened(directory: Path) -> dict:
    return FileDefinitionStore(directory).load()


def test_a_change_appends_one_record_and_does_not_rewrite_the_others(tmp_path):
    store = FileDefinitionStore(tmp_path, compact_after=10**9)
    for i in range(2000):
        store.put("queues", queue(f"q{i}"))
    snapshot_size = (tmp_path / "definitions.json").stat().st_size
    log_size = logs(tmp_path)[-1].stat().st_size
    store.put("queues", queue("one-more"))
    store.remove("queues", queue("q7"))
    assert (tmp_path / "definitions.json").stat().st_size == snapshot_size
    grown = logs(tmp_path)[-1].stat().st_size - log_size
    assert grown < 400, f"two changes wrote {grown} bytes"
    store.close()
    names = {q["name"] for q in reopened(tmp_path)["queues"]}
    assert len(names) == 2000 and "one-more" in names and "q7" not in names


def bytes_written_for(directory: Path, count: int) -> int:
    """Bytes of log records and snapshots written for ``count`` declares and then ``count`` deletes."""
    store = FileDefinitionStore(directory)
    store.load()
    written = 0
    compactions = store.compactions
    for op in ("put", "remove"):
        for i in range(count):
            getattr(store, op)("queues", queue(f"queue-{i}"))
            if store.compactions != compactions:
                compactions = store.compactions
                written += (directory / "definitions.json").stat().st_size
    written += sum(path.stat().st_size for path in logs(directory))
    store.close()
    return written


@pytest.mark.slow  # 3.5 s: 22,000 definition changes, each written to the log
def test_10000_declares_then_deletes_write_linear_bytes(tmp_path):
    small = bytes_written_for(tmp_path / "small", 1000)
    large = bytes_written_for(tmp_path / "large", 10000)
    # Ten times the changes: about ten times the bytes. Rewriting every definition on each
    # change (format 1) made it a hundred times.
    assert large < 20 * small, (small, large)


def test_compaction_folds_the_log_into_the_snapshot_and_removes_old_logs(tmp_path):
    store = FileDefinitionStore(tmp_path, compact_after=50)
    for i in range(120):
        store.put("queues", queue(f"q{i}"))
    assert store.compactions >= 1
    assert len(logs(tmp_path)) == 1, "logs the snapshot covers are deleted"
    document = json.loads((tmp_path / "definitions.json").read_text())
    assert document["amqp_server_format"] == 4
    assert len(document["queues"]) >= 50
    store.close()
    assert len(reopened(tmp_path)["queues"]) == 120


def test_removing_a_queue_or_exchange_removes_its_bindings_after_replay(tmp_path):
    store = FileDefinitionStore(tmp_path, compact_after=10**9)
    store.put("exchanges", exchange("ex"))
    store.put("exchanges", exchange("ex2"))
    for name in ("a", "b"):
        store.put("queues", queue(name))
        store.put("bindings", binding("ex", name))
        store.put("bindings", binding("ex2", name))
    store.remove("queues", queue("a"))
    store.remove("exchanges", exchange("ex2"))
    store.close()
    loaded = reopened(tmp_path)
    assert [(b["source"], b["destination"]) for b in loaded["bindings"]] == [("ex", "b")]


def test_removing_a_vhost_removes_everything_in_it(tmp_path):
    store = FileDefinitionStore(tmp_path)
    store.save({"vhosts": [{"name": "/"}, {"name": "gone"}],
                "queues": [queue("kept"), queue("lost", vhost="gone")],
                "permissions": [{"user": "u", "vhost": "gone", "configure": ".*", "write": ".*", "read": ".*"}]})
    store.save({"vhosts": [{"name": "/"}]}, ("users", "vhosts", "permissions"))
    store.close()
    loaded = reopened(tmp_path)
    assert [q["name"] for q in loaded["queues"]] == ["kept"]
    assert loaded["permissions"] == []


def test_a_torn_last_record_is_cut_and_everything_before_it_is_kept(tmp_path, caplog):
    store = FileDefinitionStore(tmp_path, compact_after=10**9)
    for i in range(5):
        store.put("queues", queue(f"q{i}"))
    store.close()
    log_path = logs(tmp_path)[-1]
    whole = put_record(queue("torn"))
    with log_path.open("ab") as file:
        file.write(whole[: len(whole) // 2])  # a crash in the middle of a write
    assert sorted(q["name"] for q in reopened(tmp_path)["queues"]) == [f"q{i}" for i in range(5)]
    assert "torn" in caplog.text
    assert not log_path.exists(), "reopening folded the log into a new snapshot: the torn bytes are gone"


def test_a_damaged_record_in_the_middle_costs_only_that_record(tmp_path, caplog):
    store = FileDefinitionStore(tmp_path, compact_after=10**9)
    for i in range(3):
        store.put("queues", queue(f"q{i}"))
    store.close()
    log_path = logs(tmp_path)[-1]
    lines = log_path.read_bytes().split(b"\n")
    lines[2] = lines[2].replace(b"q1", b"qX")  # the second record, CRC no longer matches
    log_path.write_bytes(b"\n".join(lines))
    assert sorted(q["name"] for q in reopened(tmp_path)["queues"]) == ["q0", "q2"]
    assert "damaged record" in caplog.text


def test_a_crash_before_the_compacted_snapshot_is_renamed_loses_nothing(tmp_path):
    """The compaction's new snapshot never replaced the old one: old snapshot and all logs replay."""
    store = FileDefinitionStore(tmp_path, compact_after=10**9)
    store.put("queues", queue("before"))
    store.close()
    crashed = tmp_path / "crashed"
    shutil.copytree(tmp_path, crashed)
    # The crash left a half-written temporary snapshot and the next log already started.
    (crashed / ".definitions.json.abc.tmp").write_bytes(b'{"amqp_server_format": 2, "queu')
    generation = int(logs(crashed)[-1].stem.split("-")[1]) + 1
    (crashed / f"definitions-{generation:08d}.log").write_bytes(
        LOG_HEADER + put_record(queue("after"))
    )
    assert sorted(q["name"] for q in reopened(crashed)["queues"]) == ["after", "before"]


def test_a_crash_after_the_snapshot_rename_ignores_the_logs_it_covers(tmp_path):
    """Old logs not yet deleted are older than the snapshot: replaying them would bring back
    a queue deleted since."""
    store = FileDefinitionStore(tmp_path, compact_after=10**9)
    store.put("queues", queue("deleted-later"))
    store.close()
    stale = logs(tmp_path)[-1].read_bytes()
    stale_name = logs(tmp_path)[-1].name
    store = FileDefinitionStore(tmp_path, compact_after=10**9)
    store.remove("queues", queue("deleted-later"))
    store.close()
    FileDefinitionStore(tmp_path).load()  # snapshot now covers the removal
    (tmp_path / stale_name).write_bytes(stale)  # as if its unlink had not happened
    assert reopened(tmp_path)["queues"] == []


def test_format_1_definitions_json_is_read_and_upgraded(tmp_path):
    (tmp_path / "definitions.json").write_text(json.dumps({"amqp_server_format": 1, "queues": [{"name": "old", "vhost": "/"}]}))
    store = FileDefinitionStore(tmp_path)
    assert [q["name"] for q in store.load()["queues"]] == ["old"]
    store.close()
    # Upgraded at once, so an older broker refuses the directory instead of missing the logs.
    assert json.loads((tmp_path / "definitions.json").read_text())["amqp_server_format"] == 4


def test_a_log_from_a_newer_format_is_refused(tmp_path):
    FileDefinitionStore(tmp_path).load()
    logs(tmp_path)[-1].write_bytes(b"amqp-server definitions log 5\n")
    with pytest.raises(DefinitionsError, match="newer amqp-server"):
        FileDefinitionStore(tmp_path).load()


def test_with_a_committer_changes_are_written_in_its_rounds_and_compacted_in_a_thread(tmp_path):
    async def main() -> None:
        store = FileDefinitionStore(tmp_path, compact_after=100)
        store.load()
        committer = GroupCommitter("always")
        store.sync_with(committer)
        durable = []
        for i in range(1000):
            store.put("queues", queue(f"q{i}"))
            if i % 100 == 99:
                store.when_durable(durable.append)
                await committer.idle()
        assert durable == [None] * 10
        assert store.compactions >= 2
        committer.close()
        store.close()

    asyncio.run(main())
    assert len(reopened(tmp_path)["queues"]) == 1000


def test_a_format_2_directory_is_read_and_upgraded_to_format_4(tmp_path):
    """A broker before policies wrote format 2: its snapshot and log header say 2."""
    (tmp_path / "definitions.json").write_text(json.dumps({"amqp_server_format": 2, "amqp_server_log": 1}))
    (tmp_path / "definitions-00000001.log").write_bytes(
        b"amqp-server definitions log 2\n" + put_record(queue("from-format-2")))
    store = FileDefinitionStore(tmp_path)
    assert [q["name"] for q in store.load()["queues"]] == ["from-format-2"]
    store.put("policies", {"vhost": "/", "name": "p", "pattern": ".*", "definition": {"max-length": 1}})
    store.close()
    assert json.loads((tmp_path / "definitions.json").read_text())["amqp_server_format"] == 4
    assert logs(tmp_path)[-1].read_bytes().startswith(b"amqp-server definitions log 4\n")
    assert [p["name"] for p in reopened(tmp_path)["policies"]] == ["p"]


def test_a_format_3_directory_is_read_and_its_runtime_parameters_kept(tmp_path):
    """Format 3 had no runtime parameters: its log (header 3) is read, and one set now is kept."""
    (tmp_path / "definitions.json").write_text(json.dumps({"amqp_server_format": 3, "amqp_server_log": 1}))
    (tmp_path / "definitions-00000001.log").write_bytes(
        b"amqp-server definitions log 3\n" + put_record(queue("from-format-3")))
    store = FileDefinitionStore(tmp_path)
    assert [q["name"] for q in store.load()["queues"]] == ["from-format-3"]
    store.put("runtime_parameters", {"vhost": "/", "component": "shovel", "name": "s", "value": {"src-queue": "a"}})
    store.close()
    again = reopened(tmp_path)
    assert again["runtime_parameters"] == [
        {"vhost": "/", "component": "shovel", "name": "s", "value": {"src-queue": "a"}}]
