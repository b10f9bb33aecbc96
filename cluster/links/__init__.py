"""The cluster plug-in's links between nodes: one link per peer (link, node_links), their frames,
publishes forwarded to queues another node owns (forwarded), the queue that stands for a remote
one (remote_queue) and transactions across nodes (transactions)."""
