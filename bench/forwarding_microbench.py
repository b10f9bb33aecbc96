"""What forwarding costs in CPU: two cluster nodes in this one process, linked as cluster nodes
are (loopback TCP, the cluster secret), without a coordination service.

Node a owns queue q; node b holds its stand-in. A lean client publishes COUNT messages (100-byte
bodies, no confirms) to q through b, or straight to a; then consumes them through b, or from a,
with prefetch 100 and `multiple` acks. Everything (both nodes and the client) runs on one core,
so the process CPU time per message is what the message cost the cluster, whatever else the
machine is doing; the wall-clock rate is printed too, but on a shared machine only the CPU
figure means much.

    python bench/forwarding_microbench.py [--count 100000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from amqp_server.broker.broker import Broker
from cluster.links.node_links import ClusterLinks
from amqp_server.config.settings import ServerConfig
from amqp_server.runtime.server import AMQPServer
from bench.lean_client import LeanConnection
from queues.message import Message, content_header

SECRET = "forwarding-microbench-secret"


async def _node(data_dir: Path) -> tuple[Broker, AMQPServer]:
    broker = Broker(ServerConfig(), message_dir=data_dir)
    broker.access.admit_cluster_links(SECRET)
    server = AMQPServer(broker, "127.0.0.1", 0)
    await server.start()
    return broker, server


async def _measure(data_dir: Path, count: int, through_b: bool) -> dict[str, float]:
    a, a_server = await _node(data_dir / "a")
    b, b_server = await _node(data_dir / "b")
    links = ClusterLinks(SECRET, lambda: {"a": f"127.0.0.1:{a_server.port}"})
    queue, _ = a.vhosts["/"].declare_queue("q", connection=None)
    if through_b:
        b.vhosts["/"].adopt_remote_queue(links.remote_queue("/", "q", owner="a", durable=False, timers=b.timers))
    b.cluster_links = links  # what joining a cluster sets (cluster/node.py)
    url = f"amqp://guest:guest@127.0.0.1:{(b_server if through_b else a_server).port}/"
    figures: dict[str, float] = {}
    try:
        conn = await LeanConnection.open(url)
        chan = await conn.channel()
        frames = chan.publish_frames("", "q", b"x" * 100)
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(count // 100):
            conn.write(frames * 100)
            await conn.drain()
        while queue.message_count < count:
            await asyncio.sleep(0.001)
        figures["publish us/msg CPU"] = (time.process_time() - cpu) / count * 1e6
        figures["publish msg/s"] = count / (time.perf_counter() - wall)
        await conn.close()

        conn = await LeanConnection.open(url)
        chan = await conn.channel(prefetch=100)
        done = asyncio.get_running_loop().create_future()
        received = [0]

        def on_message(tag: int, body: bytes) -> None:
            received[0] += 1
            if received[0] == count and not done.done():
                done.set_result(None)

        wall, cpu = time.perf_counter(), time.process_time()
        await chan.basic_consume("q", on_message)
        await done
        figures["consume us/msg CPU"] = (time.process_time() - cpu) / count * 1e6
        figures["consume msg/s"] = count / (time.perf_counter() - wall)
        await conn.close()
    finally:
        links.close()
        for broker, server in ((b, b_server), (a, a_server)):
            await server.stop()
            await broker.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, dict[str, list[float]]] = {"all on a": {}, "through b": {}}
    for _ in range(args.rounds):
        for label, through_b in (("all on a", False), ("through b", True)):
            with tempfile.TemporaryDirectory() as tmp:
                for key, value in asyncio.run(_measure(Path(tmp), args.count, through_b)).items():
                    results[label].setdefault(key, []).append(value)
    print(f"median of {args.rounds} rounds, {args.count} messages of 100 bytes")
    print(f"{'':12} {'publish CPU us/msg':>19} {'publish msg/s':>14} {'consume CPU us/msg':>19} {'consume msg/s':>14}")
    for label, figures in results.items():
        row = [statistics.median(figures[key]) for key in
               ("publish us/msg CPU", "publish msg/s", "consume us/msg CPU", "consume msg/s")]
        print(f"{label:12} {row[0]:19.1f} {row[1]:14,.0f} {row[2]:19.1f} {row[3]:14,.0f}")


if __name__ == "__main__":
    main()
