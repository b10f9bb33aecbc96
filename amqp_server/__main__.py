"""``python -m amqp_server``: the same as the ``amqp-server`` command."""

from amqp_server.runtime.cli import main

raise SystemExit(main())
