"""Benchmark suite: any AMQP broker (this project's, RabbitMQ) measured side by side in one run.

Run `python -m bench --help`. See docs/benchmarks.md for scenarios and results.
"""
