"""Memory and disk readings of this process: what the resource alarms (alarms.py) measure.

Linux first (/proc, the cgroup's memory limit), with portable fallbacks so a reading is never
missing, only less precise. The metrics and the management API report the same readings
(amqp_server/metrics/process_stats.py).
"""

from __future__ import annotations

import os
import resource
import shutil
from pathlib import Path

_CGROUP_MEMORY_FILES = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def resident_memory_bytes() -> int:
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        # ru_maxrss is the peak, in KiB on Linux: the best a non-Linux system offers cheaply.
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def total_memory_bytes() -> int:
    """Physical memory, or the cgroup's limit when a container sets a smaller one."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        physical = 0
    for path in _CGROUP_MEMORY_FILES:
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and (not physical or int(text) < physical):
            return int(text)
    return physical


def disk_free_bytes(data_dir: Path | str) -> int:
    path = Path(data_dir)
    while not path.exists() and path != path.parent:
        path = path.parent  # the data directory may not exist yet in unit tests
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return 0
