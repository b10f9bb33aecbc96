"""Prometheus metrics under RabbitMQ's names (rabbitmq_prometheus), read at scrape time.

The broker keeps plain integer counters (amqp_server.broker.stats, queues.queue.QueueStats);
the collectors here turn them, and the live objects, into metric families when Prometheus
scrapes. docs/metrics.md lists every metric and where its value comes from.
"""
