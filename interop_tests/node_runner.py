"""Run the Node.js amqplib scenarios in interop_tests/node/ and hand back their JSON results.

The node dependencies are installed at most once per test session (`npm ci`
from the committed package-lock.json, skipped when node_modules already holds
the locked amqplib). A missing `node` or `npm` is a test failure, not a skip:
the project's test command installs them, so their absence is a broken setup.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

NODE_DIR = Path(__file__).parent / "node"
INSTALL_TIMEOUT_S = 300.0
SCRIPT_TIMEOUT_S = 30.0


def _locked_amqplib_version() -> str | None:
    lock_path = NODE_DIR / "package-lock.json"
    if not lock_path.exists():
        return None
    lock = json.loads(lock_path.read_text())
    return lock.get("packages", {}).get("node_modules/amqplib", {}).get("version")


def _installed_amqplib_version() -> str | None:
    manifest = NODE_DIR / "node_modules" / "amqplib" / "package.json"
    if not manifest.exists():
        return None
    return json.loads(manifest.read_text()).get("version")


@functools.cache
def ensure_node_modules() -> str:
    """Check node and npm exist and amqplib is installed; return the path of `node`."""
    node = shutil.which("node")
    npm = shutil.which("npm")
    if node is None or npm is None:
        missing = " and ".join(name for name, path in (("node", node), ("npm", npm)) if path is None)
        pytest.fail(
            f"{missing} not found on PATH: the amqplib interop tests need Node.js >= 16 and npm "
            f"(Debian: apt-get install -y nodejs npm), then `npm ci` in {NODE_DIR}",
            pytrace=False,
        )
    locked = _locked_amqplib_version()
    if locked is not None and _installed_amqplib_version() == locked:
        return node
    command = [npm, "ci" if locked is not None else "install", "--no-audit", "--no-fund"]
    try:
        result = subprocess.run(command, cwd=NODE_DIR, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`{' '.join(command)}` in {NODE_DIR} took over {INSTALL_TIMEOUT_S:.0f} s", pytrace=False)
    if result.returncode != 0 or _installed_amqplib_version() is None:
        pytest.fail(
            f"`{' '.join(command)}` in {NODE_DIR} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}",
            pytrace=False,
        )
    return node


def run_scenario(script: str, url: str, timeout: float = SCRIPT_TIMEOUT_S) -> dict[str, Any]:
    """Run `node <script> <url>` and return the JSON object it printed last.

    Fails the test when the script times out, exits non-zero, or reports ok=false.
    """
    node = ensure_node_modules()
    command = [node, str(NODE_DIR / script), url]
    try:
        result = subprocess.run(command, cwd=NODE_DIR, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{script} did not finish within {timeout:.0f} s\nstdout:\n{exc.stdout}\nstderr:\n{exc.stderr}")
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    try:
        report = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        pytest.fail(f"{script} printed no JSON result (exit {result.returncode})\n"
                    f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}")
    if result.returncode != 0 or not report.get("ok"):
        pytest.fail(f"{script} failed (exit {result.returncode}): {report.get('error')}\nstderr:\n{result.stderr}")
    return report
