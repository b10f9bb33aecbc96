"""Instructions per message of bench/broker_microbench.py's scenarios, counted by valgrind.

The count does not move with the machine's load, so two checkouts can be compared on a busy
machine: a 12,000-message run minus a 2,000-message run, divided by 10,000 (the difference
cancels the start-up). Usage:

    python -m bench.instruction_counts [--tree DIR] [SCENARIO ...]

`--tree` counts another checkout (say a `git worktree` of the commit before a change); the
default is this one. valgrind must run the interpreter itself, not a pyenv shim.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

SCENARIOS = ("publish-only", "pubsub-auto", "pubsub-manual", "pubsub-backlog", "confirms", "persistent", "fanout",
             "topic")
SMALL, LARGE = 2_000, 12_000


def instructions(tree: Path, scenario: str, messages: int) -> int:
    """Instructions valgrind counted for one run of `scenario` with `messages` messages."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "cachegrind.out"
        env = dict(os.environ, PYTHONHASHSEED="0", PYTHONPATH=str(tree))
        result = subprocess.run(
            ["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}", sys.executable,
             "-m", "bench.broker_microbench", "--messages", str(messages), "--rounds", "1", scenario],
            cwd=tree, env=env, capture_output=True, text=True, check=True,
        )
        match = re.search(r"I\s+refs:\s+([\d,]+)", result.stderr)
        if match is None:
            raise RuntimeError(f"valgrind printed no instruction count:\n{result.stderr[-2000:]}")
        return int(match.group(1).replace(",", ""))


def per_message(tree: Path, scenario: str) -> int:
    return round((instructions(tree, scenario, LARGE) - instructions(tree, scenario, SMALL)) / (LARGE - SMALL))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("scenarios", nargs="*", default=list(SCENARIOS))
    args = parser.parse_args()
    for scenario in args.scenarios:
        print(f"{scenario}\t{per_message(args.tree.resolve(), scenario)}", flush=True)


if __name__ == "__main__":
    main()
