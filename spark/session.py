"""A SparkSession set up for this data source, for the report, benchmarks, tests and notebooks.

What it takes care of (each learnt the hard way, see docs/spark.md):
  * ``PYSPARK_PYTHON`` = this interpreter, in this process's environment too: otherwise Spark's
    Python workers start whatever ``python3`` is on PATH, which may lack pyarrow;
  * ``PYTHONPATH`` gets the directory holding ``spark/`` and ``pyspark_amqp_queue.py``, so workers
    can import the data source (pickled by reference) and Spark's lookup finds it by name;
  * ``SPARK_LOCAL_IP=127.0.0.1`` keeps a laptop session on loopback;
  * Python filter pushdown on, small shuffles, no UI, quiet logs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)


def prepare_environment() -> None:
    """Set the environment variables Spark's driver and Python workers need (idempotent)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if PROJECT_ROOT not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [PROJECT_ROOT, *paths] if p)


def local_session(master: str = "local[2]", app_name: str = "amqp-queue", conf: dict[str, str] | None = None) -> Any:
    """A SparkSession on ``master`` (local by default) with ``amqp-queue`` registered."""
    prepare_environment()
    from pyspark.sql import SparkSession

    import spark

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    spark.register(session)
    return session
