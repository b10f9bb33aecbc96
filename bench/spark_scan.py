"""How fast Spark reads queue files: ``python -m bench.spark_scan [--messages 1000000]``.

Writes a synthetic queue (spark.synthetic_queue: the broker's own QueueStore, 64 MiB segments,
60% acked / 5% unacked / 5% dead-lettered / 30% ready, states of old segments written in later
ones) unless ``--data-dir`` already holds one, then measures on ``local[2]``:

* plain Python, no Spark: the reader's own rate for all columns and for a few;
* Spark, without side files: full scan (``write.format("noop")``, every column materialised;
  once as the first query on these files, after a warm-up on other files, when Spark's Python
  workers have not yet cached where the records of each segment are; then warm),
  ``count()``, ``groupBy("routing_key").count()``, the same two with a pruned schema;
* writing the Parquet side files (``spark.side_files``);
* Spark, with side files: the same queries through the data source, and Spark's native
  ``spark.read.parquet`` on the side files (no state columns).

Each Spark figure is the best of ``--repeat`` runs after one warm-up query. Beside the wall time it
gives the CPU time the whole Spark application used for the query (the driver, the JVM and the
Python workers, read from /proc): on a machine shared with other work the wall time depends on how
much of the CPU the query got, the CPU time much less. Ratios to Spark's own Parquet reader, measured
in the same run, close the table. Prints a Markdown table (docs/benchmarks.md has the recorded one).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench.procfs import cpu_seconds
from spark.local_scan import read_table
from spark.partition_reader import clear_cache
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


class Timing:
    """The best wall time and the least CPU time (this process and all its descendants) of some runs."""

    def __init__(self, wall: float, cpu: float | None) -> None:
        self.wall, self.cpu = wall, cpu


def best(fn, repeat: int) -> Timing:
    walls, cpus = [], []
    for _ in range(repeat):
        cpu_before = _cpu()
        started = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - started)
        cpu_after = _cpu()
        if cpu_before is not None and cpu_after is not None:
            cpus.append(cpu_after - cpu_before)
    return Timing(min(walls), min(cpus) if cpus else None)


def _cpu() -> float | None:
    try:
        return cpu_seconds(os.getpid())
    except OSError:  # no /proc: wall times only
        return None


def spark_queries(session, data_dir: str, repeat: int) -> dict[str, Timing]:
    from spark import columns

    full = session.read.format("amqp-queue").load(data_dir)
    pruned = session.read.format("amqp-queue").schema(columns("routing_key", "state")).load(data_dir)
    first = best(lambda: full.write.format("noop").mode("overwrite").save(), 1)  # before any warm-up
    pruned.count()  # warm-up: Python workers, planner, JIT
    return {
        "full scan, the session's first query on these files": first,
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

    rows: list[tuple[str, Timing]] = []
    clear_cache()  # plain Python rows: cold reads, the segments walked each time
    started, cpu = time.perf_counter(), time.process_time()
    assert read_table(data_dir, COLUMN_NAMES, side_files=False).num_rows == n
    rows.append(("plain Python, all columns, no Spark", Timing(time.perf_counter() - started, time.process_time() - cpu)))
    clear_cache()
    started, cpu = time.perf_counter(), time.process_time()
    read_table(data_dir, ("queue", "routing_key", "state", "body_size"), side_files=False)
    rows.append(("plain Python, 4 columns (no properties), no Spark",
                 Timing(time.perf_counter() - started, time.process_time() - cpu)))

    from spark.session import local_session

    session = local_session(conf={"spark.driver.memory": "2g"})
    with tempfile.TemporaryDirectory() as warm_up:  # JVM, JIT and Python workers warm; these files not read yet
        write_synthetic_queue(warm_up, "warm-up", 20_000)
        for _ in range(2):
            session.read.format("amqp-queue").load(warm_up).write.format("noop").mode("overwrite").save()
    for name, timing in spark_queries(session, str(data_dir), args.repeat).items():
        rows.append((f"Spark, segments only: {name}", timing))

    started, cpu = time.perf_counter(), time.process_time()
    written, _ = convert_data_dir(data_dir)
    rows.append((f"write Parquet side files ({written} sealed segments)",
                 Timing(time.perf_counter() - started, time.process_time() - cpu)))
    side_bytes = sum(p.stat().st_size for p in (data_dir / SIDE_DIR).rglob("*.parquet")) if written else 0
    for name, timing in spark_queries(session, str(data_dir), args.repeat).items():
        rows.append((f"Spark, with side files: {name}", timing))
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

    print(f"side files: {side_bytes / 2**20:.0f} MiB")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}\n")
    print("| what | seconds | rows/s | CPU seconds | rows per CPU second |")
    print("|---|---:|---:|---:|---:|")
    rates: dict[str, tuple[float, float | None]] = {}
    for name, timing in rows:
        count = native_rows if name.startswith("Spark native") else n
        cpu_text = "" if timing.cpu is None else f"{timing.cpu:.2f}"
        if name.startswith("write"):
            print(f"| {name} | {timing.wall:.2f} | | {cpu_text} | |")
            continue
        rate = count / timing.wall
        cpu_rate = count / timing.cpu if timing.cpu else None
        rates[name] = (rate, cpu_rate)
        print(f"| {name} | {timing.wall:.2f} | {rate:,.0f} | {cpu_text} | {'' if cpu_rate is None else f'{cpu_rate:,.0f}'} |")
    native_name = next((name for name in rates if name.startswith("Spark native") and name.endswith("full scan")), None)
    if native_name is not None:
        native_rate, native_cpu_rate = rates[native_name]
        print("\nfull scans against Spark's own Parquet reader (same run; rows/s and rows per CPU second):")
        for name in ("Spark, segments only: full scan", "Spark, with side files: full scan"):
            rate, cpu_rate = rates[name]
            by_cpu = f", {cpu_rate / native_cpu_rate:.2f} by CPU" if cpu_rate and native_cpu_rate else ""
            print(f"  {name}: {rate / native_rate:.2f} by wall time{by_cpu}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
