"""SIGKILL a process that appends, confirms and acks through the group committer, at random moments;
after recovery every confirmed message is there unless it was being acked, no message whose ack was
confirmed comes back, nothing is duplicated, and every body is intact.

SIGKILL keeps what was written to the OS, so this exercises batching, roll-over, segment removal and
recovery under crashes, not power loss (the fsync ordering is covered by test_persistence_group_commit)."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from persistence.queue_store import QueueStore

ROOT = Path(__file__).resolve().parent.parent

WRITER = textwrap.dedent(
    """
    import asyncio, os, random, sys
    sys.path.insert(0, sys.argv[2])
    from pathlib import Path
    from persistence.group_commit import GroupCommitter
    from persistence.queue_store import QueueStore

    def body(seq):
        return (b"%d:" % seq) * (1 + seq % 40)

    async def main():
        committer = GroupCommitter("always")
        store = QueueStore.for_queue(Path(sys.argv[1]), "/", "crash", segment_size=4096,
                                     drain_rollover_size=2048, on_dirty=committer.request_flush)
        recovery = store.recover()
        live = [m.seq for m in recovery]
        seq = store.next_seq
        rng = random.Random(seq)
        in_flight = 0
        def confirmed(kind, n):
            def callback(error):
                nonlocal in_flight
                in_flight -= 1
                if error is None:
                    os.write(1, b"%s %d\\n" % (kind, n))
            return callback
        while True:
            for _ in range(rng.randrange(1, 30)):
                store.append_message(seq, 0, "ex", "rk", b"\\x10\\x00\\x02", body(seq))
                live.append(seq)
                in_flight += 1
                committer.request_sync(store, confirmed(b"C", seq))
                seq += 1
            while len(live) > 50 or (live and rng.random() < 0.5):
                victim = live.pop(rng.randrange(len(live)) if rng.random() < 0.2 else 0)
                store.append_state(victim, "delivered", 0)
                if rng.random() < 0.1:
                    store.append_state(victim, "requeued", 0, delivery_count=1)
                    live.append(victim)
                    continue
                os.write(1, b"a %d\\n" % victim)  # about to ack: from here on it may be gone
                store.append_state(victim, "acked", 0)
                in_flight += 1
                committer.request_sync(store, confirmed(b"A", victim))
            while in_flight > 64:
                await asyncio.sleep(0)
            await asyncio.sleep(0)

    asyncio.run(main())
    """
)


def body(seq: int) -> bytes:
    return (b"%d:" % seq) * (1 + seq % 40)


def test_confirmed_messages_survive_sigkill_at_random_moments(tmp_path):
    rng = random.Random(1234)
    confirmed: set[int] = set()  # "C": the message's record was fsynced
    ack_sent: set[int] = set()  # "a": an ack was about to be written
    acked: set[int] = set()  # "A": the ack record was fsynced
    for kill_point in range(8):
        child = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path), str(ROOT)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        # The kill lands after a random number of this run's confirms, not after a random time:
        # on a loaded machine a time would sometimes fall before the writer did anything.
        kill_after = rng.randrange(60, 400)
        seen: list[bytes] = []
        assert child.stdout is not None
        while sum(line.startswith(b"C") for line in seen) < kill_after:
            line = child.stdout.readline()
            assert line, f"kill {kill_point}: the writer ended early"
            seen.append(line)
        child.send_signal(signal.SIGKILL)
        # Read on through the same buffered reader: communicate() reads the raw pipe and would
        # miss what readline() already took into the buffer.
        out = child.stdout.read()
        err = child.stderr.read() if child.stderr else b""
        child.wait()
        assert child.returncode == -signal.SIGKILL, err.decode()
        lines = (b"".join(seen) + out).decode().splitlines()
        if lines and not lines[-1].endswith(tuple("0123456789")):
            lines.pop()  # a line cut by the kill
        for line in lines:
            kind, seq = line.split()
            {"C": confirmed, "a": ack_sent, "A": acked}[kind].add(int(seq))

        store = QueueStore.for_queue(tmp_path, "/", "crash")
        recovery = store.recover()
        seqs = list(recovery.seqs)
        assert len(seqs) == len(set(seqs)), f"kill {kill_point}: duplicates"
        missing = confirmed - ack_sent - set(seqs)
        assert not missing, f"kill {kill_point}: confirmed messages lost: {sorted(missing)[:10]}"
        assert not acked & set(seqs), f"kill {kill_point}: messages with a confirmed ack came back"
        assert all(store.read_message(seq).body == body(seq) for seq in seqs), f"kill {kill_point}: corrupt body"
        store.close()
    assert len(confirmed) > 500 and len(acked) > 100, (len(confirmed), len(acked))
