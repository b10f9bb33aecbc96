"""Start and stop real RabbitMQ nodes (Debian's rabbitmq-server 3.10.8) for the tests that check
this broker against RabbitMQ as a peer: federation and shovels between the two.

Each `RabbitNode` is an independent node (not clustered with any other) with a name of its own,
free ports for AMQP, the management API and Erlang distribution, and its own database and log
directories under NODES_BASE (the rabbitmq user cannot reach pytest's private temp dirs; `remove`
deletes them); it runs in the foreground as the rabbitmq user (its Erlang
cookie is the rabbitmq user's, its open-files limit raised), so `kill()` is a kill -9 of its VM
and `stop()` a clean stop. scripts/install-test-system-packages installs rabbitmq-server.

Nodes take some 10 to 20 s to start with the management plugin; tests share one per module.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from interop_tests.broker_process import free_port
from interop_tests.waiting import poll

RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
NODES_BASE = Path("/tmp/rabbitmq-test-nodes")
START_TIMEOUT_S = 90.0
DEFAULT_PLUGINS = ("rabbitmq_management", "rabbitmq_federation", "rabbitmq_federation_management",
                   "rabbitmq_shovel", "rabbitmq_shovel_management")
_numbers = itertools.count(1)


def available() -> bool:
    return Path(RABBITMQ_SERVER).exists() and shutil.which("setpriv") is not None


@dataclass
class RabbitNode:
    """One RabbitMQ node (see the module docstring)."""

    directory: Path = NODES_BASE
    plugins: tuple[str, ...] = DEFAULT_PLUGINS
    name: str = ""
    amqp_port: int = 0
    management_port: int = 0
    dist_port: int = 0
    process: subprocess.Popen | None = None
    log_path: Path = field(default=Path())

    def __post_init__(self) -> None:
        short = f"t{os.getpid()}n{next(_numbers)}"
        self.name = f"{short}@{socket.gethostname().split('.')[0]}"
        self.amqp_port = free_port()
        self.management_port = free_port()
        self.dist_port = free_port()
        # (the directory given is only a hint for humans: a file there says where the node is)
        hint = self.directory
        self.directory = NODES_BASE / short
        self.log_path = self.directory / "stdout.log"
        if hint != NODES_BASE and hint.is_dir():
            (hint / f"rabbitmq-node-{short}.txt").write_text(f"{self.name}: {self.directory}\n")

    # -- addresses -----------------------------------------------------------------------

    def url(self, user: str = "guest", password: str = "guest", vhost: str = "/") -> str:
        from urllib.parse import quote

        return f"amqp://{user}:{password}@127.0.0.1:{self.amqp_port}/{quote(vhost, safe='')}"

    @property
    def cluster_name(self) -> str:
        """What RabbitMQ calls itself in x-received-from and its server properties."""
        return self.name

    # -- running -------------------------------------------------------------------------

    def start(self) -> None:
        directory = self.directory
        NODES_BASE.mkdir(exist_ok=True)
        NODES_BASE.chmod(0o755)
        (directory / "mnesia").mkdir(parents=True, exist_ok=True)
        (directory / "log").mkdir(exist_ok=True)
        (directory / "enabled_plugins").write_text("[" + ",".join(self.plugins) + "].\n")
        (directory / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = {self.amqp_port}\n"
            f"management.tcp.port = {self.management_port}\n"
            f"management.tcp.ip = 127.0.0.1\n"
            "loopback_users = none\n"
            # no disk alarm on a full test machine
            "disk_free_limit.absolute = 1MB\n")
        subprocess.run(["chown", "-R", "rabbitmq:rabbitmq", str(directory)], check=True)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": "/var/lib/rabbitmq",
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_PORT": str(self.amqp_port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(directory / "mnesia"),
            "RABBITMQ_LOG_BASE": str(directory / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(directory / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(directory / "rabbitmq"),
        }
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                ["bash", "-c", f"ulimit -n 20000; exec setpriv --reuid=rabbitmq --regid=rabbitmq --init-groups "
                               f"{RABBITMQ_SERVER}"],
                cwd="/var/lib/rabbitmq", env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        if not poll(self._ready, START_TIMEOUT_S, every=0.5):
            text = self.log_path.read_text(errors="replace")[-3000:]
            self.kill()
            raise RuntimeError(f"RabbitMQ node {self.name} did not start within {START_TIMEOUT_S} s:\n{text}")

    def _ready(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError(f"RabbitMQ node {self.name} exited while starting:\n"
                               + self.log_path.read_text(errors="replace")[-3000:])
        try:
            self.api("GET", "/api/overview")
        except (OSError, urllib.error.URLError):
            return False
        try:
            with socket.create_connection(("127.0.0.1", self.amqp_port), timeout=1):
                return True
        except OSError:
            return False

    def kill(self) -> None:
        """kill -9 of the node's VM (and whatever it started in its session)."""
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()

    def remove(self) -> None:
        """Kill the node if it runs, and delete its database and logs."""
        self.kill()
        shutil.rmtree(self.directory, ignore_errors=True)

    def restart(self) -> None:
        """Start again after kill() or stop(), with the same name, ports and database."""
        self.start()

    # -- the management API --------------------------------------------------------------

    def api(self, method: str, path: str, body: Any = None, user: str = "guest", password: str = "guest") -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"http://127.0.0.1:{self.management_port}{path}", data=data, method=method)
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
        if data is not None:
            request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=10) as reply:
            text = reply.read()
        return json.loads(text) if text else None
