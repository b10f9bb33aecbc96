"""The wire: AMQP 0-9-1 frames and methods as bytes (codec), reply codes and texts (errors), the
connection and channel state tables (states), and a publish whose content arrives in parts
(content_assembly). Nothing here knows a socket, a channel object or a queue."""
