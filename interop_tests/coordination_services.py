"""Start and stop real coordination services for the cluster tests: one etcd member, a
three-member etcd, or a standalone ZooKeeper, each on free 127.0.0.1 ports in a temp dir.

Needs Debian's etcd-server and zookeeper (scripts/install-test-system-packages installs them).
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from interop_tests.broker_process import free_port
from interop_tests.waiting import poll

ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"  # its manifest names every jar it needs
START_TIMEOUT_S = 30.0


def _wait_while_running(check, what: str, processes: list[subprocess.Popen]) -> None:
    """Until `check()` holds; RuntimeError (the starters' contract) if a process exits first or
    START_TIMEOUT_S passes."""
    def started() -> bool:
        if check():
            return True
        for process in processes:
            if process.poll() is not None:
                raise RuntimeError(f"{what} exited with {process.returncode} while starting")
        return False

    if not poll(started, START_TIMEOUT_S, every=0.1):
        raise RuntimeError(f"{what} did not start within {START_TIMEOUT_S} s")


@dataclass
class EtcdMember:
    name: str
    client_port: int
    peer_port: int
    process: subprocess.Popen | None = None

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"


@dataclass
class CoordinationService:
    """A running etcd (one or more members) or ZooKeeper; `url(prefix)` is the broker's --cluster."""

    scheme: str
    directory: Path
    etcd_members: list[EtcdMember] = field(default_factory=list)
    zookeeper: subprocess.Popen | None = None
    zookeeper_port: int = 0
    etcd_initial_cluster: str = ""

    def url(self, prefix: str) -> str:
        if self.scheme == "etcd":
            endpoints = ",".join(f"127.0.0.1:{m.client_port}" for m in self.etcd_members)
        else:
            endpoints = f"127.0.0.1:{self.zookeeper_port}"
        return f"{self.scheme}://{endpoints}/{prefix}"

    def etcd_leader(self) -> EtcdMember:
        """The member that is etcd's raft leader now (asked of a live member)."""
        import json

        for member in self.etcd_members:
            if member.process is None or member.process.poll() is not None:
                continue
            request = urllib.request.Request(member.client_url + "/v3/maintenance/status", data=b"{}", method="POST")
            with urllib.request.urlopen(request, timeout=5) as response:
                status = json.load(response)
            leader_id = status.get("leader")
            if leader_id and leader_id == status["header"]["member_id"]:
                return member
        raise RuntimeError("no etcd member says it is the leader")

    def make_leader(self, member: EtcdMember) -> None:
        """Move etcd's raft leadership to `member` (etcdctl move-leader) and wait until it leads."""
        import json

        def member_id(of: EtcdMember) -> str:
            request = urllib.request.Request(of.client_url + "/v3/maintenance/status", data=b"{}", method="POST")
            with urllib.request.urlopen(request, timeout=5) as response:
                return json.load(response)["header"]["member_id"]

        current = self.etcd_leader()
        if current is member:
            return
        request = urllib.request.Request(current.client_url + "/v3/maintenance/transfer-leadership",
                                         data=json.dumps({"targetID": member_id(member)}).encode(), method="POST")
        urllib.request.urlopen(request, timeout=10).close()
        _wait_while_running(lambda: self.etcd_leader() is member, f"etcd leadership moving to {member.name}",
                            [m.process for m in self.etcd_members])

    def kill9(self, member: EtcdMember) -> None:
        member.process.send_signal(signal.SIGKILL)
        member.process.wait()

    def kill9_all(self) -> None:
        """`kill -9` every member (or the ZooKeeper): the service is gone, its data stays."""
        for process in [m.process for m in self.etcd_members if m.process] + ([self.zookeeper] if self.zookeeper else []):
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                process.wait()

    def start_again(self) -> None:
        """Start every member that is not running (same ports, same data) and wait until the
        service answers."""
        if self.scheme == "etcd":
            for member in self.etcd_members:
                if member.process is None or member.process.poll() is not None:
                    _launch_etcd_member(self, member)
            processes = [m.process for m in self.etcd_members]
            _wait_while_running(lambda: all(_etcd_healthy(m) for m in self.etcd_members), "etcd", processes)
        else:
            if self.zookeeper is None or self.zookeeper.poll() is not None:
                _launch_zookeeper(self)
            _wait_while_running(lambda: _zookeeper_ok(self.zookeeper_port), "zookeeper", [self.zookeeper])

    def stop(self) -> None:
        processes = [m.process for m in self.etcd_members if m.process] + ([self.zookeeper] if self.zookeeper else [])
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


def _launch_etcd_member(service: CoordinationService, member: EtcdMember) -> None:
    # A restarted member finds its data directory and ignores the --initial-cluster flags.
    log = open(service.directory / f"{member.name}.log", "ab")
    member.process = subprocess.Popen(
        ["etcd", "--name", member.name, "--data-dir", str(service.directory / member.name),
         "--listen-client-urls", member.client_url, "--advertise-client-urls", member.client_url,
         "--listen-peer-urls", f"http://127.0.0.1:{member.peer_port}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{member.peer_port}",
         "--initial-cluster", service.etcd_initial_cluster, "--initial-cluster-state", "new",
         "--heartbeat-interval", "100", "--election-timeout", "1000"],
        stdout=log, stderr=subprocess.STDOUT,
    )


def _etcd_healthy(member: EtcdMember) -> bool:
    try:
        with urllib.request.urlopen(member.client_url + "/health", timeout=1) as response:
            return b'"true"' in response.read()
    except OSError:
        return False


def start_etcd(directory: Path, members: int = 1) -> CoordinationService:
    directory.mkdir(parents=True, exist_ok=True)
    service = CoordinationService("etcd", directory)
    service.etcd_members = [EtcdMember(f"m{i}", free_port(), free_port()) for i in range(members)]
    service.etcd_initial_cluster = ",".join(f"{m.name}=http://127.0.0.1:{m.peer_port}" for m in service.etcd_members)
    for member in service.etcd_members:
        _launch_etcd_member(service, member)
    processes = [m.process for m in service.etcd_members]
    try:
        _wait_while_running(lambda: all(_etcd_healthy(m) for m in service.etcd_members), "etcd", processes)
    except RuntimeError:
        service.stop()
        raise
    return service


def _zookeeper_ok(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"ruok")
            return s.recv(4) == b"imok"
    except OSError:
        return False


def _launch_zookeeper(service: CoordinationService) -> None:
    log = open(service.directory / "zookeeper.log", "ab")
    service.zookeeper = subprocess.Popen(
        ["java", "-cp", ZOOKEEPER_JAR, "org.apache.zookeeper.server.ZooKeeperServerMain",
         str(service.directory / "zoo.cfg")],
        stdout=log, stderr=subprocess.STDOUT,
    )


def start_zookeeper(directory: Path) -> CoordinationService:
    directory.mkdir(parents=True, exist_ok=True)
    service = CoordinationService("zookeeper", directory)
    service.zookeeper_port = free_port()
    (directory / "data").mkdir()
    config = directory / "zoo.cfg"
    config.write_text(
        "tickTime=500\n"  # sessions from 1 s (2 ticks) to 20 s: short leases for the tests
        f"dataDir={directory / 'data'}\n"
        f"clientPort={service.zookeeper_port}\n"
        "clientPortAddress=127.0.0.1\n"
        "admin.enableServer=false\n"
        "4lw.commands.whitelist=ruok\n"
    )
    _launch_zookeeper(service)
    try:
        _wait_while_running(lambda: _zookeeper_ok(service.zookeeper_port), "zookeeper", [service.zookeeper])
    except RuntimeError:
        service.stop()
        raise
    return service
