"""SIGKILL the broker at random moments under load; confirmed messages must survive.

Three publishers (two in confirm mode, one committing transactions of 1..20 messages) and
up to two consumers with manual acks run against one durable queue. Each round ends with a
SIGKILL at a random moment, then the broker restarts on the same data directory and the
next round starts. After the last restart the queue is drained, and the ledger
(crash_workload.py) checks every promise against what the clients observed. The workload
runs once per module; the two tests judge different promises of the same run.

The seed is printed and is part of every failure message; rerun with
DURABILITY_SEED=<seed> to get the same kill delays, body sizes and consumer behaviour
(thread timing still varies). DURABILITY_ROUNDS changes the number of kills.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pika
import pytest

from interop_tests.broker_process import BrokerProcess, launch
from interop_tests.crash_workload import QUEUE, Consumer, Ledger, Publisher, drain_ready

pytestmark = pytest.mark.timeout(120)


@dataclass
class CrashRun:
    seed: int
    rounds: int
    ledger: Ledger
    final_ready: list[tuple[str, bool]]


def kill_delay(rng: random.Random) -> float:
    """Right after the restart (recovery just ended), mid-flow, or with a grown backlog."""
    return rng.choice([rng.uniform(0.0, 0.15), rng.uniform(0.15, 1.0), rng.uniform(1.0, 2.5)])


def run_round(broker: BrokerProcess, rng: random.Random, round_: int, publishers, consumers) -> float:
    stop = threading.Event()
    active = consumers[: rng.choice([0, 1, 2, 2])]  # rounds without consumers grow a backlog
    threads = [threading.Thread(target=p.run, args=(broker.url(), stop), daemon=True) for p in publishers]
    threads += [threading.Thread(target=c.run, args=(broker.url(), stop, round_), daemon=True) for c in active]
    for thread in threads:
        thread.start()
    delay = kill_delay(rng)
    time.sleep(delay)  # the random kill moment is the point of the test
    assert broker.process.poll() is None, f"the broker died by itself in round {round_} (see {broker.log_path})"
    broker.kill()
    stop.set()
    for thread in threads:
        thread.join(timeout=15)
        assert not thread.is_alive(), "a client did not notice the broker had died"
    broker.start()
    return delay


@pytest.fixture(scope="module")
def crash_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CrashRun]:
    seed = int(os.environ.get("DURABILITY_SEED", random.randrange(1 << 32)))
    rounds = int(os.environ.get("DURABILITY_ROUNDS", 12))
    print(f"\ndurability crash test: DURABILITY_SEED={seed} rounds={rounds}")
    logging.getLogger("pika").setLevel(logging.CRITICAL)  # every kill makes pika log errors
    rng = random.Random(seed)
    broker = launch(tmp_path_factory.mktemp("crash"))
    try:
        setup = pika.BlockingConnection(pika.URLParameters(broker.url()))
        setup.channel().queue_declare(QUEUE, durable=True)
        setup.close()
        ledger = Ledger()
        publishers = [Publisher(0, ledger, seed), Publisher(1, ledger, seed), Publisher(2, ledger, seed, transactional=True)]
        consumers = [Consumer(0, ledger, seed), Consumer(1, ledger, seed)]
        started = time.monotonic()
        for round_ in range(rounds):
            delay = run_round(broker, rng, round_, publishers, consumers)
            print(f"round {round_}: killed after {delay:.2f}s; confirmed so far {len(ledger.confirmed)}")
        final_ready = drain_ready(broker.url(), ledger)
        held = sum(len(ids) for ids in ledger.held_at_kill.values())
        redelivered = sum(again for _, _, again in ledger.deliveries) + sum(again for _, again in final_ready)
        print(
            f"{time.monotonic() - started:.1f}s: confirmed {len(ledger.confirmed)}, unconfirmed at kills "
            f"{len(ledger.unconfirmed)}, deliveries {len(ledger.deliveries)}, acks sent {len(ledger.acks_sent)}, "
            f"held at kills {held}, redelivered {redelivered}, ready at the end {len(final_ready)}"
        )
        yield CrashRun(seed, rounds, ledger, final_ready)
    finally:
        broker.kill()


def test_confirmed_messages_survive_random_sigkills_intact_in_order_and_once(crash_run: CrashRun):
    ledger = crash_run.ledger
    problems = ledger.broken_guarantees(crash_run.final_ready)
    assert not problems, f"DURABILITY_SEED={crash_run.seed}: " + "\n".join(problems[:30])
    # The run proved something only if the kills hit traffic in both directions.
    assert len(ledger.confirmed) > 1000 and len(ledger.acks_sent) > 100, f"DURABILITY_SEED={crash_run.seed}"


def test_delivered_messages_come_back_redelivered_and_answered_acks_stay(crash_run: CrashRun):
    problems = crash_run.ledger.broken_delivery_promises(crash_run.final_ready, final_round=crash_run.rounds)
    assert not problems, f"DURABILITY_SEED={crash_run.seed}: " + "\n".join(problems[:30])
