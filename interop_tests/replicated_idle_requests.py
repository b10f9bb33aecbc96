"""Requests per second the coordination service gets from an idle cluster holding replicated
queues: three broker nodes and one etcd on this host, Q durable quorum queues declared on node
a (default 100), nothing published; after a settling pause, etcd's own request counters
(`grpc_server_handled_total` by method, from its /metrics) are read twice, SECONDS apart.

`PYTHONPATH=<build> python -m interop_tests.replicated_idle_requests [Q [SECONDS]]`.
A measurement, not a test; docs/replication.md has figures.
"""

from __future__ import annotations

import re
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pika

from interop_tests.cluster_nodes import pika_parameters, three_nodes
from interop_tests.coordination_services import start_etcd

QUEUES = int(sys.argv[1]) if len(sys.argv) > 1 else 100
SECONDS = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
HANDLED = re.compile(r'^grpc_server_handled_total\{[^}]*grpc_method="(\w+)"[^}]*\} (\S+)$')


def handled(client_url: str) -> Counter:
    with urllib.request.urlopen(client_url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    counts: Counter = Counter()
    for line in text.splitlines():
        match = HANDLED.match(line)
        if match:
            counts[match.group(1)] += float(match.group(2))
    return counts


def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        service = start_etcd(Path(directory) / "etcd")
        try:
            with three_nodes(Path(directory), service=service) as nodes:
                connection = pika.BlockingConnection(pika_parameters(nodes["a"]))
                channel = connection.channel()
                for number in range(QUEUES):
                    channel.queue_declare(f"idle-{number}", durable=True, arguments={"x-queue-type": "quorum"})
                connection.close()
                time.sleep(10)  # every member follows every group
                url = service.etcd_members[0].client_url
                before = handled(url)
                time.sleep(SECONDS)
                after = handled(url)
                delta = {method: (after[method] - before[method]) / SECONDS for method in after}
                total = sum(delta.values())
                shown = ", ".join(f"{method} {rate:,.0f}" for method, rate in sorted(delta.items()) if rate >= 0.5)
                print(f"{QUEUES} replicated queues, idle: {total:,.0f} requests/s to etcd ({shown})")
        finally:
            service.stop()


if __name__ == "__main__":
    main()
