"""``python -m amqp_server``: the same as the ``amqp-server`` command."""

from amqp_server.cli import main

raise SystemExit(main())
