"""The frame fuzzer (bench/frame_fuzz.py) against a live broker, bounded in time for CI.

Many parallel connections send handshakes and real client sessions with mutated frames for
FUZZ_SECONDS while a pika client makes a round trip every 0.2 s. The broker must stay alive,
log no internal error or traceback, keep its RSS under the fuzzer's bound, and answer every
round trip within 5 s. The seed is printed (and in the failure message); replay a run with
FRAME_FUZZ_SEED=N, or longer with `python -m bench.frame_fuzz --seed N`.
"""

from __future__ import annotations

import os
import random

from bench.frame_fuzz import Fuzzer

FUZZ_SECONDS = 40.0


def test_mutated_frames_never_crash_grow_or_stall_the_broker(broker_factory):
    broker = broker_factory()
    seed = int(os.environ.get("FRAME_FUZZ_SEED") or random.randrange(1 << 32))
    print(f"frame fuzz seed {seed} (replay: FRAME_FUZZ_SEED={seed})")
    report = Fuzzer(
        broker.host, broker.port, broker.process.pid, broker.log_path, seed, frames=None, duration_s=FUZZ_SECONDS
    ).run()
    print(report.summary())
    problems = report.problems()
    assert not problems, report.summary() + "\n" + "\n".join(problems)
    # Not a vacuous pass: the fuzzer got through to the broker, and so did the pika client.
    assert report.frames >= 50_000, report.summary()
    assert report.round_trips >= FUZZ_SECONDS / 1.0, report.summary()
