"""Confirms per second through the replication core, before it is wired into the broker.

Starts a one-member etcd and the test harness nodes (tests/replication_node.py: the real
QueueReplica, FileReplicaLog, group committer and etcd coordinator, payloads are real segment
records), then publishes N messages of 100 bytes with K confirms in flight over the harness's
line protocol, for a group of 3 replicas (majority: 2 fsyncs on 2 nodes) and a group of 1
(the leader's own fsync only, as an unreplicated durable queue).

    python -m bench.replication_confirms                       # 1, 16 and 256 in flight
    python -m bench.replication_confirms --in-flight 16 -n 5000

Needs etcd (Debian's etcd-server). Prints the load average with every run: on a shared machine
the figures move with it. Results: docs/replication.md.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from interop_tests.broker_process import free_port
from interop_tests.coordination_services import start_etcd
from tests.replication_node import secret_environment


def _leader_port(ports: list[int], deadline_s: float = 30.0) -> int:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for port in ports:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                    s.sendall(b"R\n")
                    answer = s.makefile("rb").readline().split()
            except OSError:
                continue
            if answer[1:2] == [b"leader"] and len(answer[3].split(b",")) == len(ports):
                return port
        time.sleep(0.1)
    raise RuntimeError("no leader with every member in sync")


def _publish(port: int, count: int, in_flight: int) -> float:
    """Seconds to have ``count`` messages confirmed with ``in_flight`` outstanding."""
    body = b"x" * 100
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = s.makefile("rb")
        sent = confirmed = 0
        started = time.perf_counter()
        while confirmed < count:
            burst = []
            while sent < count and sent - confirmed < in_flight:
                burst.append(b"P %s%08d\n" % (body, sent))
                sent += 1
            if burst:
                s.sendall(b"".join(burst))
            line = reader.readline()
            if not line.startswith(b"C "):
                raise RuntimeError(f"unexpected answer {line!r}")
            confirmed += 1
        return time.perf_counter() - started


def run(members: int, count: int, in_flights: list[int], etcd) -> list[tuple[int, float]]:
    directory = Path(tempfile.mkdtemp(prefix="repl-bench-"))
    names = [f"n{i + 1}" for i in range(members)]
    ports = [free_port() for _ in names]
    url = etcd.url(f"bench-{uuid.uuid4().hex[:8]}")
    processes = []
    environment = secret_environment()  # the nodes' shared cluster secret
    try:
        for name, port in zip(names, ports):
            log = open(directory / f"{name}.log", "wb")
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "tests.replication_node", "--cluster", url, "--node", name,
                 "--members", ",".join(names), "--data-dir", str(directory / name), "--client-port", str(port)],
                stdout=log, stderr=subprocess.STDOUT, env=environment))
        leader = _leader_port(ports)
        _publish(leader, 200, 16)  # warm up
        return [(k, count / _publish(leader, count, k)) for k in in_flights]
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=3000, help="messages per run")
    parser.add_argument("--in-flight", type=int, action="append", help="confirms in flight (repeatable)")
    args = parser.parse_args()
    in_flights = args.in_flight or [1, 16, 256]
    etcd = start_etcd(Path(tempfile.mkdtemp(prefix="repl-bench-etcd-")))
    try:
        print(f"load average before: {os.getloadavg()[0]:.2f}")
        for members in (3, 1):
            for in_flight, rate in run(members, args.n, in_flights, etcd):
                print(f"replicas={members} in_flight={in_flight} confirms/s={rate:,.0f}", flush=True)
        print(f"load average after: {os.getloadavg()[0]:.2f}")
    finally:
        etcd.stop()


if __name__ == "__main__":
    main()
