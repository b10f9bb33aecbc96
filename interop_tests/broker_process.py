"""Start and stop a real `amqp-server` process for interop tests.

Every test talks to a real broker over TCP on 127.0.0.1. By default the broker
is this project's, started on a free port with its own data directory. Setting
INTEROP_BROKER_URL (for example amqp://guest:guest@127.0.0.1:5672/) points the
shared `broker` fixture at an already running broker instead, which is how the
tests are checked against RabbitMQ itself; tests that need their own process
(`broker_factory`) always start this project's broker.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from interop_tests.waiting import poll

# Users, vhosts and permissions every test may rely on. The same set must be
# created by hand on a RabbitMQ used through INTEROP_BROKER_URL (see README of
# interop_tests).
TEST_CONFIG = """
[server]
log_level = "info"

[[users]]
name = "guest"
password = "guest"
tags = ["administrator"]

[[users]]
name = "limited"
password = "limited"

[[users]]
name = "remote"
password = "remote"

[[vhosts]]
name = "/"

[[vhosts]]
name = "other"

[[permissions]]
user = "guest"
vhost = "/"
configure = ".*"
write = ".*"
read = ".*"

[[permissions]]
user = "remote"
vhost = "/"
configure = ".*"
write = ".*"
read = ".*"

[[permissions]]
user = "limited"
vhost = "/"
configure = "^limited-.*"
write = "^limited-.*|^amq\\\\.default$"
read = "^limited-.*|^amq\\\\.topic$"
"""

STARTUP_TIMEOUT_S = 20.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Reachable(Protocol):
    """A broker the client helpers connect to: a BrokerProcess, or a cluster_nodes.ClusterNode."""

    def url(self, user: str = "guest", password: str = "guest", vhost: str = "/") -> str: ...


@dataclass
class BrokerProcess:
    host: str
    port: int
    data_dir: Path | None = None
    process: subprocess.Popen | None = None
    log_path: Path | None = None
    args: list[str] = field(default_factory=list)
    module: str = "amqp_server"  # what `python -m` runs (a test harness may wrap the broker)

    def url(self, user: str = "guest", password: str = "guest", vhost: str = "/") -> str:
        quoted_vhost = urllib.parse.quote(vhost, safe="")
        return f"amqp://{user}:{password}@{self.host}:{self.port}/{quoted_vhost}"

    @property
    def is_external(self) -> bool:
        return self.process is None

    def log_text(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, text: str, within: float = 10.0) -> str:
        """The broker's log once it contains `text`; fails the test, showing the log's end, if
        that takes longer than `within` seconds."""
        assert poll(lambda: text in self.log_text(), within, every=0.02), \
            f"{text!r} never logged:\n{self.log_text()[-3000:]}"
        return self.log_text()

    def start(self) -> None:
        assert self.data_dir is not None and self.log_path is not None
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", self.module, *self.args],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(self.data_dir.parent),
        )
        log.close()
        wait_for_port(self.host, self.port, self.process, self.log_path)

    def stop(self) -> int | None:
        """Stop cleanly with SIGTERM; return the exit code."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def kill(self) -> None:
        """Stop abruptly with SIGKILL, as a crash would."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def restart(self) -> None:
        self.stop()
        self.start()


def wait_for_port(host: str, port: int, process: subprocess.Popen, log_path: Path) -> None:
    """Until the broker accepts a TCP connection; RuntimeError with its log if it exits first or
    does not listen within STARTUP_TIMEOUT_S (then it is killed)."""
    def listening() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"broker exited with {process.returncode}:\n{log_path.read_text()}")
        with socket.create_connection((host, port), timeout=0.5):  # OSError: not yet
            return True

    try:
        if poll(listening, STARTUP_TIMEOUT_S):
            return
    except OSError:  # its last attempt was refused too
        pass
    process.kill()
    raise RuntimeError(f"broker did not listen on {host}:{port} in time:\n{log_path.read_text()}")


def launch(workdir: Path, config_text: str = TEST_CONFIG, extra_args: tuple[str, ...] = (),
           module: str = "amqp_server") -> BrokerProcess:
    """Start this project's broker in `workdir` on a free port and wait until it listens
    (`module`: what `python -m` runs instead of amqp_server, for a test harness's variant)."""
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "broker.toml"
    config_path.write_text(config_text)
    port = free_port()
    broker = BrokerProcess(
        host="127.0.0.1",
        port=port,
        data_dir=workdir / "data",
        log_path=workdir / "broker.log",
        args=[
            "--host", "127.0.0.1",
            "--port", str(port),
            "--data-dir", str(workdir / "data"),
            "--config", str(config_path),
            # Tests run many brokers at once: HTTP listeners only where a test asks for them
            # (a later --metrics-port/--management-port in extra_args wins).
            "--metrics-port", "0",
            "--management-port", "0",
            *extra_args,
        ],
        module=module,
    )
    broker.start()
    return broker


def external_broker() -> BrokerProcess | None:
    url = os.environ.get("INTEROP_BROKER_URL")
    if not url:
        return None
    parsed = urllib.parse.urlparse(url)
    return BrokerProcess(host=parsed.hostname or "127.0.0.1", port=parsed.port or 5672)
