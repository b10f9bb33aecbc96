"""The wire: AMQP 0-9-1 frames and methods as bytes (codec), reply codes and texts (errors), the
connection and channel state tables (states), and a publish whose content arrives in parts
(content_assembly). The protocol header chooses the version a connection speaks (protocols):
0-9-1, or AMQP 0-8, whose differences amqp_0_8 translates so that the layers above see 0-9-1
methods. Nothing here knows a socket, a channel object or a queue."""
