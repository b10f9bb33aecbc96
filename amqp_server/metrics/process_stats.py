"""What the operating system says about this broker process: memory, file descriptors, disk.

Read on demand (a scrape, a management request), never on the message path. Linux first
(/proc), with portable fallbacks so the numbers are never missing, only less precise. Memory and
free disk are the readings the resource alarms measure (amqp_server/broker/resource_readings.py).
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

from amqp_server.broker.resource_readings import disk_free_bytes, resident_memory_bytes, total_memory_bytes

# RabbitMQ's defaults: vm_memory_high_watermark.relative = 0.4 of the memory available to the
# node, and disk_free_limit.absolute = 50 MB (the broker's own limits replace them, see
# broker_view.process_stats_of).
DEFAULT_MEMORY_HIGH_WATERMARK = 0.4
DEFAULT_DISK_FREE_LIMIT_BYTES = 50_000_000
# RabbitMQ reserves part of the fd limit for files; it reports about 90% as usable for sockets.
SOCKET_SHARE_OF_FDS = 0.9

# The broker imports this module while starting, so this is (close to) the process start.
_STARTED_AT = time.monotonic()


@dataclass(frozen=True)
class ProcessStats:
    resident_memory_bytes: int
    memory_limit_bytes: int
    open_fds: int
    max_fds: int
    disk_free_bytes: int
    disk_free_limit_bytes: int
    total_memory_bytes: int
    # Whether the alarms are in effect (the broker's ResourceAlarms when it has them).
    memory_alarm: bool = False
    disk_alarm: bool = False

    @property
    def max_tcp_sockets(self) -> int:
        return int(self.max_fds * SOCKET_SHARE_OF_FDS)


def sample_process_stats(
    data_dir: Path | str,
    memory_high_watermark: float = DEFAULT_MEMORY_HIGH_WATERMARK,
    disk_free_limit_bytes: int = DEFAULT_DISK_FREE_LIMIT_BYTES,
) -> ProcessStats:
    """Current figures for this process; `data_dir` is where disk space is measured."""
    total = total_memory_bytes()
    resident = resident_memory_bytes()
    memory_limit = int(total * memory_high_watermark)
    disk_free = disk_free_bytes(data_dir)
    return ProcessStats(
        resident_memory_bytes=resident,
        memory_limit_bytes=memory_limit,
        open_fds=open_fd_count(),
        max_fds=max_fd_count(),
        disk_free_bytes=disk_free,
        disk_free_limit_bytes=disk_free_limit_bytes,
        total_memory_bytes=total,
        memory_alarm=resident > memory_limit,
        disk_alarm=disk_free < disk_free_limit_bytes,
    )


def uptime_seconds() -> float:
    return time.monotonic() - _STARTED_AT


def open_fd_count() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def max_fd_count() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20
