"""`--definitions FILE` ([definitions] load_file): import a RabbitMQ definitions file at startup.

As RabbitMQ's load_definitions: the file is imported at every start, on top of what the broker
restored, through the same import as POST /api/definitions (management/definitions_import.py),
so importing it again changes nothing. A file that cannot be read or that the import refuses
stops the broker from starting, naming the file and the reason; definitions this broker cannot
honour are named in one log line and the rest is imported.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from amqp_server.management.api_errors import ApiError
from amqp_server.management.definitions_import import import_definitions

if TYPE_CHECKING:
    from amqp_server.broker.broker import Broker

log = logging.getLogger(__name__)


class DefinitionsFileRefused(Exception):
    """The definitions file could not be read or was refused; the message says which and why."""


def load_definitions_file(broker: "Broker", path: Path) -> None:
    try:
        document = json.loads(path.read_bytes())
    except OSError as error:
        raise DefinitionsFileRefused(f"definitions file {path} cannot be read: {error.strerror}") from None
    except ValueError as error:
        raise DefinitionsFileRefused(f"definitions file {path} is not valid JSON: {error}") from None
    try:
        not_applied = import_definitions(broker, document)
    except ApiError as error:
        raise DefinitionsFileRefused(f"definitions file {path} was refused: {error.reason}") from None
    log.info("imported definitions from %s%s", path,
             f" ({len(not_applied)} not applied, listed above)" if not_applied else "")
