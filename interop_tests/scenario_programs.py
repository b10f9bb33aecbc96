"""Run the scenario programs of the client libraries in other languages (interop_tests/clients/).

A program is built once per test session (javac, go build, mcs: see the `test_client_*.py`
files) and then run once per scenario as `<command> <scenario> <url> [args]`. It prints what an
application would notice as one JSON object on its last line of stdout, {"ok": true, ...};
the test asserts on that object. Interactive scenarios print {"event": NAME} lines first and
wait for a line on stdin while the test changes the broker (`ScenarioRun.expect` and
`ScenarioRun.proceed`).

`ControlledBroker` is the broker those tests restart or put under a memory alarm: this
project's, or a RabbitMQ reached through INTEROP_BROKER_URL when INTEROP_RABBITMQCTL says how
to run its `rabbitmqctl` (for example `rabbitmqctl -n rabbit@host`); without it those tests
are skipped there.
"""

from __future__ import annotations

import io
import json
import os
import queue
import shlex
import socket
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NoReturn

import pytest

from interop_tests.broker_process import TEST_CONFIG, BrokerProcess, external_broker, free_port
from interop_tests.tls_helpers import amqps_url, make_tls_files, tls_args, tls_config, tls_ports
from interop_tests.waiting import wait_until

SCENARIO_TIMEOUT_S = 60.0
EVENT_TIMEOUT_S = 30.0


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
    missing = [str(path) for path in paths if not path.exists()]
    if missing:
        pytest.fail(f"{what}: {', '.join(missing)} missing; scripts/install-test-system-packages installs it",
                    pytrace=False)


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

    def expect(self, event: str, timeout: float = EVENT_TIMEOUT_S) -> None:
        """Wait until the program prints {"event": event}, the point where it waits for the test."""
        while True:
            line = self._next_line(timeout, f"event {event!r}")
            try:
                message = json.loads(line)
            except json.JSONDecodeError:
                continue
            if message.get("event") == event:
                return
            if "ok" in message:
                self._fail(f"ended before event {event!r}: {message.get('error')}")

    def proceed(self) -> None:
        """Let the program go on past the event it waits at."""
        stdin = _stream(self.process.stdin)
        stdin.write("go\n")
        stdin.flush()

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


class ControlledBroker:
    """A broker a test may put under a memory alarm or restart (see the module docstring)."""

    def __init__(self, broker: BrokerProcess, management_port: int | None, rabbitmqctl: list[str] | None) -> None:
        self.broker = broker
        self.management_port = management_port
        self.rabbitmqctl = rabbitmqctl

    def url(self, user: str = "guest", password: str = "guest", vhost: str = "/") -> str:
        return self.broker.url(user, password, vhost)

    def raise_memory_alarm(self) -> None:
        """Set the memory watermark to 1 byte: the alarm is on, for every connection, when this
        returns (the next publish blocks a connection)."""
        self._ctl("set_vm_memory_high_watermark", "absolute", "1")
        if self.rabbitmqctl is not None:
            # RabbitMQ tells its connections of the alarm by message, after the command returns;
            # a publish that came first would go through and never block.
            wait_until(lambda: "running" not in self._ctl("list_connections", "state"),
                       "every RabbitMQ connection blocking", 15)

    def clear_memory_alarm(self) -> None:
        self._ctl("set_vm_memory_high_watermark", "0.4")

    def restart(self) -> None:
        """Stop the broker (clients get 320 CONNECTION_FORCED) and start it again on the same port."""
        if self.rabbitmqctl is None:
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
        if self.rabbitmqctl is not None:
            return subprocess.run([*self.rabbitmqctl, "-q", *args], check=True, capture_output=True, text=True,
                                  timeout=60).stdout
        from amqp_server.ctl.main import main as ctl_main

        out, err = io.StringIO(), io.StringIO()
        assert ctl_main(["--port", str(self.management_port), *args], out=out, err=err) == 0, err.getvalue()
        return out.getvalue()


def controlled_broker(broker_factory) -> ControlledBroker:
    """This project's broker of its own (with a management port for ctl), or the external
    RabbitMQ when INTEROP_RABBITMQCTL is set; otherwise the test is skipped there."""
    external = external_broker()
    if external is not None:
        command = os.environ.get("INTEROP_RABBITMQCTL")
        if not command:
            pytest.skip("restarting or alarming the external broker needs INTEROP_RABBITMQCTL")
        return ControlledBroker(external, None, shlex.split(command))
    port = free_port()
    return ControlledBroker(broker_factory(extra_args=("--management-port", str(port))), port, None)


def tls_broker(broker_factory, directory: Path) -> tuple[Path, str]:
    """This project's broker with an AMQPS listener and a fresh test CA: (the CA's PEM file, the
    amqps URL naming `localhost`, which the server certificate is for). With INTEROP_BROKER_URL,
    the external broker's INTEROP_AMQPS_URL and INTEROP_TLS_CA instead (skipped without them)."""
    if external_broker() is not None:
        url, ca_file = os.environ.get("INTEROP_AMQPS_URL"), os.environ.get("INTEROP_TLS_CA")
        if not (url and ca_file):
            pytest.skip("TLS on the external broker needs INTEROP_AMQPS_URL and INTEROP_TLS_CA")
        return Path(ca_file), url
    files = make_tls_files(directory)
    ports = tls_ports()
    process = broker_factory(config_text=tls_config(files, TEST_CONFIG), extra_args=tls_args(ports))
    return files.ca_file, amqps_url(process, ports["amqps"])


# Where a client finds this broker differing from RabbitMQ 3.10 (issue 26), the test asserts
# RabbitMQ's behaviour and calls unless_rabbitmq_agrees with a reason naming the difference: on
# this project's broker it is marked xfail while the difference lasts, and simply passes once it
# is gone. (None is open now: the last, AMQP 0-8 refused, was closed by wire/amqp_0_8.py.)


def unless_rabbitmq_agrees(agrees: bool, reason: str) -> None:
    """Mark the test xfail when this project's broker does not do what RabbitMQ does (`reason`)."""
    if not agrees and external_broker() is None:
        pytest.xfail(reason)
