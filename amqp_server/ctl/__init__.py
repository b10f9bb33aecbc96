"""`amqp-server ctl`: rabbitmqctl's everyday commands for a running broker.

It talks to the broker's management HTTP API (amqp_server.management, port 15672 by default),
so it works from any machine that can reach that port, with the broker's users. Listings print
rabbitmqctl's tab-separated columns. docs/operations.md has the command reference.
"""
