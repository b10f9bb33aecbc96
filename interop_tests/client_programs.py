"""The scenario programs of the clients in other languages (interop_tests/clients/): running
them, and the broker their restart, alarm and TLS scenarios need.

A scenario program takes the scenario's name and an AMQP URL (and for TLS a CA file), does what
an application on that client does, and prints one JSON object per line: `{"event": ...}` while
it runs, for a test that must act at that moment (restart the broker, clear an alarm), and last
its result, `{"ok": true, ...what it observed...}` or `{"ok": false, "error": ...}`. The tests
assert on the result.

`controlled_broker` is a broker with TLS listeners that a test may restart and raise the memory
alarm on: this project's broker (one per test module), or RabbitMQ when INTEROP_BROKER_URL points
at it and INTEROP_RABBITMQCTL says how to reach it with rabbitmqctl (`rabbitmqctl -n
rabbit@host`), and for TLS INTEROP_BROKER_AMQPS_URL and INTEROP_BROKER_CA_FILE (see README).
"""

from __future__ import annotations

import io
import json
import os
import queue
import shlex
import shutil
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from amqp_server.ctl.main import main as ctl_main
from interop_tests.broker_process import TEST_CONFIG, BrokerProcess, external_broker, free_port, launch
from interop_tests.tls_helpers import make_tls_files, tls_config

CLIENTS_DIR = Path(__file__).parent / "clients"
# What connection.start says, as RabbitMQ 3.10 says it: every capability true, and these keys.
SERVER_CAPABILITIES = dict.fromkeys([
    "publisher_confirms", "exchange_exchange_bindings", "basic.nack", "consumer_cancel_notify", "connection.blocked",
    "consumer_priorities", "authentication_failure_close", "per_consumer_qos", "direct_reply_to",
], True)
SERVER_PROPERTY_KEYS = {"product", "version", "platform", "copyright", "information", "capabilities"}
SHUTDOWN_TEXT = "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"
RUN_TIMEOUT_S = 30.0
EVENT_TIMEOUT_S = 15.0


