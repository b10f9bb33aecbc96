"""Group commit: one fsync round covers every write any store made before it started.

Stores write to the OS on the event loop; ``GroupCommitter`` owns making
those writes durable. ``request_sync(store, callback)`` is cheap (no task or
future per request): it adds the store and callback to the *pending* round.
When no round is running, the pending round starts: each store flushes its
write buffer and hands over a ``SyncJob`` (file descriptors and paths to
fsync), the fsyncs run in one worker thread, and when they are done the
callbacks run on the event loop with ``None`` (or the ``OSError`` that
stopped that store's sync). Requests that arrive while a round runs wait for
the next round, which starts as soon as the running one ends, so the more
requests are in flight the more each fsync covers.

Modes (the ``fsync`` setting):
  "always"      a round starts as soon as the previous one ends (default).
  "batch-ms:N"  rounds start at most once every N milliseconds; callbacks
                still wait for their fsync, so confirms are durable but later.
  "never"       no fsync: callbacks run once the data is written to the OS
                (survives a broker crash, not a power cut).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Protocol

from persistence.atomic_file import fsync_if_present

log = logging.getLogger(__name__)

SyncCallback = Callable[[OSError | None], None]
default_sync_file: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)


@dataclass(slots=True)
class SyncJob:
    """What one store needs made durable in a round.

    ``fds`` belong to the job (duplicates made for it): the round fsyncs and
    closes them. ``paths`` are files to open and fsync (a missing file was
    deleted meanwhile and needs nothing). ``directories`` are fsynced so new
    and removed file names survive. ``token`` goes back to ``sync_done``.
    """

    fds: list[int] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    directories: list[str] = field(default_factory=list)
    token: object = None

    def discard(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def sync_job(job: SyncJob, sync_file: Callable[[int], None] = os.fsync) -> None:
    """Make ``job`` durable with ``sync_file`` (blocking): its fds (closed after, whatever
    happens), then its paths, then its directories. Raises the first OSError."""
    try:
        for fd in job.fds:
            sync_file(fd)
    finally:
        job.discard()
    for path in job.paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue  # deleted or archived since: its messages were all settled
        try:
            sync_file(fd)
        finally:
            os.close(fd)
    for directory in job.directories:
        fd = os.open(directory, os.O_RDONLY)
        try:
            sync_file(fd)
        finally:
            os.close(fd)


class Syncable(Protocol):
    def prepare_sync(self) -> SyncJob:
        """Write buffered data to the OS and say what must be fsynced to make it durable (event loop)."""
        ...

    def sync_done(self, job: SyncJob, error: OSError | None) -> None:
        """The job's fsyncs finished (event loop); ``error`` is the first failure, if any."""
        ...

    def flush(self) -> None:
        """Write buffered data to the OS."""
        ...


def parse_sync_mode(mode: str) -> tuple[str, float]:
    """("always" | "batch" | "never", minimum seconds between round starts)."""
    if mode in ("always", "never"):
        return mode, 0.0
    if mode.startswith("batch-ms:"):
        try:
            interval_ms = int(mode.removeprefix("batch-ms:"))
        except ValueError:
            interval_ms = -1
        if interval_ms > 0:
            return "batch", interval_ms / 1000
    raise ValueError(f'fsync mode must be "always", "batch-ms:N" (N > 0) or "never", got {mode!r}')


# How many files one round fsyncs at once.
PARALLEL_FSYNCS = 16


class _Round:
    __slots__ = ("requests", "jobs", "errors")

    def __init__(self) -> None:
        self.requests: dict[Syncable, list[SyncCallback]] = {}
        self.jobs: dict[Syncable, SyncJob] = {}
        self.errors: dict[Syncable, OSError] = {}


