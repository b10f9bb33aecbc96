"""A three-node cluster on a three-member etcd, every process in a network namespace of its own
(`netns.Network`), for the fault tests: the test partitions them, pauses, kills and restarts
them, and fills their disks.

Each node's data directory is a small tmpfs (`disk_mb`), mounted by the test and unmounted when
it ends, so `fill_disk` can make writes fail with ENOSPC. Nodes listen on their namespace's
address (AMQP 5672, management 15672); etcd members on theirs (client 2379, peer 2380).
Everything is undone by `close` (a context manager's exit): processes killed, tmpfs unmounted,
namespaces deleted, also when the test fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import requests

from interop_tests.broker_process import TEST_CONFIG, BrokerProcess, wait_for_port
from interop_tests.faults.netns import Host, Network
from interop_tests.waiting import wait_until

AMQP_PORT = 5672
MANAGEMENT_PORT = 15672
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
NODE_NAMES = ("a", "b", "c")
# The checkout the test runs from: its nodes run its code (and its harness modules, `module`).
ROOT = Path(__file__).resolve().parents[2]
ETCD_NAMES = ("e1", "e2", "e3")


@dataclass
class NamespacedBroker(BrokerProcess):
    """A broker process started inside a network namespace (`prefix`: `ip netns exec NS`)."""

    prefix: list[str] = field(default_factory=list)
    stopped: bool = False  # SIGSTOPped by the test

    def start(self) -> None:
        assert self.data_dir is not None and self.log_path is not None
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen([*self.prefix, sys.executable, "-m", self.module, *self.args],
                                            stdout=log, stderr=subprocess.STDOUT, cwd=str(self.data_dir.parent),
                                            env=env)
        self.stopped = False
        wait_for_port(self.host, self.port, self.process, self.log_path)

    def signal(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signum)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # a stopped process dies only once continued
            self.process.kill()
            self.process.wait()


@dataclass
class FaultNode:
    name: str
    host: Host
    broker: NamespacedBroker
    mount: Path | None  # its tmpfs, when it has one

    @property
    def address(self) -> str:
        return self.host.address

    def url(self, user: str = "guest", password: str = "guest") -> str:
        return f"amqp://{user}:{password}@{self.address}:{AMQP_PORT}/%2F"

    def api_json(self, path: str, timeout: float = 2.0) -> Any:
        return management_json(self.address, path, timeout)

    @property
    def running(self) -> bool:
        process = self.broker.process
        return process is not None and process.poll() is None


@dataclass
class EtcdProcess:
    name: str
    host: Host
    directory: Path
    process: subprocess.Popen | None = None


def management_json(address: str, path: str, timeout: float = 2.0) -> Any:
    """GET /api/`path` of the management API on `address` (as guest); its JSON. Raises
    requests.RequestException when the node does not answer, or answers with an error."""
    reply = requests.get(f"http://{address}:{MANAGEMENT_PORT}/api/{path}", auth=("guest", "guest"), timeout=timeout)
    reply.raise_for_status()
    return reply.json()


class NamespacedCluster:
    """What a cluster of namespaced nodes is to `run.FaultRun`, whoever's brokers it runs (this
    project's `FaultCluster`, RabbitMQ's `rabbitmq.RabbitCluster`): a context manager that
    starts it on entering and undoes everything on leaving, also when starting fails half-way;
    nodes by name, each with `api_json`."""

    nodes: dict[str, Any]

    def start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Undo what `start` did, however far it got (idempotent)."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def queue_view(self, name: str, queue: str) -> dict[str, Any] | None:
        """Node `name`'s /api/queues entry of `queue` (None if it does not answer)."""
        try:
            return self.nodes[name].api_json(f"queues/%2F/{queue}", timeout=1.0)
        except (requests.RequestException, ValueError):
            return None


