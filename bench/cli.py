"""Command line: pick scenarios and targets, alternate targets per variant, print a table."""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import traceback

from bench import scenarios
from bench.lean_client import AMQPError
from bench.orchestrator import WorkerError
from bench.report import Measurement, Results
from bench.scenarios import ALL_ORDER, SCENARIO_NAMES, Options, Variant
from bench.targets import Target, parse_targets

EPILOG = """\
examples:
  python -m bench --url amqp://guest:guest@127.0.0.1:5672/
  python -m bench pubsub latency \\
      --target ours=amqp://guest:guest@127.0.0.1:5673/ --target rabbitmq=amqp://guest:guest@127.0.0.1:5672/
  python -m bench confirms --confirm-windows 1,64 --count 20000 --url amqp://127.0.0.1:5672/
  python -m bench pubsub --url 'amqps://guest:guest@localhost:5671/?cafile=ca.pem'   # over TLS
  python -m bench client-ceiling      # the client's own limits, against an in-process null broker
  python -m bench streams --stream-messages 200000 \\
      --target ours=amqp://guest:guest@127.0.0.1:5673/ --stream-dir ours=DATA_DIR/streams \\
      --target rabbitmq=amqp://guest:guest@127.0.0.1:5672/ --stream-dir rabbitmq=MNESIA_DIR/stream
"""


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                   help=f"any of: {', '.join(SCENARIO_NAMES)}, all (default), client-ceiling")
    p.add_argument("--scenario", action="append", default=[], help="same as a positional SCENARIO")
    p.add_argument("--target", action="append", default=[], metavar="LABEL=URL",
                   help="a broker to measure; repeat to compare (targets take turns, in the given order)")
    p.add_argument("--url", action="append", default=[], help="a broker to measure, labelled host:port")
    p.add_argument("--publish-via", action="append", default=[], metavar="LABEL=URL",
                   help="publishers of target LABEL connect to URL, another node of its cluster (forwarding)")
    p.add_argument("--nodes", action="append", default=[], metavar="LABEL=URL,URL",
                   help="target LABEL is a cluster (e.g. amqp-server --workers N) whose nodes are reached alone at "
                   "these URLs: spread and hot-queue also measure clients on the queue's owner and on another node")
    p.add_argument("--broker-pid", action="append", default=[], metavar="LABEL=PID",
                   help="broker process for CPU and RSS figures (default: the process listening on the port)")
    p.add_argument("--size", type=int, default=100, help="message body bytes (default 100)")
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds per variant (default 5)")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before the window (default 1)")
    p.add_argument("--count", type=int, help="messages per publisher instead of a duration")
    p.add_argument("--publishers", type=int, default=1, help="publisher processes (default 1)")
    p.add_argument("--consumers", type=int, default=1, help="consumers on the pub/sub queue (default 1)")
    p.add_argument("--consumer-procs", type=int, default=1,
                   help="processes the consumer connections are spread over (default 1)")
    p.add_argument("--prefetch", type=int, default=100, help="consumer prefetch for manual ack (default 100)")
    p.add_argument("--confirm-windows", type=_ints, default=(1, 16, 256), help="unconfirmed publishes in flight")
    p.add_argument("--queue-type", choices=("classic", "quorum"), default="classic",
                   help="x-queue-type of the confirms scenario's durable queue (quorum: replicated on a cluster)")
    p.add_argument("--rates", type=_ints, default=(1000, 5000), help="fixed publish rates for latency (msg/s)")
    p.add_argument("--connections", type=int, default=1000, help="idle connections to open (default 1000)")
    p.add_argument("--fanout-queues", type=int, default=10)
    p.add_argument("--topic-bindings", type=int, default=1000)
    p.add_argument("--topic-queues", type=int, default=10)
    p.add_argument("--spread-queues", type=int, default=16,
                   help="spread: queues, each with its own publisher and consumer connection (default 16)")
    p.add_argument("--publisher-procs", type=int, default=1,
                   help="spread, hot-queue: processes the publisher connections are spread over (default 1)")
    p.add_argument("--placed-window", type=int, default=64,
                   help="spread, hot-queue: unconfirmed messages per publisher connection (default 64; 0: flood)")
    p.add_argument("--stream-messages", type=int, default=1_000_000,
                   help="streams: messages in the stream the readers read from first (default 1,000,000)")
    p.add_argument("--stream-windows", type=_ints, default=(256, 1),
                   help="streams: confirms in flight; the first fills the readers' stream, the others publish "
                   "for --duration (default 256,1)")
    p.add_argument("--stream-prefetch", type=int, default=1000, help="streams: each reader's prefetch (default 1000)")
    p.add_argument("--stream-consumers", type=int, default=10,
                   help="streams: readers of the many-readers variant, a connection each (default 10)")
    p.add_argument("--stream-retention-body", type=int, default=1000,
                   help="streams: body bytes of the retention variant's 300 MB (default 1000)")
    p.add_argument("--stream-dir", action="append", default=[], metavar="LABEL=DIR",
                   help="streams: where target LABEL keeps its streams (ours: DATA_DIR/streams; RabbitMQ: "
                   "its mnesia dir's stream folder), for the retention variant's disk figures")
    p.add_argument("--rounds", type=int, default=1, help="repeat every variant; the median is reported")
    p.add_argument("--markdown", action="store_true", help="also print Markdown rows for docs/benchmarks.md")
    p.add_argument("--json", metavar="FILE", help="write every raw measurement to FILE")
    return p


