"""Start and stop Debian's RabbitMQ 3.10 for the tests that take it as a peer (shovels, federation):
one node on free 127.0.0.1 ports in a temp dir, with the management API and the plugins asked
for, as coordination_services.py starts etcd.

Needs Debian's rabbitmq-server (scripts/install-test-system-packages installs it; it ships the
shovel and federation plugins). Run as root, the node runs as the `rabbitmq` user (Erlang
refuses nothing as root, but the package's files and cookie are that user's); otherwise as the
current user, with its own home in the temp dir for the Erlang cookie.
"""

from __future__ import annotations

import base64
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from interop_tests.broker_process import free_port
from interop_tests.waiting import poll

RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
START_TIMEOUT_S = 90.0  # plugins take ~20 s on these machines, more when the machine is loaded
MANAGEMENT = "rabbitmq_management"
SHOVEL = ("rabbitmq_shovel", "rabbitmq_shovel_management")
FEDERATION = ("rabbitmq_federation", "rabbitmq_federation_management")


@dataclass
class RabbitNode:
    """A running RabbitMQ node: `amqp_url()`, `api(...)`, `kill9()`, `stop()`."""

    name: str
    amqp_port: int
    management_port: int
    directory: Path
    process: subprocess.Popen | None = None
    env: dict[str, str] = field(default_factory=dict)
    user: str | None = None

    def amqp_url(self, vhost: str = "/", user: str = "guest", password: str = "guest") -> str:
        return f"amqp://{user}:{password}@127.0.0.1:{self.amqp_port}/{urllib.parse.quote(vhost, safe='')}"

    def api(self, method: str, path: str, body: object = None) -> tuple[int, object]:
        """One management API call as guest; (status, decoded JSON or None)."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"http://127.0.0.1:{self.management_port}{path}", data=data, method=method)
        request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                text = response.read()
                return response.status, (json.loads(text) if text else None)
        except urllib.error.HTTPError as error:
            text = error.read()
            return error.code, (json.loads(text) if text else None)

    def queue_depth(self, queue: str, vhost: str = "/") -> int:
        """Messages in the queue now, asked over AMQP (the API's figures lag by seconds); -1 while
        there is no such queue."""
        import pika

        connection = pika.BlockingConnection(pika.URLParameters(self.amqp_url(vhost)))
        try:
            return connection.channel().queue_declare(queue, passive=True).method.message_count
        except pika.exceptions.ChannelClosedByBroker as error:
            if error.reply_code == 404:
                return -1
            raise
        finally:
            if connection.is_open:
                connection.close()

    def kill9(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def start_again(self) -> None:
        """Start it again on the same ports and data (after kill9)."""
        _launch(self)
        _wait_until_up(self)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


def start_rabbitmq(plugins: tuple[str, ...] = ()) -> RabbitNode:
    """A new node with the management plugin and `plugins`; RuntimeError if it does not start."""
    if not os.path.exists(RABBITMQ_SERVER):
        raise RuntimeError(f"{RABBITMQ_SERVER} is missing: run scripts/install-test-system-packages")
    directory = Path(tempfile.mkdtemp(prefix="rabbitmq-peer-"))
    amqp_port, management_port, dist_port = free_port(), free_port(), free_port()
    name = f"peer{amqp_port}@{socket.gethostname()}"
    (directory / "enabled_plugins").write_text("[" + ",".join((MANAGEMENT, *plugins)) + "].\n")
    (directory / "rabbitmq.conf").write_text(
        f"listeners.tcp.default = {amqp_port}\nmanagement.tcp.port = {management_port}\n"
        "management.tcp.ip = 127.0.0.1\nloopback_users = none\n")
    user = None
    home = directory / "home"
    home.mkdir()
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("rabbitmq")
            user = "rabbitmq"
        except KeyError:
            pass
    env = {
        **os.environ, "HOME": str(home), "RABBITMQ_NODENAME": name, "RABBITMQ_NODE_PORT": str(amqp_port),
        "RABBITMQ_DIST_PORT": str(dist_port), "RABBITMQ_MNESIA_BASE": str(directory / "mnesia"),
        "RABBITMQ_LOG_BASE": str(directory / "log"), "RABBITMQ_ENABLED_PLUGINS_FILE": str(directory / "enabled_plugins"),
        "RABBITMQ_CONFIG_FILE": str(directory / "rabbitmq"), "RABBITMQ_PID_FILE": str(directory / "pid"),
    }
    if user is not None:
        subprocess.run(["chown", "-R", f"{user}:{user}", str(directory)], check=True)
        os.chmod(directory, 0o755)
    node = RabbitNode(name, amqp_port, management_port, directory, env=env, user=user)
    _launch(node)
    try:
        _wait_until_up(node)
    except Exception:
        node.stop()
        raise
    return node


def _launch(node: RabbitNode) -> None:
    command = ["bash", "-c", f"ulimit -n 20000 2>/dev/null; exec {RABBITMQ_SERVER}"]
    if node.user is not None:
        command = ["setpriv", f"--reuid={node.user}", f"--regid={node.user}", "--init-groups", *command]
    log = open(node.directory / "console.log", "ab")
    node.process = subprocess.Popen(command, env=node.env, stdout=log, stderr=subprocess.STDOUT,
                                    cwd=str(node.directory), start_new_session=True)
    log.close()


def _wait_until_up(node: RabbitNode) -> None:
    def up() -> bool:
        assert node.process is not None
        if node.process.poll() is not None:
            raise RuntimeError(f"RabbitMQ exited with {node.process.returncode}:\n"
                               f"{(node.directory / 'console.log').read_text(errors='replace')[-3000:]}")
        try:
            status, _body = node.api("GET", "/api/overview")
        except OSError:
            return False
        return status == 200

    if not poll(up, START_TIMEOUT_S, every=0.5):
        raise RuntimeError(f"RabbitMQ did not start within {START_TIMEOUT_S} s:\n"
                           f"{(node.directory / 'console.log').read_text(errors='replace')[-3000:]}")
