"""amqp_server."""
