"""Replicated queues: a leader streams its queue's records to followers over TCP.

The package is the replication core and imports nothing from the broker:

* `entries`   the CRC-framed log entry (index, term, payload) used on disk and on the wire;
* `wire`      the frames leader and follower exchange (sans-I/O encoder and incremental reader);
* `log`       `ReplicaLog`, the small store interface, and `FileReplicaLog`: segment files and a
              snapshot standing for the entries compacted away;
* `leader`    `LeaderReplication`, the leader's state machine: per-follower progress, the
              majority-fsynced commit index, stepping down on a newer term (sans-I/O);
* `follower`  `FollowerReplication`, the follower's state machine: term fencing, log matching,
              truncating a suffix the leader does not have, acknowledging what it fsynced (sans-I/O);
* `election`  leadership, terms, leases, votes and the in-sync set in the coordination service;
* `replica`   `QueueReplica`, the asyncio shell tying one queue's log, state machines, TCP streams
              and election together on one node.

A payload is opaque here: for a queue it is one segment record (docs/queue-files.md), see
`queue_log` (`QueueReplicaLog`: a queue replica's log that keeps the queue's state at the commit
index and compacts itself). docs/replication.md describes the protocol and its guarantees.
"""