class FaultCluster(NamespacedCluster):
    """See the module docstring."""

    def __init__(self, directory: Path, *, session_ttl: int = 2, module: str = "amqp_server",
                 disk_mb: int | None = 96, extra_config: str = "") -> None:
        self.directory = Path(directory)
        self.session_ttl = session_ttl
        self.module = module
        self.disk_mb = disk_mb
        self.extra_config = extra_config
        self.network: Network | None = None
        self.nodes: dict[str, FaultNode] = {}
        self.etcd: dict[str, EtcdProcess] = {}
        self.prefix = f"faults-{uuid.uuid4().hex[:6]}"
        self._mounts: list[Path] = []

    # -- starting and stopping ---------------------------------------------------------------

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.network = Network()
        for name in ETCD_NAMES:
            self.etcd[name] = EtcdProcess(name, self.network.add_host(name), self.directory / name)
        for member in self.etcd.values():
            self._launch_etcd(member)
        wait_until(lambda: all(self._etcd_healthy(m) for m in self.etcd.values()), "etcd answers", 30)
        for name in NODE_NAMES:
            self.nodes[name] = self._make_node(name, self.network.add_host(name))
        for node in self.nodes.values():
            node.broker.start()
        for node in self.nodes.values():
            wait_until(lambda node=node: self.live_nodes(node.name) == list(NODE_NAMES),
                       f"{node.name} lists every node", 30)

    @property
    def cluster_url(self) -> str:
        endpoints = ",".join(f"{m.host.address}:{ETCD_CLIENT_PORT}" for m in self.etcd.values())
        return f"etcd://{endpoints}/{self.prefix}"

    def _launch_etcd(self, member: EtcdProcess) -> None:
        address = member.host.address
        initial = ",".join(f"{m.name}=http://{m.host.address}:{ETCD_PEER_PORT}" for m in self.etcd.values())
        member.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / f"{member.name}.log", "ab") as log:
            member.process = subprocess.Popen(
                [*member.host.exec_prefix(), "etcd", "--name", member.name, "--data-dir", str(member.directory / "data"),
                 "--listen-client-urls", f"http://{address}:{ETCD_CLIENT_PORT}",
                 "--advertise-client-urls", f"http://{address}:{ETCD_CLIENT_PORT}",
                 "--listen-peer-urls", f"http://{address}:{ETCD_PEER_PORT}",
                 "--initial-advertise-peer-urls", f"http://{address}:{ETCD_PEER_PORT}",
                 "--initial-cluster", initial, "--initial-cluster-state", "new",
                 "--heartbeat-interval", "100", "--election-timeout", "1000"],
                stdout=log, stderr=subprocess.STDOUT)

    def _etcd_healthy(self, member: EtcdProcess) -> bool:
        try:
            reply = requests.get(f"http://{member.host.address}:{ETCD_CLIENT_PORT}/health", timeout=1)
        except requests.RequestException:
            return False
        return b'"true"' in reply.content

    def _make_node(self, name: str, host: Host) -> FaultNode:
        workdir = self.directory / name
        workdir.mkdir(parents=True, exist_ok=True)
        mount = None
        if self.disk_mb:
            mount = workdir / "disk"
            mount.mkdir(exist_ok=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.disk_mb}m", "tmpfs", str(mount)], check=True)
            self._mounts.append(mount)
        data_dir = (mount or workdir) / "data"
        config = workdir / "broker.toml"
        # guest logs in from the test's namespace, which is not the node's loopback.
        server = "[server]\nloopback_users = []\n"
        config.write_text(TEST_CONFIG.replace("[server]\n", server, 1)
                          + f"\n[cluster]\nsession_ttl = {self.session_ttl}\n" + self.extra_config)
        broker = NamespacedBroker(
            host=host.address, port=AMQP_PORT, data_dir=data_dir, log_path=workdir / "broker.log",
            args=["--host", host.address, "--port", str(AMQP_PORT), "--data-dir", str(data_dir),
                  "--config", str(config), "--metrics-port", "0", "--management-port", str(MANAGEMENT_PORT),
                  "--cluster", self.cluster_url, "--node-name", name],
            module=self.module, prefix=host.exec_prefix())
        return FaultNode(name, host, broker, mount)

    def close(self) -> None:
        for node in self.nodes.values():
            with contextlib.suppress(Exception):
                node.broker.kill()
        for member in self.etcd.values():
            if member.process is not None and member.process.poll() is None:
                member.process.send_signal(signal.SIGCONT)
                member.process.kill()
                member.process.wait()
        for mount in self._mounts:
            subprocess.run(["umount", "-l", str(mount)], check=False, capture_output=True)
        self._mounts.clear()
        if self.network is not None:
            self.network.close()
            self.network = None

    # -- asking the nodes ----------------------------------------------------------------------

    def live_nodes(self, name: str) -> list[str]:
        try:
            return sorted(node["name"] for node in self.nodes[name].api_json("nodes"))
        except (requests.RequestException, ValueError):
            return []

    def leader(self, queue: str) -> str | None:
        """The member that leads `queue` by its own account (None when none says it does)."""
        for name, node in self.nodes.items():
            if not node.running or node.broker.stopped:
                continue
            view = self.queue_view(name, queue)
            if view and (view.get("replica") or {}).get("role") == "leader":
                return name
        return None

    # -- faults on processes ---------------------------------------------------------------------

    def kill9(self, name: str) -> None:
        self.nodes[name].broker.kill()

    def restart(self, name: str) -> None:
        self.nodes[name].broker.start()

    def pause(self, name: str) -> None:
        broker = self.nodes[name].broker
        broker.signal(signal.SIGSTOP)
        broker.stopped = True

    def resume(self, name: str) -> None:
        broker = self.nodes[name].broker
        broker.signal(signal.SIGCONT)
        broker.stopped = False

    def stop(self, name: str, within: float = 30.0) -> tuple[int | None, float]:
        """SIGTERM node `name`: (its exit code, seconds it took); killed after `within`."""
        process = self.nodes[name].broker.process
        assert process is not None
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(within)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            code = None
        return code, time.monotonic() - started

    # -- faults on disks -------------------------------------------------------------------------

    def fill_disk(self, name: str) -> None:
        """Fill node `name`'s tmpfs to the last byte (its writes then fail with ENOSPC)."""
        mount = self.nodes[name].mount
        assert mount is not None, "the cluster was made without disks (disk_mb)"
        with open(mount / "ballast", "ab") as ballast:
            block = b"\0" * (1 << 20)
            with contextlib.suppress(OSError):
                while True:
                    ballast.write(block)
                    ballast.flush()
            with contextlib.suppress(OSError):  # the last few KiB
                while True:
                    os.write(ballast.fileno(), b"\0" * 4096)

    def free_disk(self, name: str) -> None:
        mount = self.nodes[name].mount
        assert mount is not None
        with contextlib.suppress(FileNotFoundError):
            (mount / "ballast").unlink()

    def log_text(self, name: str) -> str:
        return self.nodes[name].broker.log_text()

    def etcd_names(self) -> list[str]:
        return list(self.etcd)

    @contextlib.contextmanager
    def partitioned(self, side: list[str], other_side: list[str]) -> Iterator[None]:
        assert self.network is not None
        self.network.partition(side, other_side)
        try:
            yield
        finally:
            self.network.heal()
