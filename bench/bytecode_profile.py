"""Where a broker_microbench scenario spends its Python: bytecodes executed per message, by
function (and optionally by line), counted with sys.settrace's opcode events.

    PYTHONPATH=CHECKOUT python -m bench.bytecode_profile SCENARIO [--top 30] [--lines 20]

A count, not a time: it does not move with the machine's load, so two checkouts compare
exactly (a C call counts as one bytecode, so read it beside the valgrind instruction counts
of docs/benchmarks.md, "Hot path, issue 14"). The scenario runs twice, with 1,000 and 3,000
messages, and the difference divided by 2,000 is what one message costs, setup left out.
The harness's own functions (bench/) are left out too.
"""

from __future__ import annotations

import argparse
import collections
import sys
from types import FrameType
from typing import Any

from bench.broker_microbench import SCENARIOS


def _counts(scenario: str, messages: int) -> tuple[collections.Counter, collections.Counter]:
    """Bytecodes run per function ("package/file.py:name") and per (function, line)."""
    functions: collections.Counter = collections.Counter()
    lines: collections.Counter = collections.Counter()

    def on_call(frame: FrameType, _event: str, _arg: Any) -> Any:
        frame.f_trace_opcodes = True
        code = frame.f_code
        key = "/".join(code.co_filename.split("/")[-2:]) + ":" + code.co_name

        def on_event(frame: FrameType, event: str, _arg: Any) -> Any:
            if event == "opcode":
                functions[key] += 1
                lines[(key, frame.f_lineno)] += 1
            return on_event

        return on_event

    sys.settrace(on_call)
    try:
        SCENARIOS[scenario](messages)
    finally:
        sys.settrace(None)
    return functions, lines


def _per_message(small: collections.Counter, large: collections.Counter, messages: int) -> dict:
    """What `messages` more messages added, per message; the harness's own code left out."""
    def function(key: Any) -> str:
        return key[0] if isinstance(key, tuple) else key

    return {key: (large[key] - small.get(key, 0)) / messages for key in large
            if not function(key).startswith("bench/")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", choices=list(SCENARIOS))
    parser.add_argument("--top", type=int, default=30, help="functions to list")
    parser.add_argument("--lines", type=int, default=0, help="lines to list too")
    args = parser.parse_args()
    functions_1k, lines_1k = _counts(args.scenario, 1000)
    functions_3k, lines_3k = _counts(args.scenario, 3000)
    functions = {key: value for key, value in _per_message(functions_1k, functions_3k, 2000).items() if value >= 0.05}
    print(f"{args.scenario}: {sum(functions.values()):,.0f} bytecodes per message")
    for key, value in sorted(functions.items(), key=lambda item: -item[1])[: args.top]:
        print(f"{value:8.1f}  {key}")
    if args.lines:
        lines = _per_message(lines_1k, lines_3k, 2000)
        print()
        for (key, line), value in sorted(lines.items(), key=lambda item: -item[1])[: args.lines]:
            print(f"{value:8.1f}  {key}:{line}")


if __name__ == "__main__":
    main()
