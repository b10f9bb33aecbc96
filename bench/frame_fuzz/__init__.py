"""Frame fuzzer: mutated AMQP frames against a live broker over TCP, while a well-behaved client watches.

Many connections run in parallel. Each sends a handshake (usually valid, sometimes mutated), then
a session built from a corpus of real client conversations (declares, publishes with rich
headers, consumes, acks, nacks, transactions, confirms, closes), in which frames are mutated: bit
flips, truncation, wrong length fields, type bytes and channel numbers, splicing two frames,
repetition, reordering, dropped frames, huge sizes. Meanwhile:

- a pika client in its own process makes a round trip (a confirmed publish and a basic.get)
  every `PROBE_INTERVAL_S`; every one must be answered within `ROUND_TRIP_BOUND_S`;
- the broker's VmRSS is sampled; the peak must stay under the bound of `rss_bound_kib`;
- the broker must stay alive, and its log must hold no internal error and no traceback.

Everything a connection sends follows from (seed, connection number), so a finding replays with
`--seed N --only-connection K` (with the same version of the fuzzer). The soak:

    python -m bench.frame_fuzz --frames 10000000 --seed 20261125

Parts: corpus.py (what real clients send), mutations.py (what the fuzzer does to it, and each
connection's session), run.py (the connections, the well-behaved client, the report),
broker_log.py (what in the broker's log is a failure).

starts its own broker (like the interop tests: a free port, a temporary data directory) unless
`--port`, `--broker-pid` and `--broker-log` name a running one.
"""

from bench.frame_fuzz.run import FuzzReport, Fuzzer

__all__ = ["FuzzReport", "Fuzzer"]
