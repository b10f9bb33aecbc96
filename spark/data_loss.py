"""What the streaming source does when records it must read are gone or damaged: ``failOnDataLoss``.

Records a query has not read yet can be gone: dropped by a stream's retention, in a queue
segment removed once all its messages were settled, in a queue or stream deleted during the
query. Or damaged: a torn or corrupt record, a record the decoder refuses. With
``failOnDataLoss=true`` (the default, as in Spark's Kafka source) the query fails with
``DataLoss`` (or the damage's own error: ``CorruptStreamRecord``, ``CorruptQueueRecord``), whose
message says what is missing where; with ``false`` the records are skipped and counted: in the
offsets (``lost``) when the driver finds them gone, and in a warning in the task's log, with
the count, when a task does.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

log = logging.getLogger("spark.amqp_queue")


class DataLoss(RuntimeError):
    """Records the streaming query should read are gone (``failOnDataLoss=true``)."""


class CorruptQueueRecord(ValueError):
    """A queue segment holds bytes that are not a trusted record where the query must read."""

    def __init__(self, path: str, position: int, reason: str) -> None:
        self.path, self.position, self.reason = path, position, reason
        super().__init__(f"{path}: damaged queue segment at byte {position}: {reason}")


class LossPolicy(NamedTuple):
    """``failOnDataLoss``: fail (True) or skip and count (False)."""

    fail: bool

    def lost(self, what: str, count: int | None = None) -> None:
        """Records are gone: raise ``DataLoss``, or log the skip (``count`` records, None: unknown)."""
        if self.fail:
            raise DataLoss(f"amqp-queue: {what} (failOnDataLoss is true: set it to false to skip what is "
                           f"gone and go on)")
        counted = "" if count is None else f" ({count} records)"
        log.warning("amqp-queue: skipped%s: %s (failOnDataLoss=false)", counted, what)

    def damaged(self, error: Exception, count: int | None = None) -> None:
        """Damaged records: raise ``error``, or log that they were skipped."""
        if self.fail:
            raise error
        counted = "" if count is None else f" {count} records"
        log.warning("amqp-queue: skipped%s of damaged data: %s (failOnDataLoss=false)", counted, error)
