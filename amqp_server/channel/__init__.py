"""One AMQP channel: the Channel state machine (channel), publisher confirms, ack/nack/reject
(settlement), transactions, consumer timeouts, the unacked deliveries (unacked_store), ordered
replies, and the handlers of the basic, channel and confirm methods (basic_methods) and of the
exchange and queue classes (declarations)."""
