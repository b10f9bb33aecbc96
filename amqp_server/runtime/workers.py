"""`amqp-server --workers N`: N node processes on this host, one cluster, sharing the AMQP port.

The parent process (`supervise`) serves no client. It checks that the AMQP (and AMQPS) port is
free, then starts N workers, each `python -m amqp_server.runtime.workers K FD ARGS`: a full cluster node
run from the same flags, environment and configuration file, with what `plan_workers` gives
worker K (name, data directory, HTTP ports). The workers bind the AMQP port with SO_REUSEPORT,
so the kernel spreads connections over them, and each binds a port of its own that the other
nodes' links reach it on (server.AMQPServer).

The parent watches each worker through a socket pair: the worker writes "ready" once it
accepts clients, and the parent sees the worker's end close when it exits; a worker sees the
parent's end close when the parent dies (even by kill -9) and stops; a ready worker also says it
is alive every second, and one silent for WATCHDOG_S is killed as hung. SIGTERM or SIGINT to the
parent stops every worker cleanly; SIGHUP is passed on (certificate reload). A worker that dies
once the group is up is started again after RESTART_DELAY_S; more than RESTART_LIMIT restarts in
RESTART_WINDOW_S, or any worker failing while the group first starts, stops the group and the
parent exits non-zero, so a service manager sees the failure (docs/cluster.md, "Every core").
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from amqp_server.config.settings import ConfigError, ServerConfig, load_config
from amqp_server.runtime.listening import bound_socket

if TYPE_CHECKING:
    from amqp_server.runtime.handover import HandoverPlan

log = logging.getLogger("amqp_server.runtime.workers")  # also when run as __main__ (a worker)

DEFAULT_NODE_NAME = "amqp-server@{host}"
RESTART_DELAY_S = 1.0
RESTART_LIMIT = 5
RESTART_WINDOW_S = 60.0
# Workers close their connections and leave the cluster on SIGTERM; one that has not exited
# by then is killed.
STOP_TIMEOUT_S = 30.0
READY = b"ready\n"
# A ready worker writes ALIVE to the parent every ALIVE_EVERY_S from its event loop. One silent
# for WATCHDOG_S is hung (its loop stuck): it still holds its share of the port, so the kernel
# would go on handing it connections nobody answers. The parent kills it, and starts it again.
ALIVE = b"alive\n"
ALIVE_EVERY_S = 1.0
WATCHDOG_S = 30.0
EXIT_FAILED = 1


@dataclass(frozen=True)
class WorkerPlan:
    """What makes worker `index` (1..N) a node of its own."""

    index: int
    node_name: str
    data_dir: Path
    management_port: int
    metrics_port: int
    https_management_port: int
    https_metrics_port: int

    def apply(self, config: ServerConfig) -> ServerConfig:
        """`config` as this worker runs it."""
        return dataclasses.replace(
            config,
            data_dir=self.data_dir,
            management_port=self.management_port,
            metrics_port=self.metrics_port,
            cluster=dataclasses.replace(config.cluster, node_name=self.node_name),
            tls=dataclasses.replace(config.tls, management_port=self.https_management_port,
                                    metrics_port=self.https_metrics_port),
        )


def worker_node_name(base: str | None, index: int) -> str:
    """Worker `index`'s node name: "amqp-server-2@host" from "amqp-server@host", "n-2" from "n"."""
    name = base or DEFAULT_NODE_NAME.format(host=socket.gethostname())
    local, at, host = name.partition("@")
    return f"{local}-{index}{at}{host}"


