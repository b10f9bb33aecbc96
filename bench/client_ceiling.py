"""`python -m bench client-ceiling`: how fast the benchmark client itself goes, against the null broker.

A broker figure close to these numbers says more about the client than the broker.
"""

from __future__ import annotations

import multiprocessing as mp

from bench import null_broker
from bench.orchestrator import percentile, run_workers
from bench.report import Measurement, Results
from bench.scenarios import Options
from bench.workers import ConsumerSpec, PublisherSpec

SCENARIO = "client ceiling"


def _measure(url: str, opts: Options) -> list[Measurement]:
    rows: list[Measurement] = []
    timing = opts.timing

    def add(variant: str, metric: str, unit: str, value: float | None) -> None:
        if value is not None:
            rows.append(Measurement(SCENARIO, variant, metric, unit, value))

    out = run_workers([PublisherSpec(url, "", ("q",), opts.size)], [], timing, None)
    add("publish, no confirms", "published", "msg/s", out.publish_rate)
    add("publish, no confirms", "client CPU", "cores", out.client_cpu_cores("publisher"))

    for window in opts.confirm_windows:
        variant = f"publish, confirms, {window} in flight"
        out = run_workers([PublisherSpec(url, "", ("q",), opts.size, persistent=True, confirm_window=window)], [],
                          timing, None)
        add(variant, "confirmed", "msg/s", out.publish_rate)
        add(variant, "confirm p50", "ms", percentile(out.confirm_latencies_ms(), 50))
        add(variant, "client CPU", "cores", out.client_cpu_cores("publisher"))

    shapes = [("consume, auto-ack", 1, True), (f"consume, manual ack, prefetch {opts.prefetch}", 1, False),
              (f"consume, {opts.fanout_queues} connections in one process, manual ack", opts.fanout_queues, False)]
    for variant, connections, no_ack in shapes:
        group = [ConsumerSpec(url, "q", no_ack, opts.prefetch) for _ in range(connections)]
        out = run_workers([], [group], timing, None)
        add(variant, "delivered", "msg/s", out.delivery_rate)
        add(variant, "client CPU", "cores", out.client_cpu_cores("consumer"))
    return rows


def main(opts: Options, markdown: bool) -> int:
    ctx = mp.get_context("spawn")
    ports = ctx.Queue()
    server = ctx.Process(target=null_broker.serve, args=(ports, opts.size), daemon=True)
    server.start()
    try:
        url = f"amqp://guest:guest@127.0.0.1:{ports.get(timeout=30)}/"
        results = Results(["lean client"])
        for row in _measure(url, opts):
            results.add("lean client", row)
    finally:
        server.terminate()
        server.join(5)
    print(results.table())
    if markdown:
        print()
        print(results.markdown())
    return 0
