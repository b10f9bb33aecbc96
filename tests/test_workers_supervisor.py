"""The `--workers` parent's policy, with stand-in workers (small scripts speaking its socket-pair
protocol): a worker failing while the group first starts stops the group with its exit code; a
worker that dies later is started again; one that keeps dying stops the group with exit 1;
SIGINT stops every worker and the parent exits 0; a hung worker (silent past the watchdog) is
killed and started again. The real workers: interop_tests/test_cluster_workers.py."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from amqp_server.runtime.workers import RESTART_LIMIT
from interop_tests.waiting import poll

# argv: index, fd, behaviour. Prints "worker K pid P ready" and "worker K pid P stopped".
FAKE_WORKER = r"""
import os, select, signal, socket, sys, time
index, fd, behaviour = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
channel = socket.socket(fileno=fd)
if behaviour == "fail-at-start" and index == 2:
    sys.exit(7)
stopping = []
signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
channel.send(b"ready\n")
print(f"worker {index} pid {os.getpid()} ready", flush=True)
if behaviour == "crash-loop" and index == 2:
    time.sleep(0.2)
    sys.exit(3)
said = time.monotonic()
while not stopping:
    time.sleep(0.02)
    if not (behaviour == "hang" and index == 2) and time.monotonic() - said > 0.2:
        channel.send(b"alive\n")
        said = time.monotonic()
print(f"worker {index} pid {os.getpid()} stopped", flush=True)
"""

DRIVER = r"""
import logging, sys
from pathlib import Path
from amqp_server.runtime.workers import Supervisor, WorkerPlan
logging.basicConfig(level="INFO", stream=sys.stdout)
fake, behaviour, watchdog_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
plans = [WorkerPlan(k, f"w-{k}", Path("."), 0, 0, 0, 0) for k in (1, 2)]
command = lambda index, fd: [sys.executable, "-c", fake, str(index), str(fd), behaviour]
raise SystemExit(Supervisor(plans, [], command=command, watchdog_s=watchdog_s).run())
"""


class Group:
    def __init__(self, tmp_path: Path, behaviour: str, watchdog_s: float = 30.0) -> None:
        self.output = tmp_path / "out.txt"
        with self.output.open("wb") as out:
            self.process = subprocess.Popen([sys.executable, "-c", DRIVER, FAKE_WORKER, behaviour, str(watchdog_s)],
                                            stdout=out,
                                            stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def text(self) -> str:
        return self.output.read_text()

    def wait_for(self, pattern: str, count: int = 1, within: float = 30.0) -> list[re.Match]:
        """The first `count` or more matches of `pattern` in the output; fails the test, showing
        the output, if they take longer than `within` seconds."""
        def enough() -> list[re.Match]:
            found = list(re.finditer(pattern, self.text()))
            return found if len(found) >= count else []

        found = poll(enough, within)
        assert found, f"no {count} x {pattern!r} within {within} s:\n{self.text()}"
        return found

    def exit_code(self, within: float = 30.0) -> int:
        try:
            return self.process.wait(within)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError(f"the parent did not exit within {within} s:\n{self.text()}") from None


def test_a_worker_failing_at_first_start_stops_the_group_with_its_code(tmp_path: Path) -> None:
    group = Group(tmp_path, "fail-at-start")
    assert group.exit_code() == 7
    text = group.text()
    assert "worker 2 (w-2, pid" in text and "exited with code 7 before accepting clients" in text
    assert "worker 2 pid" not in text  # never started again
    if "worker 1 pid" in text:  # worker 1 was up: it was stopped, not left behind
        assert re.search(r"worker 1 pid \d+ stopped", text)


def test_a_dead_worker_is_started_again_and_sigint_stops_every_worker(tmp_path: Path) -> None:
    group = Group(tmp_path, "steady")
    group.wait_for(r"all 2 workers accept clients")
    first = int(group.wait_for(r"worker 1 pid (\d+) ready")[0].group(1))
    os.kill(first, signal.SIGKILL)
    again = group.wait_for(r"worker 1 pid (\d+) ready", count=2)[1]
    assert int(again.group(1)) != first
    assert "exited with code -9; starting it again in 1 s" in group.text()
    group.process.send_signal(signal.SIGINT)
    assert group.exit_code() == 0
    assert len(re.findall(r"worker [12] pid \d+ stopped", group.text())) == 2


@pytest.mark.slow  # 7 s: the worker dies and is started again until the restart limit
def test_a_worker_that_keeps_dying_stops_the_group(tmp_path: Path) -> None:
    group = Group(tmp_path, "crash-loop")
    assert group.exit_code(within=60) == 1
    text = group.text()
    # Started once, then again RESTART_LIMIT times; the next death stops the group.
    assert len(re.findall(r"worker 2 pid \d+ ready", text)) == RESTART_LIMIT + 1
    assert "stopping the workers" in text
    assert re.search(r"worker 1 pid \d+ stopped", text)


@pytest.mark.slow  # 3.5 s: waits out the watchdog before the hung worker is killed
def test_a_hung_worker_is_killed_and_started_again(tmp_path: Path) -> None:
    group = Group(tmp_path, "hang", watchdog_s=2.0)  # worker 2 never says it is alive
    hung = int(group.wait_for(r"worker 2 pid (\d+) ready")[0].group(1))
    again = group.wait_for(r"worker 2 pid (\d+) ready", count=2)[1]
    assert int(again.group(1)) != hung
    assert "worker 2 (w-2, pid %d) has not been heard from for 2 s (hung): killing it" % hung in group.text()
    assert len(re.findall(r"worker 1 pid \d+ ready", group.text())) == 1  # the live one is left alone
    group.process.send_signal(signal.SIGINT)
    assert group.exit_code() == 0
