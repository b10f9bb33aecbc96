"""What the Spark streaming tests share (interop_tests/test_spark_streaming.py, test_spark_standalone.py):
a publisher with confirms, reading what a file sink committed, the exactly-once check, and drivers
in processes of their own that a test SIGKILLs during a batch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pika
import pyarrow.parquet as pq

from interop_tests.broker_process import BrokerProcess
from interop_tests.pika_helpers import connect
from interop_tests.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
STREAM, QUEUE = "orders", "audit"
SMALL_SEGMENTS = {"x-queue-type": "stream", "x-stream-max-segment-size-bytes": 64 * 1024}


def body(i: int) -> bytes:
    return f"order-{i}:".encode() + bytes(range(256))[: 20 + i % 120]


class Publisher(threading.Thread):
    """Publishes, with a confirm for each, message ``m-<i>`` to each of ``targets`` until stopped."""

    def __init__(self, broker: BrokerProcess, targets: tuple[str, ...], start: int = 0) -> None:
        super().__init__(daemon=True)
        self.connection = connect(broker, heartbeat=0)  # not pumped while the test waits: no heartbeats
        self.channel = self.connection.channel()
        self.channel.confirm_delivery()
        self.targets = targets
        self.next = start
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def publish(self, n: int) -> None:
        for _ in range(n):
            for target in self.targets:
                self.channel.basic_publish("", target, body(self.next), pika.BasicProperties(
                    message_id=f"m-{self.next}", delivery_mode=2))
            self.next += 1

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                self.publish(1)
                time.sleep(0.002)
        except BaseException as err:  # reported by the test
            self.error = err

    def finish(self) -> int:
        """Stop; how many messages each target has (every one was confirmed)."""
        self.halt.set()
        if self.is_alive():
            self.join(timeout=60)
        assert self.error is None, self.error
        self.connection.close()
        return self.next


def declare(broker: BrokerProcess, stream_arguments: dict | None = None, **streams: dict) -> None:
    with connect(broker) as connection:
        channel = connection.channel()
        channel.queue_declare(STREAM, durable=True, arguments=stream_arguments or SMALL_SEGMENTS)
        channel.queue_declare(QUEUE, durable=True)
        for name, arguments in streams.items():
            channel.queue_declare(name, durable=True, arguments=arguments)


# ---- reading what a file sink committed ---------------------------------------------------------


def committed_rows(output: Path) -> list[dict]:
    """The rows of the files the sink's metadata log lists: what the query committed."""
    paths: set[str] = set()
    for entry in sorted((output / "_spark_metadata").iterdir()):
        if entry.name.startswith(".") or entry.name.endswith(".tmp"):
            continue
        lines = entry.read_text().splitlines()[1:]  # the first line is the log's version
        for line in lines:
            record = json.loads(line)
            if record.get("action", "add") == "add":
                paths.add(record["path"])
            else:
                paths.discard(record["path"])
    rows: list[dict] = []
    for path in sorted(paths):
        rows.extend(pq.read_table(path.removeprefix("file://")).to_pylist())
    return rows


def assert_exactly_once(rows: list[dict], expected: dict[str, int]) -> None:
    """Every message of each queue or stream once, none twice, none missing: ``expected`` gives how
    many were published to each (``m-0`` .. ``m-<n-1>``)."""
    twice = [key for key, n in Counter((r["queue"], r["seq"]) for r in rows).items() if n > 1]
    assert not twice, f"{len(twice)} records read twice, e.g. {twice[:5]}"
    for queue, n in expected.items():
        ids = Counter(r["message_id"] for r in rows if r["queue"] == queue)
        assert set(ids.values()) <= {1}, f"{queue}: a message in two records"
        missing = [i for i in range(n) if f"m-{i}" not in ids]
        assert not missing, f"{queue}: {len(missing)} of {n} messages missing, e.g. {missing[:5]}"
        assert len(ids) == n
        for r in rows:
            if r["queue"] == queue:
                assert r["body"] == body(int(r["message_id"][2:]))
    offsets = sorted(r["seq"] for r in rows if r["queue"] == STREAM)
    if STREAM in expected:
        assert offsets == list(range(expected[STREAM])), "a stream's offsets: none skipped, none twice"


# ---- drivers in processes of their own -------------------------------------------------------------


class Driver:
    """A driver process (and its JVM) on a checkpoint; ``kill`` is SIGKILL to its process group."""

    def __init__(self, tmp_path: Path, settings: dict, name: str) -> None:
        self.log = tmp_path / f"{name}.log"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
               **settings.pop("env", {})}
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "interop_tests.spark_streaming_driver",
                                             json.dumps(settings)], cwd=tmp_path, env=env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=60)

    def wait(self, within: float) -> int:
        try:
            return self.process.wait(timeout=within)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the driver did not finish in {within} s:\n{self.tail()}") from None

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise AssertionError(f"the driver exited with {self.process.returncode}:\n{self.tail()}")


def batch_log(checkpoint: Path) -> tuple[set[int], set[int]]:
    """(batches planned: offsets/N, batches done: commits/N) of a checkpoint."""
    def numbers(directory: Path) -> set[int]:
        try:
            return {int(p.name) for p in directory.iterdir() if p.name.isdigit()}
        except FileNotFoundError:
            return set()
    return numbers(checkpoint / "offsets"), numbers(checkpoint / "commits")


def kill_during_a_batch(driver: Driver, checkpoint: Path, after_commits: int) -> str:
    """Once ``after_commits`` more batches are done, SIGKILL the driver while a batch is running
    (planned, not committed); what it was doing then."""
    _, done_before = batch_log(checkpoint)

    def in_a_batch() -> bool:
        driver.check_alive()
        planned, done = batch_log(checkpoint)
        return len(done - done_before) >= after_commits and max(planned, default=-1) > max(done, default=-1)

    wait_until(in_a_batch, "a batch running after the earlier ones committed", within=300, every=0.01)
    driver.kill()
    planned, done = batch_log(checkpoint)
    return f"batch {max(planned)} planned, {max(done, default=-1)} committed"
