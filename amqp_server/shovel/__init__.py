"""Shovels: move messages from a queue (or an exchange) of one broker to another, as RabbitMQ's
shovel plugin does; dynamic ones are the runtime parameters of component "shovel"
(docs/shovel-federation.md)."""
