"""Every delay a message can be given before it is routed or ready, in one place.

- delayed_exchange.py: an x-delayed-message exchange (the rabbitmq-delayed-message-exchange
  plugin's) holds a message with a positive `x-delay` header until it is due, then routes it
  through the exchange's bindings. The exchange type, which only routes like its
  `x-delayed-type`, is exchanges/delayed.py.
- delayed_retry.py: a message that comes back to its queue (reject or nack with requeue, a
  consumer that went away) waits `x-delayed-retry-*` before it is ready again, linear or
  exponential in its delivery count.
- retry_lanes.py: how the messages waiting for a retry are kept, about 28 bytes each.

Both kinds of held message are journaled as `waiting_retry` with their due time (the delayed
exchange in a store of its own), so they survive a restart; both are driven by the broker's
timer heap (queues/timers.py). docs/lifecycle.md.
"""
