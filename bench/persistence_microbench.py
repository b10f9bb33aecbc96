"""Queue segment files on this machine's disk: confirmed-append throughput and recovery.

Run: python bench/persistence_microbench.py            (from the repo root; about a minute)
     python bench/persistence_microbench.py --only throughput --seconds 2
     python bench/persistence_microbench.py --only recovery --messages 1000000
     strace -f -e trace=write,fsync,fdatasync python bench/persistence_microbench.py --strace-demo

Throughput: N requesters each append a 100-byte message to one queue store,
ask the group committer for a sync and wait for the callback before the
next, as a publisher with N confirms in flight would. Real fdatasync on the
directory given by --dir (default: a temporary directory).

Recovery: writes --messages records of 100-byte bodies (no fsync), then a
fresh child process recovers the queue and reports the wall time, the RSS it
added (the index plus the Recovery arrays), and the peak RSS during recovery.

--strace-demo: three messages, each confirm printed with os.write(1, ...), so
strace shows every segment write, then the fdatasync, then the confirm.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from persistence.group_commit import GroupCommitter  # noqa: E402
from persistence.queue_store import QueueStore  # noqa: E402

PROPS = b"\x98\x00\x18application/octet-stream\x00\x00\x00\x00\x02"  # content-type, headers {}, delivery-mode 2
BODY = b"x" * 100


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


async def confirmed_appends(data_dir: Path, in_flight: int, seconds: float, mode: str) -> dict:
    store = QueueStore.for_queue(data_dir, "/", f"bench-{mode}-{in_flight}")
    store.recover()
    committer = GroupCommitter(mode)
    loop = asyncio.get_running_loop()
    seq = store.next_seq
    confirmed = 0
    deadline = time.monotonic() + seconds

    async def requester() -> None:
        nonlocal seq, confirmed
        while time.monotonic() < deadline:
            store.append_message(seq, 0, "amq.direct", "bench", PROPS, BODY)
            seq += 1
            done = loop.create_future()
            committer.request_sync(store, lambda error, done=done: done.set_result(error))
            error = await done
            if error is not None:
                raise error
            confirmed += 1

    start = time.monotonic()
    await asyncio.gather(*(requester() for _ in range(in_flight)))
    elapsed = time.monotonic() - start
    rounds = committer.rounds
    committer.close()
    store.delete()
    return {
        "mode": mode,
        "in_flight": in_flight,
        "msgs_per_s": confirmed / elapsed,
        "fsync_rounds_per_s": rounds / elapsed,
        "msgs_per_round": confirmed / max(rounds, 1),
    }


def run_throughput(data_dir: Path, seconds: float) -> None:
    print(f"confirmed appends, 100-byte bodies, one queue, {seconds:.0f} s each, data dir {data_dir}")
    print(f"{'mode':<12} {'in flight':>9} {'msg/s':>10} {'fsync rounds/s':>15} {'msg/round':>10}")
    cases = [("always", n) for n in (1, 16, 256)] + [("batch-ms:5", 16), ("never", 16)]
    for mode, in_flight in cases:
        r = asyncio.run(confirmed_appends(data_dir, in_flight, seconds, mode))
        print(
            f"{r['mode']:<12} {r['in_flight']:>9} {r['msgs_per_s']:>10,.0f} "
            f"{r['fsync_rounds_per_s']:>15,.0f} {r['msgs_per_round']:>10.1f}"
        )


def write_backlog(data_dir: Path, messages: int, acked_every: int) -> float:
    store = QueueStore.for_queue(data_dir, "/", "backlog", write_buffer_size=4 * 1024 * 1024)
    store.recover()
    start = time.monotonic()
    for seq in range(1, messages + 1):
        store.append_message(seq, 1_700_000_000_000 + seq, "amq.direct", "backlog", PROPS, BODY)
        if acked_every and seq % acked_every == 0:
            store.append_state(seq, "acked", 1_700_000_000_000 + seq)
    store.close()
    return time.monotonic() - start


def recover_child(data_dir: str) -> None:
    """Runs in a fresh process: recover the backlog queue and print measurements as JSON."""
    rss_before = status_kib("VmRSS")
    start = time.monotonic()
    store = QueueStore.for_queue(Path(data_dir), "/", "backlog")
    recovery = store.recover()
    elapsed = time.monotonic() - start
    index_bytes = sum(
        s.seqs.itemsize * len(s.seqs) + s.offsets.itemsize * len(s.offsets) + len(s.states) for s in store._segments
    )
    recovery_bytes = len(recovery.seqs) * 8 + len(recovery.delivery_counts) * 4 + len(recovery.flags)
    print(
        json.dumps(
            {
                "seconds": elapsed,
                "ready": len(recovery),
                "segments": len(store._segments),
                "rss_added_mib": (status_kib("VmRSS") - rss_before) / 1024,
                "peak_rss_mib": status_kib("VmHWM") / 1024,
                "index_array_mib": index_bytes / 2**20,
                "recovery_array_mib": recovery_bytes / 2**20,
            }
        )
    )


def run_recovery(data_dir: Path, messages: int, acked_every: int) -> None:
    queue_dir = data_dir / "recovery"
    write_seconds = write_backlog(queue_dir, messages, acked_every)
    disk = sum(p.stat().st_size for p in queue_dir.rglob("*.seg"))
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--recover-child", str(queue_dir)],
        check=True,
        capture_output=True,
        text=True,
    )
    r = json.loads(out.stdout)
    acked = f", 1 in {acked_every} acked" if acked_every else ""
    print(
        f"recovery of {messages:,} messages of 100 B{acked} ({disk / 2**20:.0f} MiB in {r['segments']} segments; "
        f"written and fsynced in {write_seconds:.1f} s):\n"
        f"  {r['seconds']:.2f} s, {r['ready']:,} ready; RSS added {r['rss_added_mib']:.1f} MiB "
        f"(index arrays {r['index_array_mib']:.1f} MiB + recovery arrays {r['recovery_array_mib']:.1f} MiB), "
        f"peak RSS {r['peak_rss_mib']:.0f} MiB"
    )
    QueueStore.for_queue(queue_dir, "/", "backlog").delete()


async def strace_demo(data_dir: Path) -> None:
    store = QueueStore.for_queue(data_dir, "/", "strace-demo")
    store.recover()
    committer = GroupCommitter("always")
    os.write(1, b"--- demo: appending 3 messages, then one sync request each\n")
    done = asyncio.get_running_loop().create_future()
    confirmed: list[int] = []

    def confirm(seq: int, error: OSError | None) -> None:
        os.write(1, f"--- confirm message {seq} (error={error})\n".encode())
        confirmed.append(seq)
        if len(confirmed) == 3:
            done.set_result(None)

    for seq in (1, 2, 3):
        store.append_message(seq, 0, "amq.direct", "demo", PROPS, BODY)
        committer.request_sync(store, lambda error, seq=seq: confirm(seq, error))
    await done
    committer.close()
    store.delete()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, help="data directory (default: a new temporary directory)")
    parser.add_argument("--only", choices=["throughput", "recovery"])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--recover-child", help=argparse.SUPPRESS)
    parser.add_argument("--strace-demo", action="store_true")
    args = parser.parse_args()
    if args.recover_child:
        recover_child(args.recover_child)
        return
    with tempfile.TemporaryDirectory(prefix="persistence-bench-", dir=args.dir) as tmp:
        data_dir = Path(tmp)
        if args.strace_demo:
            asyncio.run(strace_demo(data_dir))
            return
        if args.only in (None, "throughput"):
            run_throughput(data_dir, args.seconds)
        if args.only in (None, "recovery"):
            run_recovery(data_dir, args.messages, acked_every=0)
            run_recovery(data_dir, args.messages, acked_every=2)


if __name__ == "__main__":
    main()
