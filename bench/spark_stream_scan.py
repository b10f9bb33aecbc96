"""How fast Spark reads a stream's files: ``python -m bench.spark_stream_scan [--messages 1000000]``.

Writes a synthetic stream (spark.synthetic_queue.write_synthetic_stream: the broker's own
StreamLog, default 500 MB segments and 64 KiB side index entries; the messages of the queue
benchmark, bench/spark_scan.py, with bodies of ``--body-bytes``) unless ``--data-dir`` already
holds one, then measures on ``local[2]``, after a warm-up on other files:

* plain Python, no Spark (one core): the reader's own rate for all columns and for a few;
* Spark: full scan (``write.format("noop")``, every column materialised; once as the session's
  first query on these files, when its Python workers have not yet walked their records), ``count()``,
  ``count()`` with a pruned schema, and two pushed-down queries, ``seq >= 90%`` and a
  ``published_at`` range of 1% of the stream, with the bytes they read.

Each Spark figure is the best of ``--repeat`` runs; beside the wall time the CPU time of the whole
Spark application (from /proc). Prints a Markdown table (docs/benchmarks.md has the recorded one).
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench.spark_scan import Timing, best
from spark.local_scan import read_table
from spark.schema import COLUMN_NAMES
from spark.stream_reader import clear_cache
from spark.synthetic_queue import write_synthetic_stream

MARKER = "bench-stream-messages.txt"
START_MS = 1_700_000_000_000


def prepare(data_dir: Path, messages: int, body_bytes: int) -> float:
    marker = data_dir / MARKER
    wanted = f"{messages} {body_bytes}"
    if marker.exists() and marker.read_text().strip() == wanted:
        return 0.0
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    started = time.perf_counter()
    write_synthetic_stream(data_dir, "bench", messages, body_bytes=body_bytes, start_ms=START_MS)
    marker.write_text(wanted)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.spark_stream_scan", description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--body-bytes", type=int, default=100)
    parser.add_argument("--data-dir", default="/tmp/amqp-stream-bench")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(argv)
    data_dir = Path(args.data_dir)
    generated = prepare(data_dir, args.messages, args.body_bytes)
    n = args.messages
    files = list(data_dir.rglob("*.seg"))
    size = sum(p.stat().st_size for p in files)
    print(f"{n} messages of {args.body_bytes}-byte bodies, {size / 2**20:.0f} MiB of segments in {len(files)} files"
          + (f" (written in {generated:.1f} s)" if generated else ""))
    print(f"load average: {os.getloadavg()[0]:.1f}")

    rows: list[tuple[str, Timing, int]] = []
    clear_cache()
    started, cpu = time.perf_counter(), time.process_time()
    assert read_table(data_dir, COLUMN_NAMES).num_rows == n
    rows.append(("plain Python, all columns, no Spark", Timing(time.perf_counter() - started, time.process_time() - cpu), n))
    clear_cache()
    started, cpu = time.perf_counter(), time.process_time()
    read_table(data_dir, ("queue", "routing_key", "seq", "body_size"))
    rows.append(("plain Python, 4 columns (no properties), no Spark",
                 Timing(time.perf_counter() - started, time.process_time() - cpu), n))

    from spark import columns
    from spark.session import local_session

    session = local_session(conf={"spark.driver.memory": "2g"})
    with tempfile.TemporaryDirectory() as warm_up:  # JVM, JIT and Python workers warm; these files not read yet
        write_synthetic_stream(warm_up, "warm-up", 20_000)
        for _ in range(2):
            session.read.format("amqp-queue").load(warm_up).write.format("noop").mode("overwrite").save()
    # A new DataFrame for every query: Spark 4.3 keeps the partitions a filtered query planned on
    # the DataFrame's data source and reuses them for a later query without filters (docs/spark.md).
    def full():
        return session.read.format("amqp-queue").load(str(data_dir))

    def pruned():
        return session.read.format("amqp-queue").schema(columns("routing_key", "seq")).load(str(data_dir))

    partitions = full().rdd.getNumPartitions()
    tail_from = n - n // 10
    t0 = datetime.datetime.fromtimestamp((START_MS + n // 2) / 1000, datetime.timezone.utc)
    t1 = datetime.datetime.fromtimestamp((START_MS + n // 2 + n // 100) / 1000, datetime.timezone.utc)
    window = f"published_at >= timestamp'{t0:%Y-%m-%d %H:%M:%S.%f}' AND published_at < timestamp'{t1:%Y-%m-%d %H:%M:%S.%f}'"
    first = best(lambda: full().write.format("noop").mode("overwrite").save(), 1)  # before any other query
    queries = [
        ("Spark: full scan", lambda: full().write.format("noop").mode("overwrite").save(), n),
        ("Spark: `count()`", lambda: full().count(), n),
        ("Spark: `count()`, schema of 2 columns", lambda: pruned().count(), n),
        (f"Spark: `seq >= {tail_from}` (pushed down), full rows", lambda: full().where(f"seq >= {tail_from}").write.format(
            "noop").mode("overwrite").save(), n - tail_from),
        ("Spark: a `published_at` range of 1% (pushed down), full rows",
         lambda: full().where(window).write.format("noop").mode("overwrite").save(), n // 100),
    ]
    assert full().count() == n
    assert full().where(f"seq >= {tail_from}").count() == n - tail_from
    assert full().where(window).count() == n // 100
    rows.append(("Spark: full scan, the session's first query on these files", first, n))
    for name, fn, count in queries:
        rows.append((name, best(fn, args.repeat), count))
    session.stop()

    print(f"partitions of a full scan: {partitions}")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}\n")
    print("| what | rows | seconds | rows/s | CPU seconds |")
    print("|---|---:|---:|---:|---:|")
    for name, timing, count in rows:
        cpu_text = "" if timing.cpu is None else f"{timing.cpu:.2f}"
        print(f"| {name} | {count:,} | {timing.wall:.2f} | {count / timing.wall:,.0f} | {cpu_text} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