def plan_workers(config: ServerConfig) -> list[WorkerPlan]:
    """Every worker's plan. Worker 1 holds the HTTP ports as configured; worker K > 1 serves its
    management API and metrics on the configured port + K - 1 (none where the port is 0) and no
    HTTPS. Raises ConfigError when two of the ports the group binds are the same."""
    plans = []
    for index in range(1, config.workers + 1):
        offset = index - 1
        plans.append(WorkerPlan(
            index=index,
            node_name=worker_node_name(config.cluster.node_name, index),
            data_dir=config.data_dir / f"worker-{index}",
            management_port=config.management_port + offset if config.management_port else 0,
            metrics_port=config.metrics_port + offset if config.metrics_port else 0,
            https_management_port=config.tls.management_port if index == 1 else 0,
            https_metrics_port=config.tls.metrics_port if index == 1 else 0,
        ))
    taken: dict[int, str] = {}

    def take(port: int, what: str) -> None:
        if not port:
            return
        if port in taken:
            raise ConfigError(f"workers = {config.workers}: port {port} would be both {taken[port]} and {what} "
                              f"(worker K serves HTTP on the configured port + K - 1); choose other ports")
        if port > 65535:
            raise ConfigError(f"workers = {config.workers}: {what} would be port {port}, beyond 65535")
        taken[port] = what

    if config.tcp_listener:
        take(config.port, "the AMQP port")
    if config.tls.enabled:
        take(config.tls.amqp_port, "the AMQPS port")
    for plan in plans:
        take(plan.management_port, f"worker {plan.index}'s management port")
        take(plan.metrics_port, f"worker {plan.index}'s metrics port")
        if config.tls.enabled:
            take(plan.https_management_port, f"worker {plan.index}'s HTTPS management port")
            take(plan.https_metrics_port, f"worker {plan.index}'s HTTPS metrics port")
    return plans


# ---- the parent ----

class WorkerState(enum.Enum):
    STARTING = "starting"  # started, not yet accepting clients
    READY = "ready"
    DOWN = "down"  # exited (or never started); restarted at `restart_at` when one is due


_WORKER_TRANSITIONS = {
    WorkerState.DOWN: {WorkerState.STARTING},
    WorkerState.STARTING: {WorkerState.READY, WorkerState.DOWN},
    WorkerState.READY: {WorkerState.DOWN},
}


class GroupState(enum.Enum):
    STARTING = "starting"  # not every worker has been ready yet: a failure is fatal
    RUNNING = "running"  # every worker was ready once: a failure is restarted
    STOPPING = "stopping"  # workers told to stop; the parent exits once all are down


_GROUP_TRANSITIONS = {
    GroupState.STARTING: {GroupState.RUNNING, GroupState.STOPPING},
    GroupState.RUNNING: {GroupState.STOPPING},
    GroupState.STOPPING: set(),
}


class _Worker:
    """The Supervisor's record of one worker slot (the Supervisor alone sets its fields): its
    plan, and its current process while it has one."""

    def __init__(self, plan: WorkerPlan) -> None:
        self.plan = plan
        self.state = WorkerState.DOWN
        self.process: subprocess.Popen[bytes] | None = None
        self.channel: socket.socket | None = None
        self.restart_at: float | None = None
        self.heard_at = 0.0  # when the parent last heard from it (monotonic)

    def move(self, state: WorkerState) -> None:
        if state not in _WORKER_TRANSITIONS[self.state]:
            raise RuntimeError(f"worker {self.plan.index}: {self.state.value} -> {state.value}")
        self.state = state

    @property
    def running(self) -> subprocess.Popen[bytes]:
        """Its process: a worker has one from _spawn until _exited sees it gone (state not DOWN)."""
        assert self.process is not None, f"worker {self.plan.index} has no process"
        return self.process

    @property
    def connected(self) -> socket.socket:
        """Its end of the socket pair: open (and registered with the selector) while its process runs."""
        assert self.channel is not None, f"worker {self.plan.index} has no channel"
        return self.channel

    @property
    def label(self) -> str:
        pid = f", pid {self.process.pid}" if self.process is not None else ""
        return f"worker {self.plan.index} ({self.plan.node_name}{pid})"


