"""Spark Structured Streaming over the broker (issue 24): ``python -m bench.spark_streaming COMMAND``.

* ``ingest [--messages 1000000]``: the streaming source against the batch reader on the same
  files, a synthetic stream written by the broker's own StreamLog (bench/spark_stream_scan.py's,
  100-byte bodies): a batch full scan (``write.format("noop")``) and a streaming query from
  ``earliest`` with ``trigger(availableNow=True)`` into ``writeStream.format("noop")``, in one
  batch and in batches of ``--max-records``; rows/s of each and the ratio (target: streaming at
  least 80 % of the batch reader).
* ``latency [--seconds 30] [--rate 2000]``: a broker on free ports, a publisher at ``--rate``
  messages/s into a stream, each message stamped with its send time (header ``sent_ns``), and a
  query with a 1 s trigger whose ``foreachBatch`` sink takes the batch's rows; per row, the time
  from its publish to the end of the batch that brought it into the sink: p50, p99, max.
* ``sink [--messages 200000]``: ``df.write.format("amqp-queue")`` publishing ``--messages`` rows
  of 100-byte bodies with confirms into a durable queue, with and without
  ``x-message-deduplication``, and the streaming sink (a stream read with availableNow and
  published back); rows/s (target: 50,000).

Every figure is the best of ``--repeat`` runs after a warm-up, and each command prints the load
average before and after (``os.getloadavg``): take figures for the record only on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.spark_scan import Timing, best


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


def table(rows: list[tuple[str, int, Timing]]) -> None:
    print("| what | rows | seconds | rows/s | CPU seconds |")
    print("|---|---:|---:|---:|---:|")
    for name, count, timing in rows:
        cpu = "" if timing.cpu is None else f"{timing.cpu:.2f}"
        print(f"| {name} | {count:,} | {timing.wall:.2f} | {count / timing.wall:,.0f} | {cpu} |")


# ---- ingest ----------------------------------------------------------------------------------------


def ingest(args: argparse.Namespace) -> int:
    from bench.spark_stream_scan import prepare
    from spark.session import local_session
    from spark.synthetic_queue import write_synthetic_stream

    data_dir = Path(args.data_dir)
    prepare(data_dir, args.messages, 100)
    n = args.messages
    print(f"{n} records in {len(list(data_dir.rglob('*.seg')))} stream segments; {load()}")
    session = local_session(conf={"spark.driver.memory": "2g"})
    with tempfile.TemporaryDirectory() as warm_up:
        write_synthetic_stream(warm_up, "warm-up", 20_000)
        session.read.format("amqp-queue").load(warm_up).write.format("noop").mode("overwrite").save()
        streaming_run(session, warm_up, None, Path(warm_up) / "checkpoint")
    checkpoints = Path(tempfile.mkdtemp(prefix="amqp-streaming-bench-"))
    runs = iter(range(1_000_000))
    try:
        rows = [("batch reader: full scan", n, best(lambda: session.read.format("amqp-queue").load(str(data_dir))
                                                    .write.format("noop").mode("overwrite").save(), args.repeat))]
        for limit in (None, args.max_records):
            batches: list[float] = []
            what = "one batch" if limit is None else f"batches of maxRecordsPerTrigger={limit:,}"
            timing = best(lambda: batches.append(streaming_run(session, str(data_dir), limit,
                                                               checkpoints / str(next(runs)), n)), args.repeat)
            rows.append((f"streaming: availableNow from earliest, {what}, query start to end", n, timing))
            rows.append(("streaming: the same, its batches only (Spark's triggerExecution)", n,
                         Timing(min(batches), None)))
    finally:
        shutil.rmtree(checkpoints, ignore_errors=True)
        session.stop()
    print(f"{load()}\n")
    table(rows)
    batch_rate = n / rows[0][2].wall
    print()
    for name, count, timing in rows[1:]:
        print(f"{name}: {count / timing.wall / batch_rate:.0%} of the batch reader's rows/s")
    return 0


def streaming_run(session, data_dir: str, max_records: int | None, checkpoint: Path,
                  expected: int | None = None) -> float:
    """Run one availableNow query into the noop sink; the seconds its batches with rows took
    (Spark's triggerExecution: without starting and stopping the query)."""
    reader = session.readStream.format("amqp-queue").option("startingOffsets", "earliest")
    if max_records:
        reader = reader.option("maxRecordsPerTrigger", max_records)
    query = (reader.load(data_dir).writeStream.format("noop").option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    read = sum(p["numInputRows"] for p in query.recentProgress)
    if expected is not None and read != expected:
        raise AssertionError(f"the streaming query read {read} rows, not {expected}")
    return sum(p["durationMs"]["triggerExecution"] for p in query.recentProgress if p["numInputRows"]) / 1000


# ---- latency -----------------------------------------------------------------------------------------


def latency(args: argparse.Namespace) -> int:
    import pika

    from interop_tests.broker_process import launch
    from spark.session import local_session

    workdir = Path(tempfile.mkdtemp(prefix="amqp-latency-bench-"))
    broker = launch(workdir / "broker")
    stop = threading.Event()
    try:
        connection = pika.BlockingConnection(pika.URLParameters(broker.url() + "?heartbeat=0"))
        channel = connection.channel()
        channel.queue_declare("latency", durable=True, arguments={"x-queue-type": "stream"})
        channel.confirm_delivery()
        print(f"publishing {args.rate} messages/s for {args.seconds} s into a stream; {load()}")

        def publish() -> None:
            interval = 1.0 / args.rate
            due = time.perf_counter()
            while not stop.is_set():
                channel.basic_publish("", "latency", b"x" * 100, pika.BasicProperties(
                    delivery_mode=2, headers={"sent_ns": str(time.time_ns())}))
                due += interval
                pause = due - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)

        session = local_session()
        latencies: list[int] = []
        batches = [0]

        def sink(df, batch_id: int) -> None:
            sent = [int(r[0]) for r in df.selectExpr("headers['sent_ns']").collect()]
            now = time.time_ns()
            if batches[0] >= args.warm_up_batches:
                latencies.extend(now - s for s in sent)
            batches[0] += 1

        query = (session.readStream.format("amqp-queue").option("queue", "latency").load(str(broker.data_dir))
                 .select("headers").writeStream.foreachBatch(sink).trigger(processingTime="1 second")
                 .option("checkpointLocation", str(workdir / "checkpoint")).start())
        publisher = threading.Thread(target=publish, daemon=True)
        publisher.start()
        # Measure once the warm-up batches are done (the first is slow: Python workers start, and a
        # query stopped during it may fail): the session is then as a long-running query's is.
        while batches[0] <= args.warm_up_batches:
            if query.exception() is not None:
                raise RuntimeError(f"the query failed: {query.exception()}")
            time.sleep(0.2)
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline:
            time.sleep(0.5)
        stop.set()
        publisher.join()
        query.stop()
        session.stop()
        connection.close()
    finally:
        stop.set()
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(load())
    if not latencies:
        print("no rows after the warm-up batches", file=sys.stderr)
        return 1
    latencies.sort()
    ms = [x / 1e6 for x in latencies]
    pick = lambda q: ms[min(len(ms) - 1, int(q * len(ms)))]  # noqa: E731
    print(f"\n{len(ms):,} rows after {args.warm_up_batches} warm-up batches, trigger 1 s")
    print("| publish -> row in the sink | ms |\n|---|---:|")
    for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        print(f"| {name} | {pick(q):,.0f} |")
    print(f"| max | {ms[-1]:,.0f} |")
    return 0


# ---- sink -------------------------------------------------------------------------------------------


def sink(args: argparse.Namespace) -> int:
    import pika

    from interop_tests.broker_process import launch
    from spark.session import local_session
    from spark.synthetic_queue import write_synthetic_stream

    workdir = Path(tempfile.mkdtemp(prefix="amqp-sink-bench-"))
    broker = launch(workdir / "broker")
    n = args.messages
    try:
        connection = pika.BlockingConnection(pika.URLParameters(broker.url() + "?heartbeat=0"))
        channel = connection.channel()
        channel.queue_declare("plain", durable=True)
        channel.queue_declare("deduplicated", durable=True, arguments={
            "x-message-deduplication": True, "x-cache-size": max(2 * n, 10_000)})
        session = local_session()
        print(f"{n} rows of 100-byte bodies, {session.sparkContext.defaultParallelism} partitions; {load()}")
        frame = session.range(n).selectExpr("cast(rpad(cast(id AS string), 100, '.') AS binary) AS body").cache()
        frame.count()

        def write(queue: str) -> None:
            channel.queue_purge(queue)
            frame.selectExpr("body", f"'{queue}' AS routing_key").write.format("amqp-queue").mode("append") \
                .option("url", broker.url()).save()
            count = channel.queue_declare(queue, passive=True).method.message_count
            if count != n:
                raise AssertionError(f"{queue} holds {count} messages, not {n}")

        write("plain")  # warm-up: Python workers, JIT
        rows = [("batch write, confirms, durable queue", n, best(lambda: write("plain"), args.repeat)),
                ("batch write, confirms, queue with x-message-deduplication", n,
                 best(lambda: write("deduplicated"), args.repeat))]
        write_synthetic_stream(workdir / "source", "events", n, body_bytes=100)
        runs = iter(range(1000))

        def stream_back() -> None:
            channel.queue_purge("plain")
            query = (session.readStream.format("amqp-queue").option("startingOffsets", "earliest")
                     .load(str(workdir / "source")).selectExpr("body", "'plain' AS routing_key")
                     .writeStream.format("amqp-queue").option("url", broker.url())
                     .option("checkpointLocation", str(workdir / f"checkpoint-{next(runs)}"))
                     .trigger(availableNow=True).start())
            query.awaitTermination()

        rows.append(("streaming: a stream read with availableNow, published back with confirms", n,
                     best(stream_back, args.repeat)))
        session.stop()
        connection.close()
    finally:
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"{load()}\n")
    table(rows)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.spark_streaming", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("ingest", help="streaming source vs batch reader rows/s on a 1M-record stream")
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--max-records", type=int, default=100_000)
    p.add_argument("--data-dir", default="/tmp/amqp-stream-bench")
    p.add_argument("--repeat", type=int, default=2)
    p = commands.add_parser("latency", help="publish -> row in the sink with a 1 s trigger: p50, p99")
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--rate", type=int, default=2000)
    p.add_argument("--warm-up-batches", type=int, default=5)
    p = commands.add_parser("sink", help="rows/s the sink publishes with confirms")
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(argv)
    return {"ingest": ingest, "latency": latency, "sink": sink}[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
