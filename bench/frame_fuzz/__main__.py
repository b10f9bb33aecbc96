"""python -m bench.frame_fuzz: see bench/frame_fuzz/__init__.py."""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
from pathlib import Path

from bench import frame_fuzz
from bench.frame_fuzz.run import CONCURRENCY, Fuzzer

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.frame_fuzz", description=frame_fuzz.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=1_000_000, help="stop after this many frames (default 1,000,000)")
    parser.add_argument("--duration", type=float, help="stop after this many seconds")
    parser.add_argument("--seed", type=int, default=None, help="replay a run (default: random)")
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY, help=f"parallel connections ({CONCURRENCY})")
    parser.add_argument("--only-connection", type=int, help="replay one connection of the seed's run")
    parser.add_argument("--port", type=int, help="fuzz a running broker on 127.0.0.1 (with --broker-pid, --broker-log)")
    parser.add_argument("--broker-pid", type=int)
    parser.add_argument("--broker-log", type=Path)
    parser.add_argument("--workdir", type=Path, help="keep the started broker's data and log here")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    print(f"frame fuzz: seed {seed}, replay with: python -m bench.frame_fuzz --seed {seed} --frames {args.frames}",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="frame-fuzz-") as scratch:
        broker = None
        if args.port is None:
            from interop_tests.broker_process import launch

            broker = launch(args.workdir or Path(scratch))
            host, port, pid, log_path = broker.host, broker.port, broker.process.pid, broker.log_path
        else:
            host, port, pid, log_path = "127.0.0.1", args.port, args.broker_pid, args.broker_log
        try:
            report = Fuzzer(host, port, pid, log_path, seed, args.frames, args.duration, args.concurrency,
                            args.only_connection).run()
        finally:
            if broker is not None:
                broker.stop()
        print(report.summary())
        problems = report.problems()
        for problem in problems:
            print(f"FAIL: {problem}")
        if problems:
            print(f"replay one connection: python -m bench.frame_fuzz --seed {seed} --only-connection K")
        print(f"load: {os.getloadavg()}")
        return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
