"""One AMQP connection as a sans-I/O object: bytes in, frames out (connection), its handshake,
connection.update-secret (secret_update) and publisher flow control (publisher_flow)."""
