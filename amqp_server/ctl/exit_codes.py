"""Exit codes, as rabbitmqctl's (BSD sysexits.h), and the error that carries one."""

from __future__ import annotations

EX_OK = 0
EX_USAGE = 64  # bad command line: unknown command, column or option
EX_DATAERR = 65  # the input is wrong: e.g. deleting a vhost that does not exist
EX_NOUSER = 67  # the user named does not exist
EX_UNAVAILABLE = 69  # the broker cannot be reached, or what was named is not there
EX_SOFTWARE = 70  # the broker refused the operation
EX_NOPERM = 77  # the credentials were refused


class CtlError(Exception):
    """Ends the command: `message` goes to stderr after "Error:", the process exits with `code`."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ArgumentError(CtlError):
    """A command's argument is invalid: printed as rabbitmqctl's "Error (argument validation):
    Bad argument..." with the arguments given, exit code 65 (64 for an invalid option)."""

    def __init__(self, message: str, code: int = EX_DATAERR) -> None:
        super().__init__(code, message)
