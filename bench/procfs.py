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


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time `pid` has used so far (all threads)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / _CLOCK_TICKS


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
    """The pid owning a listening TCP socket on `port` (needs permission to read other processes' fds)."""
    wanted = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    if not wanted:
        return None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in wanted:
                    return int(entry.name)
        except OSError:
            continue
    return None


def beam_pid() -> int | None:
    """RabbitMQ's Erlang VM (`pgrep -f beam.smp`), if exactly one is running."""
    out = subprocess.run(["pgrep", "-f", "beam.smp"], capture_output=True, text=True).stdout.split()
    return int(out[0]) if len(out) == 1 else None
