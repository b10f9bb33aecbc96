#!/bin/bash
# The quiet side-by-side run of docs/benchmarks.md: `python -m bench --rounds 3` against this
# checkout's broker and a fresh RabbitMQ node (Debian's rabbitmq-server, plugins off), brokers
# taking turns. Run as root on a quiet machine (check `uptime`); it prints the commit, the time
# and the load before and after. RabbitMQ is started as in ../shared/reference/rabbitmq-local.md.
#   bash bench/side_by_side.sh [SCENARIO ...] [OPTION ...]   (default: all scenarios; options as
#                                                            python -m bench's, e.g. --rounds 1)
# SIDE_BY_SIDE_DIR, SIDE_BY_SIDE_OURS_PORT, SIDE_BY_SIDE_RABBIT_PORT and SIDE_BY_SIDE_NODE choose
# another scratch directory, ports and RabbitMQ node name (two runs side by side on one host).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
D=${SIDE_BY_SIDE_DIR:-/tmp/side-by-side}
OURS_PORT=${SIDE_BY_SIDE_OURS_PORT:-26601}
RABBIT_PORT=${SIDE_BY_SIDE_RABBIT_PORT:-5697}
NODE=${SIDE_BY_SIDE_NODE:-sbs}
rm -rf "$D"; mkdir -p "$D/rmq" "$D/ours"
echo '[].' > "$D/rmq/enabled_plugins"; chown -R rabbitmq "$D/rmq"
(cd /var/lib/rabbitmq && env HOME=/var/lib/rabbitmq RABBITMQ_NODENAME=$NODE RABBITMQ_NODE_PORT=$RABBIT_PORT \
  RABBITMQ_DIST_PORT=2$RABBIT_PORT RABBITMQ_MNESIA_BASE="$D/rmq/mnesia" RABBITMQ_LOG_BASE="$D/rmq/log" \
  RABBITMQ_ENABLED_PLUGINS_FILE="$D/rmq/enabled_plugins" \
  bash -c 'ulimit -n 20000; exec setpriv --reuid=rabbitmq --regid=rabbitmq --init-groups /usr/lib/rabbitmq/bin/rabbitmq-server -detached')
cd "$ROOT"
bash -c "ulimit -n 20000; exec python -m amqp_server --host 127.0.0.1 --port $OURS_PORT --data-dir $D/ours \
  --metrics-port 0 --management-port 0 --log-level warning" &
OURS=$!
trap 'kill $OURS 2>/dev/null; rabbitmqctl -n $NODE@$(hostname) stop >/dev/null 2>&1' EXIT
# Both ports answer before the first variant (rabbitmqctl await_startup alone has reported a
# booting node unreachable).
for port in $OURS_PORT $RABBIT_PORT; do
  for _ in $(seq 600); do (echo > /dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
done
echo "commit $(git rev-parse --short HEAD)"; date -u; uptime
# --stream-dir: where each keeps its streams, for the streams scenario's disk figures.
python -m bench --rounds 3 --markdown --json "$D/quiet.json" "$@" \
  --target ours=amqp://guest:guest@127.0.0.1:$OURS_PORT/ --target rabbitmq=amqp://guest:guest@127.0.0.1:$RABBIT_PORT/ \
  --stream-dir ours="$D/ours/streams" --stream-dir rabbitmq="$D/rmq/mnesia/$NODE@$(hostname)/stream"
date -u; uptime
