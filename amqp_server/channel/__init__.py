"""One AMQP channel: the Channel state machine (channel), publisher confirms, ack/nack/reject
(settlement), transactions, consumer timeouts (delivery_timeouts), the unacked deliveries
(unacked_store), ordered replies, and the handlers of the basic, channel and confirm methods
(basic_methods) and of the exchange and queue classes (declarations). What settlement, the
consumer timeouts and the ordered replies need of the channel and its connection is in ports."""
