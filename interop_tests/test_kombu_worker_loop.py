"""A Celery-like worker pool over kombu: tasks on a direct exchange, two prefetch-1 workers.

Each task must be processed exactly once and every one must be processed; with
prefetch 1 the broker hands a worker a new task only after it acked the last.
"""

from __future__ import annotations

import socket
import threading
from collections import Counter
from dataclasses import dataclass, field

from kombu import Connection, Consumer, Exchange, Producer, Queue

WAIT_S = 20.0
TASKS = 200


@dataclass
class Pool:
    """What the worker threads share with the test."""

    expected: int
    done: list[tuple[str, int]] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    all_done: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)

    def record(self, label: str, task_id: int) -> None:
        with self.lock:
            self.done.append((label, task_id))
            if len(self.done) >= self.expected:
                self.all_done.set()


def run_worker(url: str, queue: Queue, label: str, pool: Pool, ready: threading.Event) -> None:
    try:
        with Connection(url, connect_timeout=5) as conn:
            with conn.channel() as channel:
                def on_task(body, message) -> None:
                    pool.record(label, body["id"])
                    message.ack()

                with Consumer(channel, queues=[queue], callbacks=[on_task], prefetch_count=1):
                    ready.set()
                    while not pool.stop.is_set():
                        try:
                            conn.drain_events(timeout=0.2)
                        except socket.timeout:
                            pass
    except BaseException as exc:  # surfaced by the test thread
        pool.errors.append(exc)
        pool.all_done.set()
        ready.set()


def test_two_prefetch_one_workers_process_every_task_once(broker, unique) -> None:
    url = broker.url().replace("amqp://", "pyamqp://", 1)
    exchange = Exchange(unique("kombu-tasks-x"), type="direct", durable=False)
    queue = Queue(unique("kombu-tasks"), exchange=exchange, routing_key="celery", durable=False)
    pool = Pool(expected=TASKS)

    with Connection(url, connect_timeout=5) as publisher:
        with publisher.channel() as channel:
            queue(channel).declare()
            workers: list[threading.Thread] = []
            try:
                for label in ("w1", "w2"):
                    ready = threading.Event()
                    thread = threading.Thread(target=run_worker, args=(url, queue, label, pool, ready), daemon=True)
                    thread.start()
                    workers.append(thread)
                    assert ready.wait(WAIT_S), "worker did not start"
                assert not pool.errors, pool.errors

                producer = Producer(channel, exchange=exchange)
                for task_id in range(TASKS):
                    producer.publish({"id": task_id, "task": "add"}, routing_key="celery",
                                     serializer="json", delivery_mode=1)

                assert pool.all_done.wait(WAIT_S), f"only {len(pool.done)} of {TASKS} tasks processed"
                pool.stop.set()
                for thread in workers:
                    thread.join(WAIT_S)
                assert not pool.errors, pool.errors

                ids = Counter(task_id for _, task_id in pool.done)
                assert sorted(ids) == list(range(TASKS)), "some task was never processed"
                assert max(ids.values()) == 1, "some task was processed twice"
                by_worker = Counter(label for label, _ in pool.done)
                assert by_worker["w1"] > 0 and by_worker["w2"] > 0, by_worker
                # Workers are gone (their unacked deliveries would be requeued): nothing is left.
                assert queue(channel).queue_declare(passive=True).message_count == 0
            finally:
                pool.stop.set()
                for thread in workers:
                    thread.join(WAIT_S)
                queue(channel).delete()
                exchange(channel).delete()
