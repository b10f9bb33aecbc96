"""The product packages pass mypy, with pyproject.toml's [tool.mypy] section (strict on the
core's lower layers). A test, so the README's test command and CI type-check the code too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(600)  # a cold cache (a fresh clone) takes the longest: about 10 s here
def test_mypy_passes_on_the_product_packages() -> None:
    # The packages to check are the config's `files`; the cache goes to .mypy_cache (ignored by git).
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert result.returncode == 0, f"mypy found errors:\n{result.stdout}{result.stderr}"
