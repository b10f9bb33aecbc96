"""How long a new leader's takeover of a replicated queue takes, with and without compaction.

Builds a queue replica's log of N settled messages (publish, delivered, acked: 3 entries each)
around a few live ones, as a follower holds it (every entry committed and folded as it came),
then times

* ``compacted``: `QueueReplicaLog.takeover_state` on that log (its applied state, the live
  messages' records read back, the entries after it folded): what a new leader does now;
* ``restarted``: the same after reopening the directory (the state from the snapshot, then
  the entries after it);
* ``whole``: every entry's payload folded (`QueueState.rebuild`, from memory), what a takeover
  did before, less its reading of the log.

    python -m bench.replica_takeover                 # 200,000 settled messages (600,000 entries)
    python -m bench.replica_takeover -n 50000

Wall-clock figures: take them on a quiet machine (the load average is printed with them).
Results: docs/replication.md, "Log compaction".
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from cluster.replication.queue_log import QueueReplicaLog, QueueState, message_payload, state_payload
from persistence.group_commit import sync_job
from persistence.record_format import MessageState


def _build(directory: Path, settled: int) -> QueueReplicaLog:
    log = QueueReplicaLog(directory)
    live = [log.append(1, message_payload(seq, 0, "", "q", b"", b"live %d" % seq)) for seq in range(1, 4)]
    seq = len(live)
    for n in range(settled):
        seq += 1
        log.append(1, message_payload(seq, 0, "", "q", b"", b"x" * 100))
        log.append(1, state_payload(seq, MessageState.DELIVERED, 0, delivery_count=1))
        log.append(1, state_payload(seq, MessageState.ACKED, 0))
        if n % 1000 == 999:
            _commit(log)
    _commit(log)
    return log


def _commit(log: QueueReplicaLog) -> None:
    """One group-commit round, then every entry committed and folded (as a follower does)."""
    job = log.prepare_sync()
    sync_job(job)
    log.sync_done(job, None)
    log.committed(log.last_index)
    log.apply_committed()


def _timed(label: str, run) -> None:
    started = time.perf_counter()
    state = run()
    print(f"{label:>10}: {time.perf_counter() - started:8.3f} s, {len(state.held)} live messages")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--settled", type=int, default=200_000, help="settled messages (3 entries each)")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; {args.settled} settled messages")
    with tempfile.TemporaryDirectory() as tmp:
        log = _build(Path(tmp) / "log", args.settled)
        entries = log.last_index
        print(f"log: {entries} entries, base {log.snapshot_index}, {log.segment_count} segments")
        _timed("compacted", log.takeover_state)
        print(f"{'':>10}  {log.last_takeover}")
        log.close()
        reopened = QueueReplicaLog(Path(tmp) / "log")
        _timed("restarted", reopened.takeover_state)
        print(f"{'':>10}  {reopened.last_takeover}")
        reopened.close()
        # What a takeover did before: every entry's payload folded (here from memory, without
        # reading the log back: a lower bound of the old cost).
        payloads = [message_payload(s, 0, "", "q", b"", b"live %d" % s) for s in range(1, 4)]

        def replay() -> QueueState:
            state = QueueState.rebuild(payloads)
            for s in range(4, 4 + args.settled):
                state.apply(message_payload(s, 0, "", "q", b"", b"x" * 100))
                state.apply(state_payload(s, MessageState.DELIVERED, 0, delivery_count=1))
                state.apply(state_payload(s, MessageState.ACKED, 0))
            return state
        _timed("whole", replay)


if __name__ == "__main__":
    main()
