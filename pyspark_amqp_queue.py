"""Lets Spark find the ``amqp-queue`` data source with no registration call.

At the first data source call of a session, PySpark imports every top-level module named
``pyspark_*`` on the Python path and registers its ``DefaultSource`` under
``DefaultSource.name()`` (pyspark/sql/worker/lookup_data_sources.py). See docs/spark.md.
"""

from spark.data_source import AmqpQueueDataSource as DefaultSource

__all__ = ["DefaultSource"]
