"""The management HTTP API (RabbitMQ's /api/...), served with aiohttp on the broker's loop.

app.py builds the application; one *_routes module per kind of object; *_json modules give
RabbitMQ's JSON shapes; caller.py is authentication and the user tags' rights.
docs/management-api.md is the user-facing reference.
"""
