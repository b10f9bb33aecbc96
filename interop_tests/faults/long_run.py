"""The long fault run: at least `--faults` faults over at least `--minutes`, on a random schedule
from `--seed` (kind, hold time and pause between faults), against the namespaced cluster of
`cluster.FaultCluster`; prints the checker's verdict and the per-fault table (markdown, as in
docs/reliability.md) and saves the history.

    python -m interop_tests.faults.long_run --faults 100 --minutes 15 --seed 27 --out /tmp/run

With `--queue-type stream` the run drives a replicated stream (three replicas) instead of a
quorum queue, and the stream checker (`history.check_stream`) judges it, the unavailability of
each single-node fault against the session TTL + 5 s included.

Needs root (network namespaces, tmpfs). Exit code 0 when the checker found nothing, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from interop_tests.faults.cluster import FaultCluster
from interop_tests.faults.history import markdown_table
from interop_tests.faults.run import FAULTS, QUEUE_TYPES, FaultRun


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", type=int, default=100)
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--session-ttl", type=int, default=2)
    parser.add_argument("--module", default="amqp_server", help="what the nodes run with python -m")
    parser.add_argument("--out", type=Path, default=None, help="directory for the history and the table")
    parser.add_argument("--kinds", default=",".join(FAULTS), help="the fault kinds to draw from, comma-separated")
    parser.add_argument("--queue-type", choices=QUEUE_TYPES, default="quorum", help="what the workload drives")
    options = parser.parse_args(argv)
    seed = options.seed if options.seed is not None else random.randrange(1 << 30)
    schedule = random.Random(seed)
    kinds = [kind for kind in options.kinds.split(",") if kind]
    unknown = sorted(set(kinds) - set(FAULTS))
    if unknown:
        parser.error(f"unknown fault kinds: {', '.join(unknown)} (known: {', '.join(FAULTS)})")
    out = options.out or Path(tempfile.mkdtemp(prefix="faults-long-run-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"seed {seed}; {options.queue_type}; {options.faults} faults over at least {options.minutes} min; output in {out}; "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    # Spread the faults over the time asked for: each fault's hold plus the pause after it.
    per_fault = options.minutes * 60 / options.faults
    with FaultCluster(out / "cluster", session_ttl=options.session_ttl, module=options.module) as cluster:
        served_within = options.session_ttl + 5.0 if options.queue_type == "stream" else None
        with FaultRun(cluster, seed=seed, queue_type=options.queue_type, served_within=served_within) as run:
            run.start()
            began = time.monotonic()
            loads = []
            for number in range(options.faults):
                kind = schedule.choice(kinds)
                hold = schedule.uniform(0.35, 0.65) * per_fault
                run.inject(kind, hold)
                run.settle(within=120)
                left = began + (number + 1) * per_fault - time.monotonic()
                time.sleep(max(1.0, left))
                loads.append(os.getloadavg()[0])
            outcome = run.finish(drain_within=600)
        minutes = (time.monotonic() - began) / 60
    table = markdown_table(outcome.table, stream=options.queue_type == "stream")
    summary = (f"seed {seed}, {options.queue_type}, {options.faults} faults in {minutes:.1f} min, load average "
               f"{min(loads):.1f}-{max(loads):.1f}: {outcome.verdict.summary()}")
    print(summary)
    print(table)
    run.history.save(out / "history.jsonl")
    (out / "table.md").write_text(summary + "\n\n" + table + "\n")
    return 0 if outcome.verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