def require_program(name: str, package: str) -> str:
    """The path of `name`; fails the test when it is missing (the test command installs
    `package`, so its absence is a broken setup, not a reason to skip)."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found on PATH: the client interop tests need Debian's {package} "
                    f"(scripts/install-test-system-packages installs it)", pytrace=False)
    return path


def _report(argv: Sequence[str], lines: list[str], stderr: str, returncode: int | None) -> dict[str, Any]:
    """The result line of a finished program; fails the test if there is none or it says ok=false."""
    name = " ".join(Path(argv[0]).name if i == 0 else arg for i, arg in enumerate(argv[:2]))
    try:
        report = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        pytest.fail(f"{name} printed no JSON result (exit {returncode})\nstdout:\n{''.join(lines)}\nstderr:\n{stderr}")
    if returncode != 0 or not report.get("ok"):
        pytest.fail(f"{name} failed (exit {returncode}): {report.get('error')}\nstderr:\n{stderr}")
    return report


def run(argv: Sequence[str], timeout: float = RUN_TIMEOUT_S, cwd: Path | None = None) -> dict[str, Any]:
    """Run a scenario program to its end and return its result."""
    try:
        result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(argv[:2])} did not finish within {timeout:.0f} s\n"
                    f"stdout:\n{exc.stdout}\nstderr:\n{exc.stderr}")
    lines = [line for line in result.stdout.splitlines(keepends=True) if line.strip()]
    return _report(argv, lines, result.stderr, result.returncode)


class Running:
    """A scenario program running in the background: the test waits for its events, then for
    its result. Use it as a context manager: leaving kills the program if it still runs."""

    def __init__(self, argv: Sequence[str], cwd: Path | None = None) -> None:
        self.argv = list(argv)
        self._stderr = io.StringIO()
        self.process = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.lines: list[str] = []
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read_stdout(self) -> None:
        for line in self.process.stdout:
            self._lines.put(line)
        self._lines.put(None)  # the program closed its output: it ended

    def _read_stderr(self) -> None:
        for line in self.process.stderr:
            self._stderr.write(line)

    def _next_line(self, deadline: float) -> str | None:
        try:
            line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            self.process.kill()
            pytest.fail(f"{' '.join(self.argv[:2])}: nothing within the time allowed\n"
                        f"stdout:\n{''.join(self.lines)}\nstderr:\n{self._stderr.getvalue()}")
        if line is not None:
            self.lines.append(line)
        return line

    def wait_for(self, event: str, within: float = EVENT_TIMEOUT_S) -> dict[str, Any]:
        """The program's `{"event": event}` line, once it printed it; fails the test if the
        program ends or prints its result first."""
        deadline = time.monotonic() + within
        while (line := self._next_line(deadline)) is not None:
            if line.strip() and json.loads(line).get("event") == event:
                return json.loads(line)
            if line.strip() and "event" not in json.loads(line):
                break
        self.process.wait(timeout=5)
        pytest.fail(f"{' '.join(self.argv[:2])} never said {event!r} (exit {self.process.returncode})\n"
                    f"stdout:\n{''.join(self.lines)}\nstderr:\n{self._stderr.getvalue()}")

    def events_for(self, seconds: float) -> list[str]:
        """The events the program prints in the next `seconds` (a result line ends the wait early;
        result() still returns it)."""
        deadline = time.monotonic() + seconds
        events = []
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                self._lines.put(None)  # for result()
                break
            self.lines.append(line)
            if line.strip():
                if "event" not in (parsed := json.loads(line)):
                    break
                events.append(parsed["event"])
        return events

    def is_done(self) -> bool:
        return self.process.poll() is not None

    def result(self, within: float = RUN_TIMEOUT_S) -> dict[str, Any]:
        """Its result, once it finished."""
        deadline = time.monotonic() + within
        while self._next_line(deadline) is not None:
            pass
        try:
            self.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.process.kill()
        return _report(self.argv, [line for line in self.lines if line.strip()], self._stderr.getvalue(),
                       self.process.wait())

    def __enter__(self) -> "Running":
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


# ---- the broker the restart, alarm and TLS scenarios need -------------------------------------

@dataclass
class ControlledBroker:
    """A broker a test may restart and set the memory alarm on, with an AMQPS listener."""

    broker: BrokerProcess
    amqps_port: int | None  # None: no TLS to test (RabbitMQ without INTEROP_BROKER_AMQPS_URL)
    ca_file: Path | None
    management_port: int | None = None  # this project's broker: where ctl reaches it
    rabbitmqctl: list[str] = field(default_factory=list)  # RabbitMQ: the command that reaches it
    amqps_host: str = "localhost"  # the name its certificate is for

    def url(self, user: str = "guest", password: str = "guest") -> str:
        return self.broker.url(user, password)

    def amqps_url(self) -> str:
        if self.amqps_port is None:
            pytest.skip("TLS against an external broker needs INTEROP_BROKER_AMQPS_URL and INTEROP_BROKER_CA_FILE")
        return f"amqps://guest:guest@{self.amqps_host}:{self.amqps_port}/%2F"

    def _ctl(self, *args: str) -> None:
        if self.broker.is_external and not self.rabbitmqctl:
            pytest.skip("restarting or alarming an external broker needs INTEROP_RABBITMQCTL")
        if self.rabbitmqctl:
            subprocess.run([*self.rabbitmqctl, *args], check=True, capture_output=True, timeout=60)
            return
        out, err = io.StringIO(), io.StringIO()
        assert ctl_main(["--port", str(self.management_port), *args], out=out, err=err) == 0, err.getvalue()

    def set_memory_alarm(self) -> None:
        """A watermark of one byte: the memory alarm is in effect when this returns."""
        self._ctl("set_vm_memory_high_watermark", "absolute", "1")

    def clear_memory_alarm(self) -> None:
        self._ctl("set_vm_memory_high_watermark", "0.4")  # the default of both brokers

    def restart(self) -> None:
        """Stop the broker as an operator does (clients get connection.close 320), start it again."""
        if self.broker.is_external:
            self._ctl("stop_app")
            self._ctl("start_app")
            return
        self.broker.restart()


def _external_controlled_broker() -> ControlledBroker:
    broker = external_broker()
    assert broker is not None
    rabbitmqctl = shlex.split(os.environ.get("INTEROP_RABBITMQCTL", ""))
    amqps_url = os.environ.get("INTEROP_BROKER_AMQPS_URL")
    ca_file = os.environ.get("INTEROP_BROKER_CA_FILE")
    amqps = urllib.parse.urlparse(amqps_url) if amqps_url and ca_file else None
    return ControlledBroker(broker, amqps.port if amqps else None, Path(ca_file) if amqps else None,
                            rabbitmqctl=rabbitmqctl, amqps_host=amqps.hostname if amqps else "localhost")


@pytest.fixture(scope="module")
def controlled_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlledBroker]:
    """One broker per test module for the scenarios that restart it, alarm it or use TLS."""
    if os.environ.get("INTEROP_BROKER_URL"):
        yield _external_controlled_broker()
        return
    workdir = tmp_path_factory.mktemp("controlled")
    files = make_tls_files(workdir / "certs")
    amqps_port, management_port = free_port(), free_port()
    process = launch(workdir / "broker", tls_config(files, TEST_CONFIG),
                     ("--ssl-port", str(amqps_port), "--management-port", str(management_port),
                      "--management-ssl-port", "0", "--metrics-ssl-port", "0"))
    try:
        yield ControlledBroker(process, amqps_port, files.ca_file, management_port=management_port)
    finally:
        process.stop()
