"""A Spark driver for the streaming tests, run in a process of its own so a test can SIGKILL it (and
its JVM, in the same process group) at any moment, and start it again on the same checkpoint.

    python -m interop_tests.spark_streaming_driver '<json settings>'

Settings: ``data_dir``, ``checkpoint``; ``master`` (default local[2]); ``queue`` (the source's
glob); ``max_records`` (maxRecordsPerTrigger); ``trigger``: ``"available-now"`` (run until
caught up, then exit 0) or a processing-time interval such as ``"300 milliseconds"`` (run until
killed); ``sink``: ``"parquet"`` (``output``: the file sink's directory; columns queue, seq,
message_id, body) or ``"amqp"`` (``url``, ``routing_key``: rows whose seq is a multiple of 3 are
published to the default exchange with the routing key, body ``alert:<message_id>``).
``AMQP_QUEUE_BROKEN`` picks a broken variant from interop_tests/spark_faults.py for a control.
Prints ``STARTED <query id>`` once the query runs.
"""

from __future__ import annotations

import json
import os
import sys


def main(settings: dict) -> int:
    from spark.session import local_session

    from interop_tests import spark_faults

    broken = os.environ.get("AMQP_QUEUE_BROKEN")
    source_class = spark_faults.SOURCES.get(broken or "")
    session = local_session(settings.get("master", "local[2]"), "amqp-queue streaming test",
                            conf=settings.get("conf"))
    source_format = "amqp-queue"
    if source_class is not None:
        session.dataSource.register(source_class)
        source_format = source_class.name()
    reader = (session.readStream.format(source_format).option("startingOffsets", "earliest")
              .option("failOnDataLoss", settings.get("fail_on_data_loss", "true")))
    if settings.get("queue"):
        reader = reader.option("queue", settings["queue"])
    if settings.get("max_records"):
        reader = reader.option("maxRecordsPerTrigger", settings["max_records"])
    df = reader.load(settings["data_dir"])
    if settings.get("sink", "parquet") == "parquet":
        writer = (df.select("queue", "seq", "message_id", "body").writeStream.format("parquet")
                  .option("path", settings["output"]))
    else:
        sink_class = spark_faults.SINKS.get(broken or "", spark_faults.DyingSink)
        session.dataSource.register(sink_class)
        alerts = df.where("seq % 3 = 0").selectExpr("concat('alert:', message_id) AS body",
                                                  f"'{settings['routing_key']}' AS routing_key",
                                                  "map('source_seq', cast(seq AS string)) AS headers")
        writer = alerts.writeStream.format(sink_class.name()).option("url", settings["url"])
    writer = writer.option("checkpointLocation", settings["checkpoint"])
    trigger = settings.get("trigger", "available-now")
    writer = writer.trigger(availableNow=True) if trigger == "available-now" else writer.trigger(processingTime=trigger)
    query = writer.start()
    print(f"STARTED {query.id}", flush=True)
    query.awaitTermination()
    session.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
