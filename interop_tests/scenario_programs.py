"""Run the scenario programs of the clients in other languages (interop_tests/clients/), and the
broker their memory-alarm, restart and TLS scenarios need.

A program is built or found once per test session (gcc, javac, go build, mcs; php and ruby
run their scripts: see each `test_client_*.py`) and then run once per scenario as
`<command> <scenario> <url> [args]`. It does what an application on its client does and prints
one JSON object per line of stdout: `{"event": NAME}` where it stops for the test, and last its
report, `{"ok": true, ...what it observed...}` or `{"ok": false, "error": ...}`. At each event
it reads one line on stdin before it goes on, while the test changes the broker (raises the
memory alarm, restarts it): `ScenarioRun.expect(NAME)` waits for the event,
`ScenarioRun.proceed()` sends the line, `ScenarioRun.finish()` returns the report. The tests
assert on the report; client_expectations.py holds what every client must observe alike.

`ControlledBroker` (the `controlled_broker` fixture of conftest.py, one per test module) is a
broker with an AMQPS listener that a test may put under a memory alarm and restart: this
project's, or the RabbitMQ that INTEROP_BROKER_URL points at. There, alarming or restarting it
needs INTEROP_RABBITMQCTL, the command that runs its rabbitmqctl (`rabbitmqctl -n rabbit@host`),
and TLS needs INTEROP_BROKER_AMQPS_URL and INTEROP_BROKER_CA_FILE; a test that needs what is not
given is skipped there (interop_tests/README.md).
"""

from __future__ import annotations

import io
import json
import os
import queue
import shlex
import shutil
import socket
import subprocess
import threading
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NoReturn

import pytest

from amqp_server.ctl.main import main as ctl_main
from interop_tests.broker_process import TEST_CONFIG, BrokerProcess, external_broker, free_port, launch
from interop_tests.tls_helpers import make_tls_files, tls_config
from interop_tests.waiting import wait_until

CLIENTS_DIR = Path(__file__).parent / "clients"
SCENARIO_TIMEOUT_S = 60.0
EVENT_TIMEOUT_S = 30.0


# ---- building and finding the programs ---------------------------------------------------------
# What a test needs is installed by scripts/install-test-system-packages: its absence is a broken
# setup, so the tests fail (never skip) and say what to install.