class Supervisor:
    """Starts the workers, restarts one that dies, and stops them all on SIGTERM or SIGINT."""

    def __init__(self, plans: Sequence[WorkerPlan], worker_argv: Sequence[str],
                 command: Callable[[int, int], list[str]] | None = None, watchdog_s: float = WATCHDOG_S) -> None:
        """`command(index, fd)` is the worker's command line (default: `python -m
        amqp_server.runtime.workers index fd *worker_argv`); fd is its end of the socket pair. A ready
        worker silent for `watchdog_s` is killed (and so started again)."""
        self._workers = [_Worker(plan) for plan in plans]
        self._watchdog_s = watchdog_s
        argv = list(worker_argv)
        self._command = command or (lambda index, fd: [sys.executable, "-m", "amqp_server.runtime.workers", str(index),
                                                       str(fd), *argv])
        self.state = GroupState.STARTING
        self._selector = selectors.DefaultSelector()
        self._signals_in, self._signals_out = socket.socketpair()
        self._restarts: deque[float] = deque()
        self._stop_deadline: float | None = None
        self._exit_code = 0

    def _move(self, state: GroupState) -> None:
        if state not in _GROUP_TRANSITIONS[self.state]:
            raise RuntimeError(f"worker group: {self.state.value} -> {state.value}")
        self.state = state

    def run(self) -> int:
        """Run until every worker is down after a stop; returns the parent's exit code."""
        self._install_signal_handlers()
        for worker in self._workers:
            self._spawn(worker)
        while not (self.state is GroupState.STOPPING and all(w.state is WorkerState.DOWN for w in self._workers)):
            for key, _events in self._selector.select(self._timeout()):
                if key.data is None:
                    self._take_signals()
                else:
                    self._worker_readable(key.data)
            self._on_time(time.monotonic())
        self._selector.close()
        return self._exit_code

    # -- signals

    def _install_signal_handlers(self) -> None:
        # The handler only has to exist: the signal's number reaches the loop through the
        # wakeup socket, which also ends the select() it interrupts.
        self._signals_out.setblocking(False)
        self._signals_in.setblocking(False)
        signal.set_wakeup_fd(self._signals_out.fileno(), warn_on_full_buffer=False)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, lambda *_: None)
        self._selector.register(self._signals_in, selectors.EVENT_READ, None)

    def _take_signals(self) -> None:
        try:
            received = self._signals_in.recv(256)
        except BlockingIOError:
            return
        for signum in received:
            if signum in (signal.SIGTERM, signal.SIGINT):
                log.info("%s: stopping %d workers", signal.Signals(signum).name, len(self._workers))
                self._stop(0)
            elif signum == signal.SIGHUP:
                for worker in self._workers:
                    if worker.state is not WorkerState.DOWN:
                        worker.running.send_signal(signal.SIGHUP)

    # -- workers

    def _spawn(self, worker: _Worker) -> None:
        ours, theirs = socket.socketpair()
        command = self._command(worker.plan.index, theirs.fileno())
        # Its own process group: a terminal's Ctrl-C reaches the parent, which stops the
        # workers in order, rather than every process at once.
        worker.process = subprocess.Popen(command, pass_fds=(theirs.fileno(),), process_group=0)
        theirs.close()
        ours.setblocking(False)
        worker.channel = ours
        worker.restart_at = None
        worker.heard_at = time.monotonic()
        worker.move(WorkerState.STARTING)
        self._selector.register(ours, selectors.EVENT_READ, worker)
        log.info("started %s", worker.label)

    def _worker_readable(self, worker: _Worker) -> None:
        try:
            data = worker.connected.recv(64)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            worker.heard_at = time.monotonic()
            if READY in data and worker.state is WorkerState.STARTING:
                worker.move(WorkerState.READY)
                self._all_ready_yet()
            return
        self._exited(worker)

    def _all_ready_yet(self) -> None:
        if self.state is GroupState.STARTING and all(w.state is WorkerState.READY for w in self._workers):
            self._move(GroupState.RUNNING)
            log.info("all %d workers accept clients: %s", len(self._workers),
                     ", ".join(w.plan.node_name for w in self._workers))

    def _exited(self, worker: _Worker) -> None:
        """The worker's end of its channel closed: it exited (or is exiting)."""
        self._selector.unregister(worker.connected)
        worker.connected.close()
        worker.channel = None
        process = worker.running
        try:
            code = process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:  # it closed the channel yet lives on: not ours to keep
            process.kill()
            code = process.wait()
        label = worker.label
        was_ready = worker.state is WorkerState.READY
        worker.move(WorkerState.DOWN)
        worker.process = None
        if self.state is GroupState.STOPPING:
            if code not in (0, -signal.SIGTERM):
                self._exit_code = EXIT_FAILED
            log.info("%s stopped (exit code %s)", label, code)
            return
        if self.state is GroupState.STARTING and not was_ready:
            # A worker that cannot start (configuration, ports, no coordination service) would
            # fail again: the group stops with its exit code for the operator to see.
            log.error("%s exited with code %s before accepting clients: stopping the workers", label, code)
            self._stop(code if code and code > 0 else EXIT_FAILED)
            return
        now = time.monotonic()
        while self._restarts and now - self._restarts[0] > RESTART_WINDOW_S:
            self._restarts.popleft()
        if len(self._restarts) >= RESTART_LIMIT:
            log.error("%s exited with code %s, the %d-th restart within %.0f s: stopping the workers", label, code,
                      len(self._restarts) + 1, RESTART_WINDOW_S)
            self._stop(EXIT_FAILED)
            return
        self._restarts.append(now)
        worker.restart_at = now + RESTART_DELAY_S
        log.error("%s exited with code %s; starting it again in %.0f s", label, code, RESTART_DELAY_S)

    def _stop(self, exit_code: int) -> None:
        if self.state is GroupState.STOPPING:
            return
        self._move(GroupState.STOPPING)
        self._exit_code = exit_code
        self._stop_deadline = time.monotonic() + STOP_TIMEOUT_S
        for worker in self._workers:
            worker.restart_at = None
            if worker.state is not WorkerState.DOWN:
                worker.running.send_signal(signal.SIGTERM)

    # -- time

    def _timeout(self) -> float | None:
        deadlines = [w.restart_at for w in self._workers if w.restart_at is not None]
        deadlines += [w.heard_at + self._watchdog_s for w in self._workers if w.state is WorkerState.READY]
        if self._stop_deadline is not None:
            deadlines.append(self._stop_deadline)
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def _on_time(self, now: float) -> None:
        for worker in self._workers:
            if worker.restart_at is not None and worker.restart_at <= now:
                self._spawn(worker)
            elif (worker.state is WorkerState.READY and self.state is not GroupState.STOPPING
                  and now - worker.heard_at >= self._watchdog_s):
                # Killed, it closes its channel: _exited then starts it again as after a crash.
                log.error("%s has not been heard from for %.0f s (hung): killing it", worker.label, self._watchdog_s)
                worker.heard_at = now  # one kill is enough
                worker.running.kill()
        if self._stop_deadline is not None and now >= self._stop_deadline:
            self._stop_deadline = None
            for worker in self._workers:
                if worker.state is not WorkerState.DOWN:
                    log.error("%s did not stop within %.0f s: killing it", worker.label, STOP_TIMEOUT_S)
                    worker.running.kill()
            self._exit_code = EXIT_FAILED


