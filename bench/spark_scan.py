"""How fast Spark reads queue files: ``python -m bench.spark_scan [--messages 1000000]``.

Writes a synthetic queue (spark.synthetic_queue: the broker's own QueueStore, 64 MiB segments,
60% acked / 5% unacked / 5% dead-lettered / 30% ready, states of old segments written in later
ones) unless ``--data-dir`` already holds one, then measures on ``local[2]``:

* plain Python, no Spark: the reader's own rate for all columns and for a few;
* Spark, without side files: full scan (``write.format("noop")``, every column materialised),
  ``count()``, ``groupBy("routing_key").count()``, the same two with a pruned schema;
* writing the Parquet side files (``spark.side_files``);
* Spark, with side files: the same queries through the data source, and Spark's native
  ``spark.read.parquet`` on the side files (no state columns).

Each Spark figure is the best of ``--repeat`` runs after one warm-up query. Prints a Markdown
table (docs/benchmarks.md has the recorded one).
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

from spark.local_scan import read_table
from spark.schema import COLUMN_NAMES
from spark.side_files import MESSAGES_SUFFIX, SIDE_DIR, convert_data_dir
from spark.synthetic_queue import write_synthetic_queue

MARKER = "bench-messages.txt"


def prepare(data_dir: Path, messages: int) -> float:
    marker = data_dir / MARKER
    if marker.exists() and marker.read_text().strip() == str(messages):
        return 0.0
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    started = time.perf_counter()
    write_synthetic_queue(data_dir, "bench", messages)
    marker.write_text(str(messages))
    return time.perf_counter() - started


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def spark_queries(session, data_dir: str, repeat: int) -> dict[str, float]:
    from spark import columns

    full = session.read.format("amqp-queue").load(data_dir)
    pruned = session.read.format("amqp-queue").schema(columns("routing_key", "state")).load(data_dir)
    pruned.count()  # warm-up: Python workers, planner, JIT
    return {
        "full scan": best(lambda: full.write.format("noop").mode("overwrite").save(), repeat),
        "count()": best(lambda: full.count(), repeat),
        "groupBy(routing_key).count()": best(lambda: full.groupBy("routing_key").count().collect(), repeat),
        "count(), pruned schema": best(lambda: pruned.count(), repeat),
        "groupBy(routing_key), pruned schema": best(lambda: pruned.groupBy("routing_key").count().collect(), repeat),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.spark_scan", description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--data-dir", default="/tmp/amqp-queue-bench")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(argv)
    data_dir = Path(args.data_dir)
    shutil.rmtree(data_dir / SIDE_DIR, ignore_errors=True)
    generated = prepare(data_dir, args.messages)
    n = args.messages
    size = sum(p.stat().st_size for p in data_dir.rglob("*.seg"))
    print(f"{n} messages, {size / 2**20:.0f} MiB of segments in {len(list(data_dir.rglob('*.seg')))} files"
          + (f" (written in {generated:.1f} s)" if generated else ""))
    print(f"load average: {os.getloadavg()[0]:.1f}")

    rows: list[tuple[str, float]] = []
    started = time.perf_counter()
    assert read_table(data_dir, COLUMN_NAMES, side_files=False).num_rows == n
    rows.append(("plain Python, all columns, no Spark", time.perf_counter() - started))
    started = time.perf_counter()
    read_table(data_dir, ("queue", "routing_key", "state", "body_size"), side_files=False)
    rows.append(("plain Python, 4 columns (no properties), no Spark", time.perf_counter() - started))

    from spark.session import local_session

    session = local_session(conf={"spark.driver.memory": "2g"})
    for name, seconds in spark_queries(session, str(data_dir), args.repeat).items():
        rows.append((f"Spark, segments only: {name}", seconds))

    started = time.perf_counter()
    written, _ = convert_data_dir(data_dir)
    rows.append((f"write Parquet side files ({written} sealed segments)", time.perf_counter() - started))
    side_bytes = sum(p.stat().st_size for p in (data_dir / SIDE_DIR).rglob("*.parquet")) if written else 0
    for name, seconds in spark_queries(session, str(data_dir), args.repeat).items():
        rows.append((f"Spark, with side files: {name}", seconds))
    native_rows = 0
    if written:
        native = session.read.parquet(str(data_dir / SIDE_DIR / "*" / "*" / f"*{MESSAGES_SUFFIX}"))
        native_rows = native.count()
    if native_rows:
        rows.append((f"Spark native Parquet ({native_rows} sealed rows, no state): full scan",
                     best(lambda: native.write.format("noop").mode("overwrite").save(), args.repeat)))
        rows.append(("Spark native Parquet: count()", best(lambda: native.count(), args.repeat)))
        rows.append(("Spark native Parquet: groupBy(routing_key).count()",
                     best(lambda: native.groupBy("routing_key").count().collect(), args.repeat)))
    session.stop()

    print(f"side files: {side_bytes / 2**20:.0f} MiB\n")
    print("| what | seconds | rows/s |")
    print("|---|---:|---:|")
    for name, seconds in rows:
        count = native_rows if name.startswith("Spark native") else n
        rate = "" if name.startswith("write") else f"{count / seconds:,.0f}"
        print(f"| {name} | {seconds:.2f} | {rate} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
