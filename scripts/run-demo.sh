#!/usr/bin/env bash
# `make run`: start meterd in dev mode, replay demo traffic through the API
# and GPU samples through gpu-agent, print usage, latency, goodput and cost
# tables from the API, then keep meterd running until Ctrl-C.
#
# Settings (environment): DATA (data directory, default ./data),
# METER_HTTP_ADDR (127.0.0.1:8080), METER_GRPC_ADDR (127.0.0.1:9090),
# METER_KAFKA_BROKERS (the dev broker, 127.0.0.1:9092), DEMO_EVENTS (20000),
# DEMO_WAIT (how long to wait for ingest and rollups, 3m), BIN (the binaries, bin).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-$PWD/data}
HTTP=${METER_HTTP_ADDR:-127.0.0.1:8080}
GRPC=${METER_GRPC_ADDR:-127.0.0.1:9090}
KAFKA=${METER_KAFKA_BROKERS:-127.0.0.1:9092}
EVENTS=${DEMO_EVENTS:-20000}
WAIT=${DEMO_WAIT:-3m}
BIN=${BIN:-bin} # where make build put the binaries
export PATH="$PATH:/usr/sbin"

# Refuse to start when a port is taken: a request to another program
# answers nonsense ("no API key"), not an error naming the port.
for pair in "METER_HTTP_ADDR=$HTTP" "METER_GRPC_ADDR=$GRPC" "METER_KAFKA_BROKERS=$KAFKA"; do
  var=${pair%%=*}; addr=${pair#*=}; h=${addr%:*}; p=${addr##*:}
  if (exec 3<>"/dev/tcp/$h/$p") 2>/dev/null; then
    echo "make run: port $p ($addr, $var) is taken by another program." >&2
    echo "  Stop that program, or choose another address, for example: $var=$h:$((p + 1)) make run" >&2
    exit 1
  fi
done

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

if [ -d "$DATA/keys" ]; then
  echo "note: $DATA holds the events of earlier runs; this run adds $EVENTS more, so the totals and the"
  echo "      cost per token below count both. Remove $DATA (rm -rf $DATA) to start from nothing."
fi
# The previous run's log is kept as $DATA.log.1.
[ -f "$DATA.log" ] && mv -f "$DATA.log" "$DATA.log.1"
mkdir -p "$DATA"
"$BIN"/meterd --dev --data-dir "$DATA" --http-addr "$HTTP" --grpc-addr "$GRPC" --kafka-brokers "$KAFKA" --rollup-interval 2s \
  --prices deploy/prices.example.json 2>"$DATA.log" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; exit 0' INT TERM
trap 'kill -TERM $pid 2>/dev/null || true' EXIT

# Wait until meterd is ready (its ClickHouse answers, the schema is migrated).
host=${HTTP%:*}; port=${HTTP##*:}
ready() (
  exec 3<>"/dev/tcp/$host/$port" || exit 1
  printf 'GET /healthz/ready HTTP/1.0\r\n\r\n' >&3
  local status; read -r _ status _ <&3 || true
  [ "$status" = 200 ]
)
for i in $(seq 1 480); do
  if ready 2>/dev/null; then break; fi
  if ! kill -0 $pid 2>/dev/null; then echo "meterd exited; see $DATA.log" >&2; tail -20 "$DATA.log" >&2; exit 1; fi
  if [ "$i" = 480 ]; then echo "meterd was not ready after 4 minutes; see $DATA.log" >&2; tail -20 "$DATA.log" >&2; exit 1; fi
  sleep 0.5
done
FINANCE=$(cat "$DATA/keys/finance.key")

echo
echo "== replaying $EVENTS synthetic events through POST /v1/events"
# --wait returns once the accepted events are in the usage and the rollups.
"$BIN"/meterctl replay --addr "http://$HTTP" --key "$(cat "$DATA/keys/ingest.key")" --synthetic "$EVENTS" --duration 24h \
  --wait "$WAIT" --wait-key "$FINANCE"
echo
echo "== usage of the last 24 hours, from GET /v1/usage"
"$BIN"/meterctl usage --addr "http://$HTTP" --key "$FINANCE" --group-by tenant_id,model
echo
echo "== latency by model over the last 24 hours, from GET /v1/latency (rollups)"
"$BIN"/meterctl latency --addr "http://$HTTP" --key "$FINANCE" --group-by model --metric ttft,e2e
echo
echo "== goodput by model, from GET /v1/goodput"
"$BIN"/meterctl goodput --addr "http://$HTTP" --key "$FINANCE" --group-by model
echo
echo "== GPU samples of the demo fleet (60 s, last 24 h) through gpu-agent --source replay → $KAFKA"
"$BIN"/meterctl gpu-samples --duration 24h --out "$DATA/gpu-demo.jsonl"
"$BIN"/gpu-agent --source replay --file "$DATA/gpu-demo.jsonl" --interval 1ms --kafka-brokers "$KAFKA" \
  --http-addr "" --log-level warn
echo "== engine samples of the demo's vLLM and SGLang replicas (queue depth, KV cache; 60 s, last 24 h) → $KAFKA"
"$BIN"/meterctl engine-samples --duration 24h --kafka-brokers "$KAFKA"
# gpu-agent returned once Kafka acknowledged every sample; the consumer then
# inserts them and the rollup job (every 2 s here) costs their hours. The
# cost rollups keep no count of the samples they cover, so the wait is for
# the GPU usage to stop changing: the same answer three polls 2 s apart.
START=$(date -u -d '-24 hours' +%Y-%m-%dT%H:00:00Z); END=$(date -u -d '+1 hour' +%Y-%m-%dT%H:00:00Z)
gpu_usage() {
  "$BIN"/meterctl gpu-usage --addr "http://$HTTP" --key "$FINANCE" --group-by deployment --start "$START" --end "$END" "$@"
}
prev=""; same=0
for i in $(seq 1 45); do
  cur=$(gpu_usage --output csv 2>/dev/null || true)
  if [ -n "$cur" ] && [ "$(printf '%s\n' "$cur" | wc -l)" -gt 1 ] && [ "$cur" = "$prev" ]; then
    same=$((same + 1)); [ $same -ge 2 ] && break
  else
    same=0
  fi
  prev=$cur
  if [ "$i" = 45 ]; then echo "GPU usage was still changing (or empty) after 90 s; the table below may be partial (see $DATA.log)" >&2; fi
  sleep 2
done
echo
echo "== GPU usage and cost by deployment, from GET /v1/gpu-usage"
gpu_usage
echo
echo "== GPU cost allocated to tenants (tokens policy, idle kept apart), from GET /v1/cost"
"$BIN"/meterctl cost --addr "http://$HTTP" --key "$FINANCE" --group-by tenant_id --start "$START" --end "$END"
echo
echo "== engine saturation by deployment (queue depth, KV cache), from GET /v1/engine-stats"
# The engine samples were published before the GPU usage settled; their
# rollup may still be a run behind: wait for rows (up to 30 s).
engine_stats() {
  "$BIN"/meterctl engine-stats --addr "http://$HTTP" --key "$FINANCE" --group-by deployment --start "$START" --end "$END" --step total "$@"
}
for i in $(seq 1 15); do
  if engine_stats --output csv 2>/dev/null | grep -q ',summary,'; then break; fi
  sleep 2
done
engine_stats
echo
echo "== capacity report by deployment (growth 1.3), from GET /v1/reports/capacity"
if "$BIN"/meterctl report capacity --addr "http://$HTTP" --key "$FINANCE" --start "$START" --end "$END" --growth 1.3 \
  --format html -o "$DATA/capacity.html"; then
  echo "written to $DATA/capacity.html (one file: open it in a browser)"
fi
echo
echo "Dashboard: http://$HTTP/ui/ (paste a key: $DATA/keys/finance.key for everything, $DATA/keys/tenant-acme.key for tenant acme)"
echo "meterd keeps running (logs in $DATA.log); try the keys above with meterctl or curl. Ctrl-C stops it."
wait $pid
