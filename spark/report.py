"""``python -m spark.report DATA_DIR``: what went through each durable queue, as text and a chart.

Prints, per queue: messages by state, body bytes, the age of the oldest ready
message, the top routing keys, and redelivery and dead-letter counts. Writes a
PNG (``--png``, default ``amqp-queue-rates.png``) with message rates over time
per queue: published per second, and settled (acked, dead-lettered, expired,
purged) per second. Runs on a local Spark by default, or ``--master spark://...``.

The scan selects only the columns it needs (no AMQP property decoding) and is
cached for the several aggregations.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_COLUMNS = ("vhost", "queue", "routing_key", "published_at", "body_size", "state", "state_at", "redelivered")
_SETTLED = ("acked", "dead_lettered", "expired", "purged")
_BUCKETS_S = (1, 5, 10, 30, 60, 300, 600, 1800, 3600, 6 * 3600, 86400, 7 * 86400)
TOP_KEYS = 5


@dataclass
class QueueSummary:
    messages: int = 0
    bytes: int = 0
    by_state: Counter = field(default_factory=Counter)
    oldest_ready_age_s: float | None = None
    top_routing_keys: list[tuple[str, int]] = field(default_factory=list)
    redelivered: int = 0
    dead_lettered: int = 0
    published_per_bucket: dict[datetime.datetime, int] = field(default_factory=dict)
    settled_per_bucket: dict[datetime.datetime, int] = field(default_factory=dict)


@dataclass
class Summary:
    data_dir: str
    bucket_s: int
    generated_at: datetime.datetime
    queues: dict[tuple[str, str], QueueSummary]


def summarize(session: Any, data_dir: str, vhost: str | None = None, queue: str | None = None) -> Summary:
    """Aggregate the queue files of ``data_dir`` with ``session`` (amqp-queue must be registered)."""
    from pyspark.sql import functions as F

    from spark import columns

    reader = session.read.format("amqp-queue").schema(columns(*_COLUMNS))
    for key, value in (("vhost", vhost), ("queue", queue)):
        if value is not None:
            reader = reader.option(key, value)
    df = reader.load(data_dir).cache()
    try:
        now = datetime.datetime.now(datetime.timezone.utc)
        queues: dict[tuple[str, str], QueueSummary] = {}
        per_state = df.groupBy("vhost", "queue", "state").agg(
            F.count(F.lit(1)).alias("n"), F.sum("body_size").alias("bytes"),
            F.sum(F.col("redelivered").cast("long")).alias("redelivered"),
            F.min("published_at").alias("oldest"), F.min(F.unix_micros("published_at")).alias("first_us"),
            F.max(F.unix_micros("published_at")).alias("last_us"), F.min(F.unix_micros("state_at")).alias("s_first"),
            F.max(F.unix_micros("state_at")).alias("s_last"))
        first_us = last_us = None
        for row in per_state.collect():
            q = queues.setdefault((row["vhost"], row["queue"]), QueueSummary())
            q.messages += row["n"]
            q.bytes += row["bytes"] or 0
            q.by_state[row["state"]] += row["n"]
            q.redelivered += row["redelivered"] or 0
            if row["state"] == "dead_lettered":
                q.dead_lettered += row["n"]
            if row["state"] == "ready":
                q.oldest_ready_age_s = max(0.0, (now.timestamp() * 1e6 - row["first_us"]) / 1e6)
            for value in (row["first_us"], row["s_first"]):
                first_us = value if first_us is None else min(first_us, value)
            for value in (row["last_us"], row["s_last"]):
                last_us = value if last_us is None else max(last_us, value)
        bucket_s = _bucket_size(first_us, last_us)
        bucket_us = bucket_s * 1_000_000
        keys = df.groupBy("vhost", "queue", "routing_key").count().collect()
        for row in sorted(keys, key=lambda r: (-r["count"], r["routing_key"])):
            q = queues[(row["vhost"], row["queue"])]
            if len(q.top_routing_keys) < TOP_KEYS:
                q.top_routing_keys.append((row["routing_key"], row["count"]))
        published = df.groupBy("vhost", "queue", F.floor(F.unix_micros("published_at") / bucket_us).alias("b")).count()
        settled = (df.where(F.col("state").isin(*_SETTLED))
                   .groupBy("vhost", "queue", F.floor(F.unix_micros("state_at") / bucket_us).alias("b")).count())
        for rows, attribute in ((published.collect(), "published_per_bucket"), (settled.collect(), "settled_per_bucket")):
            for row in rows:
                at = datetime.datetime.fromtimestamp(row["b"] * bucket_s, datetime.timezone.utc)
                getattr(queues[(row["vhost"], row["queue"])], attribute)[at] = row["count"]
    finally:
        df.unpersist()
    return Summary(data_dir, bucket_s, now, dict(sorted(queues.items())))


def _bucket_size(first_us: int | None, last_us: int | None) -> int:
    """A round bucket width giving at most about 120 points over the time span."""
    span_s = 0 if first_us is None or last_us is None else (last_us - first_us) / 1e6
    for size in _BUCKETS_S:
        if span_s / size <= 120:
            return size
    return _BUCKETS_S[-1]


def format_summary(summary: Summary) -> str:
    lines = [f"amqp-queue report for {summary.data_dir} ({len(summary.queues)} queues, "
             f"generated {summary.generated_at:%Y-%m-%d %H:%M:%S} UTC)"]
    for (vhost, queue), q in summary.queues.items():
        lines.append("")
        lines.append(f"vhost {vhost!r} queue {queue!r}: {q.messages} messages, {_bytes(q.bytes)}")
        lines.append("  by state:      " + ", ".join(f"{state} {n}" for state, n in q.by_state.most_common()))
        age = "none ready" if q.oldest_ready_age_s is None else _age(q.oldest_ready_age_s)
        lines.append(f"  oldest ready:  {age}")
        lines.append(f"  redelivered:   {q.redelivered}    dead-lettered: {q.dead_lettered}")
        keys = ", ".join(f"{key or '(empty)'} {n}" for key, n in q.top_routing_keys)
        lines.append(f"  routing keys:  {keys}")
    return "\n".join(lines)


def plot_rates(summary: Summary, png: str | Path) -> Path:
    """Write the message-rate chart (published/s and settled/s per queue) to ``png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    for (vhost, queue), q in summary.queues.items():
        label = queue if vhost == "/" else f"{vhost}/{queue}"
        for axis, series in ((top, q.published_per_bucket), (bottom, q.settled_per_bucket)):
            if series:
                times = sorted(series)
                axis.plot(times, [series[t] / summary.bucket_s for t in times], marker=".", label=label)
    top.set_title(f"Published messages per second ({summary.bucket_s} s buckets)")
    bottom.set_title("Settled messages per second (acked, dead-lettered, expired, purged)")
    for axis in (top, bottom):
        axis.set_ylabel("msg/s")
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize="small", loc="upper left")
    bottom.set_xlabel("time (UTC)")
    figure.autofmt_xdate()
    figure.tight_layout()
    path = Path(png)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _age(seconds: float) -> str:
    return str(datetime.timedelta(seconds=int(seconds)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark.report", description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", help="the broker's data directory (or a copy of it)")
    parser.add_argument("--vhost", help="only this vhost")
    parser.add_argument("--queue", help="only this queue (a name or a glob)")
    parser.add_argument("--png", default="amqp-queue-rates.png", help="where to write the rate chart")
    parser.add_argument("--master", default="local[2]", help="Spark master URL (default local[2])")
    args = parser.parse_args(argv)
    if not Path(args.data_dir).is_dir():
        print(f"no such directory: {args.data_dir}", file=sys.stderr)
        return 2
    from spark.session import local_session

    session = local_session(master=args.master, app_name="amqp-queue report")
    summary = summarize(session, str(Path(args.data_dir).resolve()), args.vhost, args.queue)
    print(format_summary(summary))
    print(f"\nrate chart: {plot_rates(summary, args.png)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
