"""The data source on a Spark standalone cluster: a master and a worker started locally with
scripts/spark-standalone.sh (once for the module), and drivers in processes of their own that
never call register() (Spark finds ``amqp-queue`` through the top-level module
``pyspark_amqp_queue``). A batch read: the data directory holds live segments and archived ones;
executors read both from the shared path. A streaming read: a query over a running broker's
stream and queue, its driver SIGKILLed during a batch and started again, writes every message
once; the worker's executors read the broker's data directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from interop_tests.broker_process import free_port  # noqa: E402
from persistence.queue_store import QueueStore  # noqa: E402
from spark.synthetic_queue import write_synthetic_queue  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "spark-standalone.sh"

DRIVER = r"""
import json, os, sys
from pyspark.sql import SparkSession
url, data_dir = sys.argv[1], sys.argv[2]
session = (SparkSession.builder.master(url).appName("amqp-queue standalone test")
           .config("spark.pyspark.python", sys.executable)
           .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
           .config("spark.sql.python.filterPushdown.enabled", "true")
           .config("spark.executor.memory", "1g").config("spark.ui.enabled", "false")
           .config("spark.ui.showConsoleProgress", "false").getOrCreate())
session.sparkContext.setLogLevel("ERROR")
df = session.read.format("amqp-queue").load(data_dir)
counts = [[r["queue"], r["state"], r["archived"], r["count"]]
          for r in df.groupBy("queue", "state", "archived").count().collect()]
window = df.where("queue = 'orders' and seq between 100 and 120")
executors = session.sparkContext._jsc.sc().statusTracker().getExecutorInfos()
print("RESULT " + json.dumps({"counts": counts, "window": window.count(),
                              "window_partitions": window.rdd.getNumPartitions(), "executors": len(executors)}))
session.stop()
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("standalone")
    env = {**os.environ, "PYTHON": sys.executable, "SPARK_MASTER_PORT": str(free_port()),
           "SPARK_MASTER_WEBUI_PORT": str(free_port()), "SPARK_WORKER_WEBUI_PORT": str(free_port()),
           "SPARK_WORKER_MEMORY": "1g"}
    state = tmp_path / "cluster"
    try:
        started = subprocess.run(["bash", str(SCRIPT), "start", str(state)], env=env, capture_output=True,
                                 text=True, timeout=150)
        assert started.returncode == 0, started.stderr
        yield started.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop", str(state)], env=env, timeout=60)


# A Spark master, a worker and a driver are three JVMs: on a loaded 2-core machine starting them
# alone can outlast the suite's 120 s; the subprocess timeouts above bound each step instead.
@pytest.mark.timeout(480)
def test_standalone_master_and_worker_read_live_and_archived_segments(cluster, tmp_path):
    data_dir = tmp_path / "data"
    expected = write_synthetic_queue(data_dir, "orders", 2000, segment_size=32 * 1024)
    history = QueueStore.for_queue(data_dir, "/", "history", archive=True, segment_size=4096)
    history.recover()
    for seq in range(1, 301):
        history.append_message(seq, 1_700_000_000_000 + seq, "", "history", b"\x10\x00\x02", b"x" * 40)
    for seq in range(1, 201):
        history.append_state(seq, "acked", 1_700_000_100_000)
    history.close()
    assert list((data_dir / "archive").rglob("*.seg"))

    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    run = subprocess.run([sys.executable, "-c", DRIVER, cluster, str(data_dir)], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=240)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert run.returncode == 0 and lines, run.stderr[-3000:]
    result = json.loads(lines[0][len("RESULT "):])

    by_state: Counter = Counter()
    archived: Counter = Counter()
    for queue, state, is_archived, count in result["counts"]:
        by_state[(queue, state)] += count
        archived[(queue, is_archived)] += count
    assert {state: n for (queue, state), n in by_state.items() if queue == "orders"} == dict(expected)
    assert {state: n for (queue, state), n in by_state.items() if queue == "history"} == {"acked": 200, "ready": 100}
    assert archived[("history", True)] >= 100 and archived[("history", False)] >= 100
    assert result["window"] == 21 and result["window_partitions"] == 1
    assert result["executors"] >= 2  # the driver and at least one executor on the worker


@pytest.mark.timeout(900)
def test_standalone_streaming_query_killed_and_restarted_reads_the_brokers_files_once(cluster, tmp_path):
    from interop_tests.broker_process import launch
    from interop_tests.spark_streaming_checks import (
        QUEUE, STREAM, Driver, Publisher, assert_exactly_once, batch_log, committed_rows, declare, kill_during_a_batch)

    broker = launch(tmp_path / "broker")
    try:
        declare(broker)
        publisher = Publisher(broker, (STREAM, QUEUE))
        publisher.publish(2000)
        publisher.start()
        checkpoint, output = tmp_path / "checkpoint", tmp_path / "output"
        settings = {"master": cluster, "conf": {"spark.executor.memory": "1g"}, "data_dir": str(broker.data_dir),
                    "checkpoint": str(checkpoint), "output": str(output), "max_records": 500,
                    "trigger": "200 milliseconds"}
        try:
            killed = kill_during_a_batch(Driver(tmp_path, dict(settings), "cluster-run"), checkpoint, after_commits=1)
        finally:
            published = publisher.finish()
        last = Driver(tmp_path, {**settings, "trigger": "available-now"}, "cluster-final")
        assert last.wait(within=400) == 0, last.tail()
        planned, done = batch_log(checkpoint)
        assert planned == done, killed
        assert_exactly_once(committed_rows(output), {STREAM: published, QUEUE: published})
    finally:
        broker.stop()
