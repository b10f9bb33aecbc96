"""Links to other brokers by AMQP URI, shared by shovels and federation: URIs (uri.py), the
client connection (client.py), and a connection that reconnects with a delay and counts its
reconnects (reconnecting.py)."""
