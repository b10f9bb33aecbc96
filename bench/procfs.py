"""Read a broker process's memory and CPU use from /proc, and find which process listens on a port."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    """Resident set size (VmRSS) of `pid` in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat after the command name: field 3 of proc(5) (the state) is element 0."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2 :].split()


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time `pid` and its live descendants have used so far (all threads):
    for `amqp-server --workers N` the parent's pid covers every worker."""
    total = 0.0
    for process in [pid, *_descendants(pid)]:
        try:
            fields = _stat_fields(process)
        except OSError:  # exited meanwhile
            if process == pid:
                raise
            continue
        total += (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # fields 14 and 15 of proc(5)
    return total


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                children.setdefault(int(_stat_fields(int(entry.name))[1]), []).append(int(entry.name))
            except OSError:
                continue
    found, todo = [], list(children.get(pid, ()))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, ()))
    return found


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            local, state, inode = cols[1], cols[3], cols[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(inode)
    return inodes


def pid_listening_on(port: int) -> int | None:
    """The pid owning a listening TCP socket on `port` (needs permission to read other processes' fds).
    Several processes sharing the port (SO_REUSEPORT: `amqp-server --workers N`) with one parent:
    that parent, whose CPU figure (cpu_seconds) covers them all."""
    wanted = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    if not wanted:
        return None
    owners = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in wanted for fd in (entry / "fd").iterdir()):
                owners.add(int(entry.name))
        except OSError:
            continue
    if len(owners) > 1:
        parents = set()
        for owner in owners:
            try:
                parents.add(int(_stat_fields(owner)[1]))
            except OSError:
                continue
        return parents.pop() if len(parents) == 1 else None
    return owners.pop() if owners else None


def beam_pid() -> int | None:
    """RabbitMQ's Erlang VM (`pgrep -f beam.smp`), if exactly one is running."""
    out = subprocess.run(["pgrep", "-f", "beam.smp"], capture_output=True, text=True).stdout.split()
    return int(out[0]) if len(out) == 1 else None
