"""The same faults against RabbitMQ 3.10 (Debian's rabbitmq-server), for comparison: three nodes
clustered by classic peer discovery, each in a network namespace of its own (`netns.Network`),
a quorum queue, the workload and checker of `run.FaultRun`.

    python -m interop_tests.faults.rabbitmq --faults 20 --minutes 4 --seed 27 --out /tmp/rmq

The faults that need etcd or a tmpfs disk are left out (RabbitMQ has no external coordination
service, and its data directories stay on the machine's disk): leader-from-brokers,
one-way-from-leader, flapping, pause-leader, kill-restart. Needs root and rabbitmq-server (the
comparison is optional: no test depends on it).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from interop_tests.faults.cluster import NamespacedCluster, management_json
from interop_tests.faults.history import markdown_table
from interop_tests.faults.netns import Host, Network
from interop_tests.faults.run import FaultRun
from interop_tests.waiting import wait_until

RABBITMQ_FAULTS = ("leader-from-brokers", "one-way-from-leader", "flapping", "pause-leader", "kill-restart")
NAMES = ("a", "b", "c")
RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"


@dataclass
class _Process:
    process: subprocess.Popen | None = None
    stopped: bool = False


@dataclass
class RabbitNode:
    name: str
    host: Host
    directory: Path
    broker: _Process
    mount: None = None

    @property
    def node_name(self) -> str:
        return f"rabbit@{self.host.address}"

    def url(self) -> str:
        return f"amqp://guest:guest@{self.host.address}:5672/%2F"

    @property
    def running(self) -> bool:
        return self.broker.process is not None and self.broker.process.poll() is None

    def api_json(self, path: str, timeout: float = 2.0) -> Any:
        return management_json(self.host.address, path, timeout)


class RabbitCluster(NamespacedCluster):
    """What `FaultRun` asks of a cluster, made of RabbitMQ nodes."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.network: Network | None = None
        self.nodes: dict[str, RabbitNode] = {}

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        shutil.chown(self.directory, "rabbitmq", "rabbitmq")
        self.network = Network()
        for name in NAMES:
            host = self.network.add_host(name)
            directory = self.directory / name
            directory.mkdir()
            self.nodes[name] = RabbitNode(name, host, directory, _Process())
        peers = "\n".join(f"cluster_formation.classic_config.nodes.{k} = {n.node_name}"
                          for k, n in enumerate(self.nodes.values(), 1))
        for node in self.nodes.values():
            (node.directory / "rabbitmq.conf").write_text(
                f"listeners.tcp.default = {node.host.address}:5672\nmanagement.tcp.ip = {node.host.address}\n"
                "management.tcp.port = 15672\nloopback_users = none\n"
                "cluster_formation.peer_discovery_backend = classic_config\n" + peers + "\n")
            (node.directory / "enabled_plugins").write_text("[rabbitmq_management].\n")
            subprocess.run(["chown", "-R", "rabbitmq:rabbitmq", str(node.directory)], check=True)
            self._launch(node)
        for node in self.nodes.values():
            wait_until(lambda node=node: self._running_nodes(node) == len(NAMES), f"{node.name} clustered", 180,
                       every=1.0)

    def _launch(self, node: RabbitNode) -> None:
        env = dict(os.environ, HOME="/var/lib/rabbitmq", RABBITMQ_USE_LONGNAME="true",
                   RABBITMQ_NODENAME=node.node_name, RABBITMQ_MNESIA_BASE=str(node.directory / "mnesia"),
                   RABBITMQ_LOG_BASE=str(node.directory / "log"),
                   RABBITMQ_CONFIG_FILE=str(node.directory / "rabbitmq"),
                   RABBITMQ_ENABLED_PLUGINS_FILE=str(node.directory / "enabled_plugins"))
        log = open(node.directory / "stdout.log", "ab")
        node.broker.process = subprocess.Popen(
            [*node.host.exec_prefix(), "setpriv", "--reuid=rabbitmq", "--regid=rabbitmq", "--init-groups",
             RABBITMQ_SERVER], env=env, stdout=log, stderr=subprocess.STDOUT, cwd="/var/lib/rabbitmq")
        node.broker.stopped = False

    def _running_nodes(self, node: RabbitNode) -> int:
        try:
            return sum(1 for n in node.api_json("nodes") if n.get("running"))
        except (requests.RequestException, ValueError):
            return 0

    def close(self) -> None:
        for node in self.nodes.values():
            self._kill_tree(node)
        # epmd daemons, one per namespace
        if self.network is not None:
            for host in self.network.hosts.values():
                subprocess.run([*host.exec_prefix(), "pkill", "-u", "rabbitmq", "-x", "epmd"], capture_output=True)
            self.network.close()
            self.network = None

    def _kill_tree(self, node: RabbitNode) -> None:
        process = node.broker.process
        if process is None or process.poll() is not None:
            return
        for child in _descendants(process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGCONT)
                os.kill(child, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        process.wait()

    # -- what FaultRun asks ------------------------------------------------------------------

    def leader(self, queue: str) -> str | None:
        by_node_name = {node.node_name: name for name, node in self.nodes.items()}
        for name, node in self.nodes.items():
            if node.running and not node.broker.stopped:
                view = self.queue_view(name, queue)
                if view and view.get("leader") in by_node_name:
                    return by_node_name[view["leader"]]
        return None

    def etcd_names(self) -> list[str]:
        return []

    def _beam(self, name: str) -> int:
        process = self.nodes[name].broker.process
        assert process is not None
        beams = [pid for pid in _descendants(process.pid) if _command(pid).startswith("/usr/lib/erlang")]
        return beams[0] if beams else process.pid

    def pause(self, name: str) -> None:
        os.kill(self._beam(name), signal.SIGSTOP)
        self.nodes[name].broker.stopped = True

    def resume(self, name: str) -> None:
        os.kill(self._beam(name), signal.SIGCONT)
        self.nodes[name].broker.stopped = False

    def kill9(self, name: str) -> None:
        self._kill_tree(self.nodes[name])

    def restart(self, name: str) -> None:
        node = self.nodes[name]
        self._launch(node)
        wait_until(lambda: self._running_nodes(node) == len(NAMES), f"{name} back in the cluster", 120, every=0.5)


def _descendants(pid: int) -> list[int]:
    listing = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
    children: dict[int, list[int]] = {}
    for line in listing.splitlines():
        child, parent = map(int, line.split())
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", type=int, default=20)
    parser.add_argument("--minutes", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=27)
    parser.add_argument("--out", type=Path, default=None)
    options = parser.parse_args(argv)
    out = options.out or Path(tempfile.mkdtemp(prefix="faults-rabbitmq-"))
    out.mkdir(parents=True, exist_ok=True)
    schedule = random.Random(options.seed)
    per_fault = options.minutes * 60 / options.faults
    with RabbitCluster(out / "cluster") as cluster:
        with FaultRun(cluster, seed=options.seed) as run:  # type: ignore[arg-type]
            run.start()
            began = time.monotonic()
            for number in range(options.faults):
                run.inject(schedule.choice(RABBITMQ_FAULTS), schedule.uniform(0.35, 0.65) * per_fault)
                run.settle(within=180)
                time.sleep(max(1.0, began + (number + 1) * per_fault - time.monotonic()))
            outcome = run.finish(drain_within=600)
    print(f"RabbitMQ 3.10, seed {options.seed}: {outcome.verdict.summary()}")
    print(markdown_table(outcome.table))
    run.history.save(out / "history.jsonl")
    return 0 if outcome.verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
