"""The order of system calls proves a stream's confirm follows its record's fsync: a kill -9
cannot (the page cache survives a killed process). bench/strace_confirm_order.py traces a broker
under strace and checks every confirm; with fsync turned off (the broken build), it must fail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def strace_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bench.strace_confirm_order", "--queue-type", "stream", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_each_stream_confirm_leaves_after_its_record_is_fsynced() -> None:
    result = strace_check("-n", "400", "--in-flight", "16")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "messages checked 400, violations 0, records not found 0" in result.stdout, result.stdout


def test_the_check_catches_a_broker_that_confirms_stream_records_without_fsync(tmp_path: Path) -> None:
    config = tmp_path / "no-fsync.toml"
    config.write_text('[storage]\nfsync = "never"\n')
    result = strace_check("-n", "200", "--in-flight", "16", "--config", str(config))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "violations 0," not in result.stdout, result.stdout
