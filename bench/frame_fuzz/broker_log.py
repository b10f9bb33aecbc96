"""What in the broker's log is a failure, grouped by where in the broker it happened."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# A log entry (a line and whatever follows it up to the next timestamp) is a failure when it
# holds "internal error" (`log.exception` in AMQPProtocol.data_received writes "internal error
# on connection ...") or a traceback (an exception that reached a task or the event loop), or is
# CRITICAL. Plain ERROR lines are not: RabbitMQ logs a client's bad protocol header as an error.
LOG_ENTRY_START = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", re.MULTILINE)
LOG_FAILURE = re.compile(r"internal error on|^Traceback |^\S+ \S+ CRITICAL |^Exception in callback|exception was never retrieved",
                         re.MULTILINE)
# Findings of issue 10 that others fix on their own branches. Until a fix reaches main the
# fuzzer names each one it meets (a marker in its traceback) instead of calling it unexplained;
# an entry is removed here when its fix lands, so the bar only goes up. Empty: the undecodable
# content headers (branch input) were the last.
KNOWN_FINDINGS: dict[str, str] = {}

_OUR_FRAME = re.compile(r'File "[^"]*/((?:amqp_server|queues|exchanges|persistence)/[\w/]+\.py)", line \d+, in (\w+)')
_PEER = re.compile(r"127\.0\.0\.1:(\d+)")


@dataclass
class LogFailure:
    """One kind of failure in the broker log: the broker's frames of its traceback (or its
    first line), how often it happened, and which fuzzing connections it happened on."""

    signature: str
    example: str
    count: int = 0
    ports: list[int] = field(default_factory=list)
    known: str | None = None


def log_failures(text: str) -> list[LogFailure]:
    """The failure entries of a broker log, grouped by signature (see LOG_FAILURE)."""
    starts = [match.start() for match in LOG_ENTRY_START.finditer(text)] or [0]
    if starts[0] != 0:
        starts.insert(0, 0)
    kinds: dict[str, LogFailure] = {}
    for begin, end in zip(starts, starts[1:] + [len(text)]):
        entry = text[begin:end].strip()
        if not LOG_FAILURE.search(entry):
            continue
        ours = " <- ".join(f"{path}:{function}" for path, function in reversed(_OUR_FRAME.findall(entry)))
        if ours:
            signature = f"{entry.splitlines()[-1].split(':')[0]} at {ours}"
        else:
            signature = re.sub(r"\d+", "N", entry.splitlines()[0][24:])
        kind = kinds.setdefault(signature, LogFailure(signature, entry))
        kind.count += 1
        if len(kind.ports) < 10:  # enough connections to replay
            kind.ports += [int(port) for port in _PEER.findall(entry.splitlines()[0])]
        kind.known = next((name for marker, name in KNOWN_FINDINGS.items() if marker in entry), None)
    return list(kinds.values())
