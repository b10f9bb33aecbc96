"""Federation: exchanges and queues of this broker that receive messages from other brokers.

RabbitMQ's rabbitmq_federation plugin, with its API, its names on the upstream and its headers,
so that either side of a link may be RabbitMQ (docs/shovel-federation.md):

- upstreams.py: the `federation-upstream` and `federation-upstream-set` runtime parameters,
  checked as RabbitMQ checks them, and which upstreams a policy gives an exchange or a queue;
- loops.py: the headers that keep a message (x-received-from) and a binding (x-bound-from)
  from going round a cycle of federated brokers, and max-hops;
- bindings.py: what an exchange link asks of its upstream as the federated exchange's
  bindings come and go;
- demand.py: when a federated queue wants messages from its upstream (consumer demand);
- status.py: a link's state, its error and its reconnects, as /api/federation-links shows them;
- links.py and federation.py: the links themselves, and the component that starts and stops
  them as policies, upstreams, exchanges and queues change.
"""
