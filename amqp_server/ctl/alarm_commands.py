"""`set_vm_memory_high_watermark` and `set_disk_free_limit`, as rabbitmqctl's: the same
arguments, progress lines and argument errors. They use this broker's own API routes
(/api/amqp-server/..., see amqp_server/management/alarm_routes.py); like rabbitmqctl's, the
change lasts until the broker restarts.

    set_vm_memory_high_watermark <fraction>          0.0 to 1.0 of total memory
    set_vm_memory_high_watermark absolute <value>    bytes, or with units: 1GB, 512MiB, 2G
    set_disk_free_limit <disk_limit>                 bytes, or with units: 50MB, 1GiB
    set_disk_free_limit mem_relative <fraction>      times total memory (1.5 is common)
"""

from __future__ import annotations

import math
import re
from typing import Any

from amqp_server.ctl.admin_commands import Session, _call
from amqp_server.ctl.api_client import ApiError
from amqp_server.ctl.exit_codes import EX_OK, EX_SOFTWARE, EX_USAGE, ArgumentError, CtlError

ALARMS_PATH = "/api/amqp-server/alarms"
MEMORY_PATH = "/api/amqp-server/vm-memory-high-watermark"
DISK_PATH = "/api/amqp-server/disk-free-limit"
# rabbitmqctl checks the shape (digits, then letters) itself and leaves the units to the node.
_BYTES_WITH_UNIT = re.compile(r"\d+[A-Za-z]*")


def _fraction(text: str, high: float | None) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ArgumentError("Bad argument.") from None
    if not math.isfinite(value) or value < 0 or (high is not None and value > high):
        if high is None:
            raise ArgumentError("Bad argument.")
        raise ArgumentError("Bad argument: The threshold should be a fraction between 0.0 and 1.0")
    return value


def _byte_count(text: str) -> int | str:
    """An integer, or the text with its unit for the broker to read (it knows the units)."""
    if not _BYTES_WITH_UNIT.fullmatch(text):
        raise ArgumentError("Bad argument.")
    return int(text) if text.isdigit() else text


def _node(session: Session) -> str:
    node: str = _call(lambda: session.client.get(ALARMS_PATH))["node"]  # (JSON: Any)
    return node


def _put(session: Session, path: str, body: dict[str, Any]) -> None:
    try:
        session.client.put(path, body)
    except ApiError as error:
        if error.status == 400:  # e.g. units the broker does not know
            raise ArgumentError(f"Bad argument: {error.reason}") from None
        raise CtlError(EX_SOFTWARE, error.reason or error.error) from None


def set_vm_memory_high_watermark(session: Session, *arguments: str) -> int:
    if len(arguments) == 1:
        fraction = _fraction(arguments[0], high=1.0)
        session.info(f"Setting memory threshold on {_node(session)} to {arguments[0]} ...")
        _put(session, MEMORY_PATH, {"relative": fraction})
    elif len(arguments) == 2 and arguments[0] == "absolute":
        limit = _byte_count(arguments[1])
        session.info(f"Setting memory threshold on {_node(session)} to {arguments[1]} bytes ...")
        _put(session, MEMORY_PATH, {"absolute": limit})
    else:
        raise CtlError(EX_USAGE, "usage: set_vm_memory_high_watermark <fraction> | absolute <value>")
    return EX_OK


def set_disk_free_limit(session: Session, *arguments: str) -> int:
    if len(arguments) == 1:
        limit = _byte_count(arguments[0])
        session.info(f"Setting disk free limit on {_node(session)} to {arguments[0]} bytes ...")
        _put(session, DISK_PATH, {"absolute": limit})
    elif len(arguments) == 2 and arguments[0] == "mem_relative":
        fraction = _fraction(arguments[1], high=None)
        session.info(f"Setting disk free limit on {_node(session)} to {arguments[1]} times the total RAM ...")
        _put(session, DISK_PATH, {"relative": fraction})
    else:
        raise CtlError(EX_USAGE, "usage: set_disk_free_limit <disk_limit> | mem_relative <fraction>")
    return EX_OK
