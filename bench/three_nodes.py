"""Start one etcd and three broker nodes a, b, c on this host for benchmarks; stop them on Ctrl-C.

The same cluster the replicated-queue interop tests use (`interop_tests.cluster_nodes.three_nodes`:
each node `python -m amqp_server --port P --data-dir DIR --config FILE --cluster etcd://HOST:PORT/NAME
--node-name a|b|c`, the file holding the test users and `[cluster] session_ttl = 2`), kept running
until SIGINT or SIGTERM. Prints one line per node, `a amqp://guest:guest@127.0.0.1:PORT/`, then
`ready`; a durable queue declared with `x-queue-type: quorum` on a is replicated on a, b and c,
led by a.

    python -m bench.three_nodes &            # wait for "ready", then e.g.
    python -m bench confirms --queue-type quorum --target amqp-server=amqp://guest:guest@127.0.0.1:<a>/

Results: docs/benchmarks.md ("Replicated (quorum) queues on a three-node cluster").
"""

from __future__ import annotations

import argparse
import shutil
import signal
import tempfile
import threading
from pathlib import Path

from interop_tests.cluster_nodes import three_nodes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", help="directory for etcd's and the nodes' data and logs (default: a new temp dir, "
                        "removed at the end)")
    args = parser.parse_args(argv)
    workdir = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="three-nodes-"))
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        with three_nodes(workdir) as nodes:
            for name, node in nodes.items():
                print(f"{name} {node.url()} pid {node.broker.process.pid}", flush=True)
            print("ready", flush=True)
            stop.wait()
    finally:
        if not args.dir:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
