"""The ``amqp-server`` command: read the configuration, set up logging, run the broker.

Exit codes: 2 for an invalid configuration (message on stderr), otherwise
whatever ``run_server`` returns once SIGINT/SIGTERM stops it. ``amqp-server ctl ...``
runs the management CLI instead (amqp_server/ctl) and exits with its code.
"""

from __future__ import annotations

import logging
import sys
from typing import Sequence

from amqp_server.config.settings import ConfigError, load_config
from amqp_server.runtime.log_escaping import configure_logging


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["ctl"]:
        # "amqp-server ctl ...": manage a running broker (amqp_server/ctl), not run one.
        from amqp_server.ctl.main import main as ctl_main

        return ctl_main(args[1:])
    try:
        config = load_config(args)
    except ConfigError as err:
        print(f"amqp-server: configuration error: {err}", file=sys.stderr)
        return 2
    configure_logging(config.log_level)
    if config.workers > 1:
        # The parent of N node processes (amqp_server/runtime/workers.py), serving no client itself.
        from amqp_server.runtime.workers import supervise

        return supervise(config, args)
    logging.getLogger(__name__).info(
        "starting on %s:%d, data dir %s%s",
        config.host,
        config.port,
        config.data_dir,
        f", config file {config.config_file}" if config.config_file else "",
    )
    # Imported here so the configuration and CLI stay testable without the network side.
    from amqp_server.runtime.server import run_server

    return run_server(config)
