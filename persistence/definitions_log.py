"""The framing of a definitions change log (``definitions-<G>.log``, format 4; 2 and 3 are still read).

A log is a header line, then one record a line::

    amqp-server definitions log 4\\n
    <crc32 of the JSON, 8 lowercase hex digits> <JSON record, UTF-8>\\n

JSON escapes newlines inside strings, so a record never contains one. Reading
follows the segment files' rules (docs/queue-files.md §4): a last line without
its newline or with a bad CRC is a torn write and is cut (it was never
acknowledged: replies wait for the fsync that covers it); a damaged line
followed by good ones costs only that record, and is logged.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from persistence.definitions_codec import DefinitionsError

log = logging.getLogger(__name__)

# Format 3 logs may hold policy and limit records, which a format-2 reader would refuse as
# unknown kinds, and format 4 logs runtime parameter records, which a format-3 reader would
# refuse: the header tells it so before it reads any record.
LOG_FORMAT_VERSION = 4
LOG_HEADER = f"amqp-server definitions log {LOG_FORMAT_VERSION}\n".encode()
_READABLE_HEADERS = (LOG_HEADER, b"amqp-server definitions log 3\n", b"amqp-server definitions log 2\n")


def encode_record(text: str) -> bytes:
    """One log line for a record's JSON text."""
    data = text.encode("utf-8")
    return b"%08x " % zlib.crc32(data) + data + b"\n"


def read_log(path: Path) -> Iterator[Any]:
    """The parsed records of the log at ``path``, in order (see the module docstring)."""
    data = path.read_bytes()
    header = next((header for header in _READABLE_HEADERS if data.startswith(header)), None)
    if header is None:
        if any(header.startswith(data) for header in _READABLE_HEADERS):
            return  # torn while its header was written: it holds nothing
        first_line = data.split(b"\n", 1)[0][:80]
        raise DefinitionsError(
            f"{path}: not a definitions log of format {LOG_FORMAT_VERSION} (it starts with {first_line!r}); "
            "it was probably written by a newer amqp-server"
        )
    lines = data[len(header):].split(b"\n")
    torn = lines.pop()  # after the last newline: empty unless the last write was torn
    if torn:
        log.warning("%s: cutting a torn last record (%d bytes, never acknowledged)", path, len(torn))
    for number, line in enumerate(lines, start=2):
        record = _parse(line)
        if record is not None:
            yield record
        elif number - 1 == len(lines) and not torn:
            log.warning("%s: cutting a torn last record at line %d (%d bytes)", path, number, len(line))
        else:
            log.error("%s: skipping damaged record at line %d (%d bytes): bad CRC or JSON", path, number, len(line))


def _parse(line: bytes) -> Any:
    if len(line) < 10 or line[8:9] != b" ":
        return None
    body = line[9:]
    try:
        if int(line[:8], 16) != zlib.crc32(body):
            return None
        return json.loads(body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None
