#!/usr/bin/env bash
# Start or stop a local Spark standalone cluster (one master, one worker) from the pip-installed
# pyspark, to run the amqp-queue data source the way it runs on a real cluster.
#
#   scripts/spark-standalone.sh start [STATE_DIR]    prints the master URL once the worker registered
#   scripts/spark-standalone.sh stop  [STATE_DIR]    stops the two processes it started (by pid file)
#
# STATE_DIR (default ./spark-standalone) holds pid files, logs and the worker's work dir.
# Environment: SPARK_MASTER_PORT (7077), SPARK_MASTER_WEBUI_PORT (8080), SPARK_WORKER_WEBUI_PORT (8081),
# SPARK_WORKER_CORES (2), SPARK_WORKER_MEMORY (2g), PYTHON (python3 of the project's environment).
set -euo pipefail

action=${1:-}
state_dir=${2:-./spark-standalone}
python=${PYTHON:-python3}
master_port=${SPARK_MASTER_PORT:-7077}
master_ui=${SPARK_MASTER_WEBUI_PORT:-8080}
worker_ui=${SPARK_WORKER_WEBUI_PORT:-8081}
cores=${SPARK_WORKER_CORES:-2}
memory=${SPARK_WORKER_MEMORY:-2g}
export SPARK_LOCAL_IP=127.0.0.1

wait_for_line() {  # file, text, seconds
  local deadline=$((SECONDS + $3))
  until grep -q "$2" "$1" 2>/dev/null; do
    if ((SECONDS > deadline)); then
      echo "timed out waiting for '$2' in $1:" >&2
      tail -n 30 "$1" >&2 || true
      return 1
    fi
    sleep 0.2
  done
}

stop_one() {  # name
  local pid_file="$state_dir/$1.pid"
  if [[ -f $pid_file ]]; then
    local pid
    pid=$(cat "$pid_file")
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid"
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$pid_file"
  fi
}

case $action in
  start)
    spark_home=$("$python" -c 'from pyspark.find_spark_home import _find_spark_home; print(_find_spark_home())')
    mkdir -p "$state_dir/work"
    state_dir=$(cd "$state_dir" && pwd)
    url="spark://127.0.0.1:$master_port"
    # exec: the pid file holds the JVM's own pid, so stop kills exactly that process
    nohup bash -c "exec '$spark_home/bin/spark-class' org.apache.spark.deploy.master.Master \
      --host 127.0.0.1 --port $master_port --webui-port $master_ui" >"$state_dir/master.log" 2>&1 &
    echo $! >"$state_dir/master.pid"
    wait_for_line "$state_dir/master.log" "I have been elected leader" 60
    nohup bash -c "exec '$spark_home/bin/spark-class' org.apache.spark.deploy.worker.Worker $url \
      --host 127.0.0.1 --cores $cores --memory $memory --webui-port $worker_ui \
      --work-dir '$state_dir/work'" >"$state_dir/worker.log" 2>&1 &
    echo $! >"$state_dir/worker.pid"
    wait_for_line "$state_dir/worker.log" "Successfully registered with master" 60
    echo "$url"
    ;;
  stop)
    stop_one worker
    stop_one master
    ;;
  *)
    echo "usage: $0 start|stop [STATE_DIR]" >&2
    exit 2
    ;;
esac