def machine_summary() -> str:
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if line.startswith("Model name")),
                 platform.processor())
    nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    return f"{nproc} cores, {model}, Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names = list(args.scenarios) + list(args.scenario) or ["all"]
    opts = Options(size=args.size, duration_s=args.duration, warmup_s=args.warmup, count=args.count,
                   publishers=args.publishers, consumers=args.consumers, consumer_procs=args.consumer_procs,
                   prefetch=args.prefetch, confirm_windows=args.confirm_windows, rates=args.rates,
                   connections=args.connections, fanout_queues=args.fanout_queues,
                   topic_bindings=args.topic_bindings, topic_queues=args.topic_queues,
                   spread_queues=args.spread_queues, publisher_procs=args.publisher_procs,
                   placed_window=args.placed_window, queue_type=args.queue_type,
                   stream_messages=args.stream_messages, stream_windows=args.stream_windows,
                   stream_prefetch=args.stream_prefetch, stream_consumers=args.stream_consumers,
                   stream_retention_body=args.stream_retention_body)
    if names == ["client-ceiling"]:
        from bench import client_ceiling

        return client_ceiling.main(opts, args.markdown)
    if "all" in names:
        names = list(ALL_ORDER)
    try:
        targets = parse_targets(args.target, args.url, args.broker_pid, args.publish_via, args.nodes, args.stream_dir)
        plan = [v for name in names for v in scenarios.variants(name, opts)]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not targets:
        print("error: give at least one --target LABEL=URL or --url URL", file=sys.stderr)
        return 2
    print(f"# machine: {machine_summary()}")
    for t in targets:
        via = f", publishers on {t.publish_via}" if t.publish_via else ""
        via += f", nodes {', '.join(t.nodes)}" if t.nodes else ""
        print(f"# target {t.label}: {t.url} (pid {t.pid if t.pid else 'unknown'}{via})")
    results = run_plan(plan, targets, args.rounds)
    print()
    print(results.table())
    if args.markdown:
        print()
        print(results.markdown())
    if results.errors:
        print("\nFAILURES\n" + results.error_report(), file=sys.stderr)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"targets": [t.__dict__ for t in targets],
                       "rows": [{"scenario": s, "variant": v, "metric": m, "values": vals}
                                for (s, v, m), vals in results.rows.items()]}, fh, indent=1)
    return 1 if results.errors else 0


def describe_failure(exc: Exception) -> str:
    """What went wrong, briefly: the broker's refusal or the worker traceback's last lines."""
    if isinstance(exc, WorkerError):
        lines = str(exc).rstrip().splitlines()
        return "\n".join(lines[:1] + ["  ..."] + lines[-4:]) if len(lines) > 6 else str(exc)
    if isinstance(exc, (OSError, AMQPError, TimeoutError)):
        return f"{type(exc).__name__}: {exc}"
    return traceback.format_exc()


def run_plan(plan: list[Variant], targets: list[Target], rounds: int) -> Results:
    """Run each variant on every target in turn (ours, rabbitmq, ours, rabbitmq, ...) for `rounds` rounds."""
    results = Results([t.label for t in targets])
    for variant in plan:
        for _ in range(rounds if variant.repeatable else 1):
            for target in targets:
                print(f"... {variant.scenario} / {variant.name} / {target.label}", file=sys.stderr, flush=True)
                try:
                    for metric, unit, value in variant.run(target):
                        results.add(target.label, Measurement(variant.scenario, variant.name, metric, unit, value))
                except Exception as exc:  # noqa: BLE001 - one failing target must not end the run
                    results.add_error(variant.scenario, variant.name, target.label, describe_failure(exc))
    return results
