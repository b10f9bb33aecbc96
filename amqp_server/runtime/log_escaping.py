"""Log lines a client cannot forge: what a client controls is written escaped.

User names, client product strings, queue, exchange and vhost names and reply texts reach the
broker's log lines. A name holding a newline would otherwise start a new, well-formed line of the
attacker's choosing ("... user 'admin' authenticated"), and control or bidirectional-override
characters can rewrite what a terminal shows. `EscapingFormatter` is installed where logging is
configured (`configure_logging`, below: the command and each worker call it), so every line is
covered without each call site remembering to escape:
the message text of every record has its unprintable characters written as Python escapes
(``\\n``, ``\\x1b``, ``\\u202e``). Tracebacks appended after the message keep their lines.
"""

from __future__ import annotations

import logging
import sys

# Every line (configure_logging): timestamp, level, logger name, message.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# The usual escapes, written as the two characters a reader of the log expects.
_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape_unprintable(text: str) -> str:
    """`text` with every character Python deems unprintable (control, format, line and paragraph
    separators, non-ASCII spaces) replaced by its escape; printable text is returned unchanged."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escape(char) for char in text)


def _escape(char: str) -> str:
    short = _SHORT_ESCAPES.get(char)
    if short is not None:
        return short
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


class EscapingFormatter(logging.Formatter):
    """A Formatter whose message text is one line of printable characters (see the module
    docstring); the exception and stack text that `format` appends are left as they are."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        # Formatter.format sets record.message afresh from msg % args before calling this.
        record.message = escape_unprintable(record.message)
        return super().formatMessage(record)


def configure_logging(level: str, node: str | None = None) -> None:
    """Log to stderr with timestamp, level and logger name at ``level`` ("info", ...), one line per
    record: what clients control is escaped (EscapingFormatter), so no client can forge a line.
    `node` names the worker process in every line, where several share one stderr."""
    handler = logging.StreamHandler(sys.stderr)
    log_format = LOG_FORMAT
    if node is not None:
        log_format = LOG_FORMAT.replace("%(name)s", "[" + node.replace("%", "%%") + "] %(name)s")
    handler.setFormatter(EscapingFormatter(log_format))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