def _claim(host: str, port: int, what: str) -> int:
    """Check `port` is free on `host` (port 0: pick one); returns the port. Bound without
    SO_REUSEPORT, so a port another broker (or another worker group) listens on is refused
    rather than silently shared with it."""
    try:
        probe = bound_socket(host, port, listen=True, backlog=1)
    except OSError as error:
        raise ConfigError(f"cannot listen on {host}:{port} for {what}: {error.strerror or error}") from None
    with probe:
        bound: int = probe.getsockname()[1]
        return bound


def supervise(config: ServerConfig, argv: Sequence[str]) -> int:
    """Run `config.workers` workers from the command line `argv` until SIGTERM or SIGINT;
    returns the exit code (2: a configuration the group cannot run)."""
    try:
        pinned = []  # port 0 becomes one port, the same for every worker
        if config.tcp_listener:
            config = dataclasses.replace(config, port=_claim(config.host, config.port, "the AMQP port"))
            pinned += ["--port", str(config.port)]
        if config.tls.enabled and config.tls.amqp_port:
            tls_port = _claim(config.host, config.tls.amqp_port, "the AMQPS port")
            config = dataclasses.replace(config, tls=dataclasses.replace(config.tls, amqp_port=tls_port))
            pinned += ["--ssl-port", str(tls_port)]
        plans = plan_workers(config)
    except ConfigError as error:
        print(f"amqp-server: configuration error: {error}", file=sys.stderr)
        return 2
    log.info("starting %d workers on %s:%d: %s", len(plans), config.host, config.port,
             "; ".join(f"{p.node_name} in {p.data_dir}"
                       + (f", management port {p.management_port}" if p.management_port else "") for p in plans))
    return Supervisor(plans, [*argv, *pinned]).run()


