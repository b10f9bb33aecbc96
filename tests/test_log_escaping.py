"""The log formatter writes what a client controls on one line, escaped, and keeps tracebacks readable."""

from __future__ import annotations

import logging
import sys

from amqp_server.runtime.log_escaping import EscapingFormatter, escape_unprintable


def record(msg: str, *args: object, exc_info: object = None) -> logging.LogRecord:
    return logging.LogRecord("amqp_server.connection.connection", logging.WARNING, __file__, 1, msg, args, exc_info)


def test_control_format_and_separator_characters_are_escaped_and_printable_text_is_kept():
    assert escape_unprintable("queue 'é ü 日本'") == "queue 'é ü 日本'"
    assert escape_unprintable("a\nb\rc\td\x00e\x1bf\x7f") == "a\\nb\\rc\\td\\x00e\\x1bf\\x7f"
    assert escape_unprintable("x\u2028y\u202ez\U000e0001") == "x\\u2028y\\u202ez\\U000e0001"


def test_arguments_are_escaped_in_the_formatted_line():
    formatter = EscapingFormatter("%(levelname)s %(message)s")
    line = formatter.format(record("login refused for user '%s'", "bob\nINFO forged"))
    assert line == "WARNING login refused for user 'bob\\nINFO forged'"


def test_a_traceback_keeps_its_lines():
    formatter = EscapingFormatter("%(message)s")
    try:
        raise ValueError("boom")
    except ValueError:
        line = formatter.format(record("internal error for '%s'", "a\nb", exc_info=sys.exc_info()))
    first, *rest = line.splitlines()
    assert first == "internal error for 'a\\nb'"
    assert rest[0] == "Traceback (most recent call last):" and rest[-1] == "ValueError: boom"
