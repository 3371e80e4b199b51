#!/usr/bin/env bash
# `make run`: start meterd in dev mode, replay demo traffic through the API
# and GPU samples through gpu-agent, print usage, latency, goodput and cost
# tables from the API, then keep meterd running until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-$PWD/data}
HTTP=${METER_HTTP_ADDR:-127.0.0.1:8080}
EVENTS=${DEMO_EVENTS:-20000}
export PATH="$PATH:/usr/sbin"

if ! command -v clickhouse-server >/dev/null 2>&1; then
  echo "ClickHouse server not found; installing it with apt-get ..."
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y clickhouse-server clickhouse-client
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo apt-get update && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y clickhouse-server clickhouse-client
  else
    echo "Cannot install ClickHouse here. Install it (Debian/Ubuntu: apt-get install -y clickhouse-server clickhouse-client)," >&2
    echo "or point meterd at your own server: bin/meterd --dev --data-dir $DATA --clickhouse HOST:9000" >&2
    exit 1
  fi
fi

KAFKA=${METER_KAFKA_BROKERS:-127.0.0.1:9092}
bin/meterd --dev --data-dir "$DATA" --http-addr "$HTTP" --kafka-brokers "$KAFKA" --rollup-interval 2s \
  --prices deploy/prices.example.json 2>"$DATA.log" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; exit 0' INT TERM
trap 'kill -TERM $pid 2>/dev/null || true' EXIT

host=${HTTP%:*}; port=${HTTP##*:}
for _ in $(seq 1 120); do
  if (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; then break; fi
  if ! kill -0 $pid 2>/dev/null; then echo "meterd exited; see $DATA.log" >&2; tail -20 "$DATA.log" >&2; exit 1; fi
  sleep 0.5
done

echo
echo "== replaying $EVENTS synthetic events through POST /v1/events"
bin/meterctl replay --addr "http://$HTTP" --key "$(cat "$DATA/keys/ingest.key")" --synthetic "$EVENTS" --duration 24h
sleep 2 # one ingest batch interval, so the last events are queryable
echo
echo "== usage of the last 24 hours, from GET /v1/usage"
bin/meterctl usage --addr "http://$HTTP" --key "$(cat "$DATA/keys/finance.key")" --group-by tenant_id,model
sleep 8 # the rollup role recomputes changed hours every 2 s here (10 s by default)
echo
echo "== latency by model over the last 24 hours, from GET /v1/latency (rollups)"
bin/meterctl latency --addr "http://$HTTP" --key "$(cat "$DATA/keys/finance.key")" --group-by model --metric ttft,e2e
echo
echo "== goodput by model, from GET /v1/goodput"
bin/meterctl goodput --addr "http://$HTTP" --key "$(cat "$DATA/keys/finance.key")" --group-by model
echo
echo "== GPU samples of the demo fleet (60 s, last 24 h) through gpu-agent --source replay → $KAFKA"
bin/meterctl gpu-samples --duration 24h --out "$DATA/gpu-demo.jsonl"
bin/gpu-agent --source replay --file "$DATA/gpu-demo.jsonl" --interval 1ms --kafka-brokers "$KAFKA" \
  --http-addr "" --log-level warn
sleep 8 # ingest, then the rollup role costs the hours
echo
echo "== GPU usage and cost by deployment, from GET /v1/gpu-usage"
bin/meterctl gpu-usage --addr "http://$HTTP" --key "$(cat "$DATA/keys/finance.key")" --group-by deployment \
  --start "$(date -u -d '-24 hours' +%Y-%m-%dT%H:00:00Z)" --end "$(date -u -d '+1 hour' +%Y-%m-%dT%H:00:00Z)"
echo
echo "== GPU cost allocated to tenants (tokens policy, idle kept apart), from GET /v1/cost"
bin/meterctl cost --addr "http://$HTTP" --key "$(cat "$DATA/keys/finance.key")" --group-by tenant_id \
  --start "$(date -u -d '-24 hours' +%Y-%m-%dT%H:00:00Z)" --end "$(date -u -d '+1 hour' +%Y-%m-%dT%H:00:00Z)"
echo
echo "meterd keeps running (logs in $DATA.log); try the keys above with meterctl or curl. Ctrl-C stops it."
wait $pid