class GroupCommitter:
    """Owns fsync for many stores; see the module docstring for the guarantees."""

    def __init__(
        self,
        mode: str = "always",
        *,
        sync_file: Callable[[int], None] = default_sync_file,
        executor: Executor | None = None,
    ) -> None:
        self.mode = mode
        self._kind, self._interval = parse_sync_mode(mode)
        self._sync_file = sync_file
        self._own_executor = executor is None
        self._executor = executor or ThreadPoolExecutor(max_workers=1, thread_name_prefix="group-commit")
        # Extra threads for rounds that span many files (only with our own executor: tests that
        # inject one want everything on it).
        self._parallel = (
            ThreadPoolExecutor(max_workers=PARALLEL_FSYNCS, thread_name_prefix="fsync") if self._own_executor else None
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending = _Round()
        self._running: _Round | None = None
        self._start_scheduled = False
        self._last_start = float("-inf")
        self._dirty: set[Syncable] = set()
        self._flush_scheduled = False
        self._idle_waiters: list[asyncio.Future[None]] = []
        self.rounds = 0  # rounds completed, for metrics and tests

    def request_sync(self, store: Syncable, callback: SyncCallback) -> None:
        """Run ``callback(error)`` on the event loop once every write ``store`` made so far is durable."""
        # The store stays on the end-of-iteration flush list: while a round is running, the next
        # one may start much later, and records written meanwhile (deliveries, acks) must reach
        # the OS now, or a crash loses what the client was already told.
        self._pending.requests.setdefault(store, []).append(callback)
        if self._running is None and not self._start_scheduled:
            self._schedule_start()

    def request_flush(self, store: Syncable) -> None:
        """Write ``store``'s buffer to the OS at the end of this event-loop iteration (no fsync).

        Use it as a store's ``on_dirty`` hook, so records nobody waits for
        (acks, deliveries) reach the OS within one loop iteration and survive
        a broker crash."""
        self._dirty.add(store)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._get_loop().call_soon(self._flush_dirty)

    async def idle(self) -> None:
        """Wait until every requested sync has completed and its callbacks ran."""
        while self._running is not None or self._pending.requests:
            waiter = self._get_loop().create_future()
            self._idle_waiters.append(waiter)
            await waiter

    def close(self) -> None:
        """Stop the worker thread (after ``idle()``); pending requests are not served."""
        if self._own_executor:
            self._executor.shutdown(wait=True)
        if self._parallel is not None:
            self._parallel.shutdown(wait=True)

    def _get_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def _schedule_start(self) -> None:
        self._start_scheduled = True
        loop = self._get_loop()
        delay = self._last_start + self._interval - time.monotonic()
        if delay > 0:
            loop.call_later(delay, self._start_round)
        else:
            # call_soon, not a direct call: requests made in this loop iteration join the round.
            loop.call_soon(self._start_round)

    def _flush_dirty(self) -> None:
        self._flush_scheduled = False
        dirty, self._dirty = self._dirty, set()
        for store in dirty:
            try:
                store.flush()
            except OSError:
                log.exception("writing a queue store's buffer failed; it will be retried")

    def _start_round(self) -> None:
        self._start_scheduled = False
        if self._running is not None or not self._pending.requests:
            return
        round_, self._pending = self._pending, _Round()
        self._running = round_
        self._last_start = time.monotonic()
        for store in round_.requests:
            try:
                round_.jobs[store] = store.prepare_sync()
            except Exception as err:  # a store's failure must not stall every other store's round
                round_.errors[store] = err if isinstance(err, OSError) else OSError(f"prepare_sync failed: {err!r}")
        if self._kind == "never" or not any(job.fds or job.paths or job.directories for job in round_.jobs.values()):
            for job in round_.jobs.values():
                job.discard()
            self._get_loop().call_soon(self._finish_round, round_, {})
            return
        future = self._get_loop().run_in_executor(self._executor, self._sync_jobs, round_.jobs)
        future.add_done_callback(lambda done: self._finish_round(round_, _result_or_error(done, round_.jobs)))

    def _sync_jobs(self, jobs: dict[Syncable, SyncJob]) -> dict[Syncable, OSError]:
        """Worker thread: fsync everything; never touches store state.

        Many stores in one round (a publisher spreading over many durable queues) are synced
        side by side: the disk and the filesystem journal merge concurrent fsyncs, so a round
        over hundreds of files costs little more than one.
        """
        errors: dict[Syncable, OSError] = {}

        def sync(item: tuple[Syncable, SyncJob]) -> None:
            try:
                sync_job(item[1], self._sync_file)
            except OSError as err:
                errors[item[0]] = err

        if len(jobs) == 1 or self._parallel is None:
            for item in jobs.items():
                sync(item)
        else:
            list(self._parallel.map(sync, jobs.items()))
        return errors

    def _finish_round(self, round_: _Round, errors: dict[Syncable, OSError]) -> None:
        errors = {**errors, **round_.errors}
        for store, callbacks in round_.requests.items():
            error = errors.get(store)
            job = round_.jobs.get(store)
            if job is not None:
                try:
                    store.sync_done(job, error)
                except Exception:
                    log.exception("sync_done failed")
            for callback in callbacks:
                try:
                    callback(error)
                except Exception:
                    log.exception("a sync callback failed")
        self.rounds += 1
        self._running = None
        if self._pending.requests:
            if self._interval > 0:
                self._schedule_start()
            else:
                self._start_round()
        else:
            waiters, self._idle_waiters = self._idle_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)


class DirectorySyncs:
    """Directories whose entries changed on the event loop (a deleted queue's directory removed
    from its parent), fsynced in the committer's next round instead of there and then."""

    def __init__(self, committer: GroupCommitter) -> None:
        self._committer = committer
        self._pending: set[str] = set()

    def sync_later(self, directory: "os.PathLike[str] | str") -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no event loop to wait on (startup, tools): fsync now
            fsync_if_present(directory)
            return
        if not self._pending:
            self._committer.request_sync(self, _log_failure)
        self._pending.add(os.fspath(directory))

    def prepare_sync(self) -> SyncJob:
        # As paths, not directories: one removed meanwhile needs nothing.
        job = SyncJob(paths=sorted(self._pending))
        self._pending.clear()
        return job

    def sync_done(self, job: SyncJob, error: OSError | None) -> None:
        pass

    def flush(self) -> None:
        pass



def _log_failure(error: OSError | None) -> None:
    if error is not None:
        log.error("fsync of a changed directory failed: %s", error)


def _result_or_error(done: asyncio.Future[dict[Syncable, OSError]], jobs: dict[Syncable, SyncJob]) -> dict[Syncable, OSError]:
    try:
        return done.result()
    except BaseException as err:  # the executor itself failed: every store in the round failed
        error = err if isinstance(err, OSError) else OSError(f"fsync round failed: {err!r}")
        return {store: error for store in jobs}
