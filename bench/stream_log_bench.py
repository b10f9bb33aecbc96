"""The stream log (persistence/stream_log.py) on this machine's disk: append, read and open.

Run: python bench/stream_log_bench.py                      (from the repo root; a few minutes)
     python bench/stream_log_bench.py --only append --seconds 2
     python bench/stream_log_bench.py --only open --open-gib 1

append  records/s for 100-byte and 1 KiB bodies:
        never      appends in a loop, GroupCommitter("never") committing them (no fsync);
        always/1   one publisher waiting for each confirm (fdatasync latency bound);
        always/256 256 publishers with one confirm in flight each (what group commit gives).
read    one cursor reading the whole stream from `first` (records/s, MiB/s), warm page cache;
        also ten cursors reading it side by side.
open    a stream of --open-gib GiB of 1 KiB records, opened in a fresh process: after a clean
        close (side files), after a crash (the tail scanned past its last checkpoint), and
        with the side files deleted (every segment scanned).

The `uptime` load is printed before and after: the machine is shared, so read the figures
with it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from persistence.group_commit import GroupCommitter  # noqa: E402
from persistence.stream_log import StreamLog  # noqa: E402

PROPS = b"\xb0\x00\x18application/octet-stream\x00\x00\x00\x00\x02"  # content-type, headers {}, delivery-mode 2


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


# ---- append ---------------------------------------------------------------------------------


async def append_never(root: Path, body: bytes, seconds: float) -> float:
    committer = GroupCommitter("never")
    log = StreamLog.open(root, "/", "bench", committer=committer)
    n = 0
    start = time.monotonic()
    deadline = start + seconds
    while time.monotonic() < deadline:
        for _ in range(1000):
            log.append("amq.direct", "bench", PROPS, body)
        n += 1000
        await asyncio.sleep(0)  # let the committer's rounds run, as the event loop would
    await committer.idle()
    elapsed = time.monotonic() - start
    committer.close()
    log.close()
    return n / elapsed


async def append_confirmed(root: Path, body: bytes, seconds: float, in_flight: int) -> tuple[float, float]:
    committer = GroupCommitter("always")
    log = StreamLog.open(root, "/", "bench", committer=committer)
    loop = asyncio.get_running_loop()
    confirmed = 0
    deadline = time.monotonic() + seconds

    async def publisher() -> None:
        nonlocal confirmed
        while time.monotonic() < deadline:
            log.append("amq.direct", "bench", PROPS, body)
            done = loop.create_future()
            committer.request_sync(log, done.set_result)
            error = await done
            if error is not None:
                raise error
            confirmed += 1

    start = time.monotonic()
    await asyncio.gather(*(publisher() for _ in range(in_flight)))
    elapsed = time.monotonic() - start
    rounds = committer.rounds
    committer.close()
    log.close()
    return confirmed / elapsed, confirmed / max(rounds, 1)


def run_append(data_dir: Path, seconds: float) -> None:
    print(f"append, one stream, {seconds:.0f} s each, data dir {data_dir}")
    print(f"{'body':>6} {'fsync':<11} {'records/s':>11} {'MiB/s':>7} {'records/round':>14}")
    for size in (100, 1024):
        body = b"x" * size
        for case in ("never", "always/1", "always/256"):
            root = data_dir / f"append-{size}-{case.replace('/', '-')}"
            if case == "never":
                rate, per_round = asyncio.run(append_never(root, body, seconds)), float("nan")
            else:
                rate, per_round = asyncio.run(append_confirmed(root, body, seconds, int(case.split("/")[1])))
            print(f"{size:>6} {case:<11} {rate:>11,.0f} {rate * size / 2**20:>7.1f} {per_round:>14.1f}")
            shutil.rmtree(root, ignore_errors=True)


# ---- read -------------------------------------------------------------------------------------


def write_stream(root: Path, records: int, body: bytes, max_segment_bytes: int = 500_000_000) -> StreamLog:
    log = StreamLog.open(root, "/", "bench", max_segment_bytes=max_segment_bytes, write_buffer_size=4 << 20)
    for k in range(records):
        log.append("amq.direct", "bench", PROPS, body)
        if k % 100_000 == 99_999:
            log.sync_now()
    log.sync_now()
    return log


def run_read(data_dir: Path, records: int) -> None:
    for size in (100, 1024):
        root = data_dir / f"read-{size}"
        log = write_stream(root, records, b"x" * size, max_segment_bytes=64 << 20)
        read_bytes = log.disk_bytes()
        for cursors in (1, 10):
            readers = [log.reader(0) for _ in range(cursors)]
            start = time.monotonic()
            total = 0
            active = list(readers)
            while active:
                for cursor in list(active):
                    batch = cursor.read(256)
                    if not batch:
                        active.remove(cursor)
                    total += len(batch)
            elapsed = time.monotonic() - start
            assert total == records * cursors
            print(
                f"read from first, {size:>4}-byte bodies, {records:,} records, {cursors:>2} cursor(s): "
                f"{total / elapsed:>10,.0f} records/s in all, {read_bytes * cursors / elapsed / 2**20:>6.0f} MiB/s"
            )
            for cursor in readers:
                cursor.close()
        log.close()
        shutil.rmtree(root, ignore_errors=True)


# ---- open -------------------------------------------------------------------------------------


def open_child(root: str) -> None:
    start = time.monotonic()
    log = StreamLog.open(Path(root), "/", "bench")
    elapsed = time.monotonic() - start
    print(
        json.dumps(
            {
                "seconds": elapsed,
                "segments": len(log.segments()),
                "scanned_mib": log.recovery.scanned_bytes / 2**20,
                "next_offset": log.next_offset,
            }
        )
    )
    if os.environ.get("STREAM_BENCH_CRASH"):
        os._exit(0)  # leave without close(): no side file for the tail
    log.close()


def timed_open(root: Path, crash_after: bool = False) -> dict:
    env = dict(os.environ, STREAM_BENCH_CRASH="1" if crash_after else "")
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--open-child", str(root)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return json.loads(out.stdout)


def run_open(data_dir: Path, gib: float) -> None:
    root = data_dir / "open"
    body = b"x" * 1024
    records = int(gib * 2**30 / (len(body) + 100))
    start = time.monotonic()
    log = write_stream(root, records, body)
    written = time.monotonic() - start
    disk = log.disk_bytes()
    log.close()
    print(f"open: {disk / 2**30:.2f} GiB, {records:,} records of 1 KiB in {len(log.segments())} segments "
          f"(written in {written:.1f} s)")
    clean = timed_open(root)
    print(f"  after a clean close (side files):         {clean['seconds']:6.3f} s, scanned {clean['scanned_mib']:7.1f} MiB")
    # A crash: append another 40 MiB, then lose the process without close().
    log = StreamLog.open(root, "/", "bench", write_buffer_size=4 << 20)
    for _ in range(40 * 1024):
        log.append("amq.direct", "bench", PROPS, body)
    log.sync_now()
    os.close(log._tail_fd)  # crash: no side file written on the way out
    crashed = timed_open(root, crash_after=True)
    print(f"  after a crash (tail past its checkpoint): {crashed['seconds']:6.3f} s, scanned {crashed['scanned_mib']:7.1f} MiB")
    for side in root.glob("*.sidx"):
        side.unlink()
    scanned = timed_open(root)
    print(f"  with no side files (a full scan):         {scanned['seconds']:6.3f} s, scanned {scanned['scanned_mib']:7.1f} MiB")
    shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=("append", "read", "open"))
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--read-records", type=int, default=500_000)
    parser.add_argument("--open-gib", type=float, default=1.0)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temporary directory)")
    parser.add_argument("--open-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.open_child:
        open_child(args.open_child)
        return
    print(f"before: {uptime()}")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        data_dir = Path(tmp)
        if args.only in (None, "append"):
            run_append(data_dir, args.seconds)
        if args.only in (None, "read"):
            run_read(data_dir, args.read_records)
        if args.only in (None, "open"):
            run_open(data_dir, args.open_gib)
    print(f"after:  {uptime()}")


if __name__ == "__main__":
    main()