# ---- a worker ----

def worker_main(args: Sequence[str]) -> int:
    """`python -m amqp_server.runtime.workers K FD ARGS`: run as worker K, reporting on socket FD."""
    from amqp_server.runtime.log_escaping import configure_logging
    from amqp_server.runtime.handover import HandoverPlan, handover_address
    from amqp_server.runtime.server import event_loop_runner

    index, channel_fd, argv = int(args[0]), int(args[1]), list(args[2:])
    channel = socket.socket(fileno=channel_fd)
    try:
        config = load_config(argv)
        plans = plan_workers(config)
        plan = plans[index - 1]
    except ConfigError as error:
        print(f"amqp-server: configuration error: {error}", file=sys.stderr)
        return 2
    # Each worker takes its siblings' connections on a Unix socket named from its data directory.
    handover = HandoverPlan(plan.node_name, handover_address(plan.data_dir),
                            {p.node_name: handover_address(p.data_dir) for p in plans if p.index != index})
    config = plan.apply(config)
    configure_logging(config.log_level, node=plan.node_name)
    runner, _loop_name = event_loop_runner()
    return runner(_serve_worker(config, channel, handover))


async def _serve_worker(config: ServerConfig, channel: socket.socket, handover: "HandoverPlan") -> int:
    from amqp_server.runtime.server import serve

    loop = asyncio.get_running_loop()
    ready = asyncio.Event()
    stop = asyncio.Event()
    channel.setblocking(False)

    def parent_readable() -> None:
        try:
            data = channel.recv(64)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # the parent is gone: nobody would stop or restart this worker
            log.warning("the supervisor process is gone: stopping")
            loop.remove_reader(channel.fileno())
            stop.set()

    loop.add_reader(channel.fileno(), parent_readable)
    serving = asyncio.create_task(serve(config, ready, stop, shared_ports=True, handover=handover))
    readiness = asyncio.create_task(ready.wait())
    await asyncio.wait({serving, readiness}, return_when=asyncio.FIRST_COMPLETED)
    alive = None
    if ready.is_set():
        try:
            channel.send(READY)
        except OSError:
            stop.set()
        alive = asyncio.create_task(_say_alive(channel, stop))
    else:
        readiness.cancel()
    code = await serving
    if alive is not None:
        alive.cancel()
    return code


async def _say_alive(channel: socket.socket, stop: asyncio.Event) -> None:
    """From the event loop: the parent's watchdog hears the loop still turns."""
    while not stop.is_set():
        await asyncio.sleep(ALIVE_EVERY_S)
        try:
            channel.send(ALIVE)
        except BlockingIOError:  # the parent is behind in reading: it has heard enough
            pass
        except OSError:
            return


if __name__ == "__main__":
    raise SystemExit(worker_main(sys.argv[1:]))
