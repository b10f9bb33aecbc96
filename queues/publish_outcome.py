"""What publishing a routed message into a queue reports (Queue.publish, DelayedMessages.publish).

The channel turns these into publisher confirms: a rejected message is nacked, a durably
enqueued one is confirmed only after its journal's fsync, one stored elsewhere once that place
says it stored it (AWAIT_RECEIPT), the others at once. A message whose
disk write failed is nacked too, and in a transaction fails the commit.
"""

from __future__ import annotations

REJECTED = 0  # x-overflow reject-publish at the length limit: the publisher gets a nack
ENQUEUED = 1
ENQUEUED_DURABLY = 2  # written to the journal: a confirm must wait for its fsync
DUPLICATE = 3  # x-message-deduplication saw its id recently: accepted (confirmed), not enqueued
WRITE_FAILED = 4  # the journal could not write it (queues/journal.py): not enqueued, the publisher gets a nack
# Stored where the queue lives, not here (another node's, cluster/links/remote_queue.py): a
# confirm waits for that place's receipt of this very message (QueueType.publish_receipt).
AWAIT_RECEIPT = 5