def build(what: str, command: Sequence[str], cwd: Path, env: dict[str, str] | None = None,
          timeout: float = 300.0) -> None:
    """Run a build step; fail the session's tests with its output if it fails."""
    problem = None
    try:
        result = subprocess.run(list(command), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as error:
        problem = f"{error.filename} not found; scripts/install-test-system-packages installs it"
    except subprocess.TimeoutExpired:
        problem = f"`{shlex.join(command)}` took over {timeout:.0f} s"
    else:
        if result.returncode != 0:
            problem = f"`{shlex.join(command)}` failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    if problem is not None:
        pytest.fail(f"{what}: {problem}", pytrace=False)


def require_files(what: str, *paths: Path) -> None:
    """Fail the test unless every one of `paths` exists (`what` names the package that has it)."""
    missing = [str(path) for path in paths if not path.exists()]
    if missing:
        pytest.fail(f"{what}: {', '.join(missing)} missing; scripts/install-test-system-packages installs it",
                    pytrace=False)


def require_program(name: str, package: str) -> str:
    """The path of the program `name`; fails the test when it is not on PATH."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found on PATH: the client interop tests need Debian's {package} "
                    f"(scripts/install-test-system-packages installs it)", pytrace=False)
    return path


# ---- running them ------------------------------------------------------------------------------

@dataclass(frozen=True)
class ScenarioProgram:
    """A built scenario program: `command` runs it, the scenario name and its arguments follow."""

    label: str
    command: tuple[str, ...]
    env: dict[str, str] | None = None

    def run(self, scenario: str, *args: str, timeout: float = SCENARIO_TIMEOUT_S) -> dict[str, Any]:
        """Run a scenario to its end; its JSON report (the test fails unless it says ok)."""
        with self.start(scenario, *args) as run:
            return run.finish(timeout)

    def start(self, scenario: str, *args: str) -> ScenarioRun:
        """Start an interactive scenario (use it in a `with`: the process is killed at the end)."""
        process = subprocess.Popen([*self.command, scenario, *args], env=self.env, text=True, bufsize=1,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        return ScenarioRun(f"{self.label} {scenario}", process)


@dataclass
class ScenarioRun:
    """One running scenario program: its stdout lines arrive on a queue, its stderr is kept."""

    name: str
    process: subprocess.Popen
    lines: queue.Queue = field(default_factory=queue.Queue)
    stdout: list[str] = field(default_factory=list)
    stderr: io.StringIO = field(default_factory=io.StringIO)

    def __post_init__(self) -> None:
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read_stdout(self) -> None:
        for line in _stream(self.process.stdout):
            self.lines.put(line)
        self.lines.put("")  # the end

    def _read_stderr(self) -> None:
        for line in _stream(self.process.stderr):
            self.stderr.write(line)

    def __enter__(self) -> ScenarioRun:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def _next_line(self, timeout: float, waiting_for: str) -> str:
        try:
            line: str | None = self.lines.get(timeout=timeout)
        except queue.Empty:
            line = None
        if line is None:
            self._fail(f"no {waiting_for} within {timeout:.0f} s")
        if line == "":
            self.process.wait()
            self._fail(f"exited ({self.process.returncode}) before {waiting_for}")
        self.stdout.append(line)
        return line

    def _fail(self, problem: str) -> NoReturn:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        pytest.fail(f"{self.name}: {problem}\nstdout:\n{''.join(self.stdout)}\nstderr:\n{self.stderr.getvalue()}",
                    pytrace=False)

    def expect(self, event: str, timeout: float = EVENT_TIMEOUT_S) -> dict[str, Any]:
        """Wait until the program prints {"event": event}, the point where it waits for the test;
        that line. The test fails if the program ends or reports first."""
        while True:
            line = self._next_line(timeout, f"event {event!r}")
            try:
                message = json.loads(line)
            except json.JSONDecodeError:
                continue
            if message.get("event") == event:
                return message
            if "ok" in message:
                self._fail(f"ended before event {event!r}: {message.get('error')}")

    def proceed(self) -> None:
        """Let the program go on past the event it waits at."""
        stdin = _stream(self.process.stdin)
        try:
            stdin.write("go\n")
            stdin.flush()
        except BrokenPipeError:
            self._fail("exited while the test changed the broker")

    def finish(self, timeout: float = SCENARIO_TIMEOUT_S) -> dict[str, Any]:
        """Its final report; the test fails if the program fails, times out or says ok=false."""
        while True:
            line = self._next_line(timeout, "its report")
            try:
                report = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "ok" in report:
                break
        self.process.wait(timeout)
        if self.process.returncode != 0 or report["ok"] is not True:
            self._fail(f"failed (exit {self.process.returncode}): {report.get('error')}")
        return report


def _stream(stream: IO[str] | None) -> IO[str]:
    assert stream is not None  # Popen was given PIPE
    return stream


# ---- the broker the alarm, restart and TLS scenarios need --------------------------------------

@dataclass
class ControlledBroker:
    """A broker a test may put under a memory alarm and restart, with an AMQPS listener (see the
    module docstring). `management_port` is where this project's ctl reaches it; `rabbitmqctl`
    the command that reaches RabbitMQ (empty: not given)."""

    broker: BrokerProcess
    amqps_port: int | None  # None: no TLS to test (RabbitMQ without INTEROP_BROKER_AMQPS_URL)
    ca_file: Path | None  # the CA that signed the AMQPS listener's certificate
    management_port: int | None = None
    rabbitmqctl: list[str] = field(default_factory=list)
    amqps_host: str = "localhost"  # the name its certificate is for

    def url(self, user: str = "guest", password: str = "guest", vhost: str = "/") -> str:
        return self.broker.url(user, password, vhost)

    def amqps_url(self) -> str:
        """The AMQPS listener's URL (for guest on vhost /); skips the test where there is none."""
        if self.amqps_port is None:
            pytest.skip("TLS against an external broker needs INTEROP_BROKER_AMQPS_URL and INTEROP_BROKER_CA_FILE")
        return f"amqps://guest:guest@{self.amqps_host}:{self.amqps_port}/%2F"

    def raise_memory_alarm(self) -> None:
        """Set the memory watermark to 1 byte: the alarm is on, for every connection, when this
        returns (the next publish blocks a connection)."""
        self._ctl("set_vm_memory_high_watermark", "absolute", "1")
        if self.rabbitmqctl:
            # RabbitMQ tells its connections of the alarm by message, after the command returns;
            # a publish that came first would go through and never block.
            wait_until(lambda: "running" not in self._ctl("list_connections", "state"),
                       "every RabbitMQ connection blocking", 15)

    def clear_memory_alarm(self) -> None:
        self._ctl("set_vm_memory_high_watermark", "0.4")  # the default of both brokers

    def restart(self) -> None:
        """Stop the broker as an operator does (clients get connection.close 320 CONNECTION_FORCED)
        and start it again on the same ports; it listens when this returns."""
        if not self.broker.is_external:
            self.broker.restart()
            return
        self._ctl("stop_app")
        self._ctl("start_app")
        wait_until(self._listening, "RabbitMQ listening again", 30)

    def _listening(self) -> bool:
        with socket.create_connection((self.broker.host, self.broker.port), timeout=1):  # OSError: not yet
            return True

    def _ctl(self, *args: str) -> str:
        """Run rabbitmqctl, or this project's ctl, with `args`; its output."""
        if self.broker.is_external and not self.rabbitmqctl:
            pytest.skip("alarming or restarting an external broker needs INTEROP_RABBITMQCTL")
        if self.rabbitmqctl:
            return subprocess.run([*self.rabbitmqctl, "-q", *args], check=True, capture_output=True, text=True,
                                  timeout=60).stdout
        out, err = io.StringIO(), io.StringIO()
        assert ctl_main(["--port", str(self.management_port), *args], out=out, err=err) == 0, err.getvalue()
        return out.getvalue()


def _external_controlled_broker(broker: BrokerProcess) -> ControlledBroker:
    rabbitmqctl = shlex.split(os.environ.get("INTEROP_RABBITMQCTL", ""))
    amqps_url = os.environ.get("INTEROP_BROKER_AMQPS_URL")
    ca_file = os.environ.get("INTEROP_BROKER_CA_FILE")
    amqps = urllib.parse.urlparse(amqps_url) if amqps_url and ca_file else None
    if amqps is None:
        return ControlledBroker(broker, None, None, rabbitmqctl=rabbitmqctl)
    return ControlledBroker(broker, amqps.port or 5671, Path(str(ca_file)), rabbitmqctl=rabbitmqctl,
                            amqps_host=amqps.hostname or "localhost")


@contextmanager
def controlled_broker(workdir: Path) -> Iterator[ControlledBroker]:
    """This project's broker of its own in `workdir`, with a fresh test CA, an AMQPS listener
    and a management port for ctl; or, with INTEROP_BROKER_URL, the external broker."""
    external = external_broker()
    if external is not None:
        yield _external_controlled_broker(external)
        return
    files = make_tls_files(workdir / "certs")
    amqps_port, management_port = free_port(), free_port()
    process = launch(workdir / "broker", tls_config(files, TEST_CONFIG),
                     ("--ssl-port", str(amqps_port), "--management-port", str(management_port),
                      "--management-ssl-port", "0", "--metrics-ssl-port", "0"))
    try:
        yield ControlledBroker(process, amqps_port, files.ca_file, management_port=management_port)
    finally:
        process.stop()
