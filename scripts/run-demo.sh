#!/usr/bin/env bash
# `make run`: start meterd in dev mode, replay five weeks of a small fleet
# (events through the API, GPU samples through gpu-agent, engine samples),
# close last month's billing period, print the usage, latency, goodput, GPU,
# cost, engine, capacity and statement tables from the API, write the
# capacity report and the statement exports under $DATA, then keep meterd
# running until Ctrl-C.
#
# Settings (environment): DATA (data directory, default ./data),
# METER_HTTP_ADDR (127.0.0.1:8080), METER_GRPC_ADDR (127.0.0.1:9090),
# METER_KAFKA_BROKERS (the dev broker, 127.0.0.1:9092), DEMO_EVENTS (360000,
# over DEMO_DAYS, 35), DEMO_WAIT (how long to wait for ingest and rollups,
# 5m), BIN (the binaries, bin).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-$PWD/data}
HTTP=${METER_HTTP_ADDR:-127.0.0.1:8080}
GRPC=${METER_GRPC_ADDR:-127.0.0.1:9090}
KAFKA=${METER_KAFKA_BROKERS:-127.0.0.1:9092}
EVENTS=${DEMO_EVENTS:-360000}
DAYS=${DEMO_DAYS:-35}
WAIT=${DEMO_WAIT:-5m}
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
  echo "note: $DATA holds the events of earlier runs; this run adds its $EVENTS events to theirs, so the totals"
  echo "      below count both. Remove $DATA (rm -rf $DATA) to start from nothing."
fi
# The previous run's log is kept as $DATA.log.1.
[ -f "$DATA.log" ] && mv -f "$DATA.log" "$DATA.log.1"
mkdir -p "$DATA"
"$BIN"/meterd --dev --data-dir "$DATA" --http-addr "$HTTP" --grpc-addr "$GRPC" --kafka-brokers "$KAFKA" --rollup-interval 2s \
  --prices deploy/prices.example.json --slo-file scripts/demo-slo.json 2>"$DATA.log" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; exit 0' INT TERM
trap 'kill -TERM $pid 2>/dev/null || true; rm -f "${gpu_file:-}"' EXIT

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
began=$SECONDS
echo "meterd is ready (REST http://$HTTP)."
FINANCE=$(cat "$DATA/keys/finance.key")
ADMIN=$(cat "$DATA/keys/admin.key")
# mctl COMMAND... -- FLAGS: meterctl with the finance key.
mctl() {
  local cmd=()
  while [ "$1" != -- ]; do cmd+=("$1"); shift; done
  shift
  "$BIN"/meterctl "${cmd[@]}" --addr "http://$HTTP" --key "$FINANCE" "$@"
}

# quiet COMMAND...: run it without its progress lines, but print them (and
# fail) when it fails, rather than ending the script without a word.
quiet() {
  local out
  if ! out=$("$@" 2>&1); then printf '%s\n' "$out" >&2; return 1; fi
}

SPAN=$((DAYS * 24))h
echo
echo "== replaying $DAYS days of a small fleet: $EVENTS events through POST /v1/events, and its GPU and engine samples"
# The fleet (meterctl --fleet demo): five deployments growing 5% a week, one
# saturating at its peaks, one idle. Its GPU samples (every 10 min) go
# through gpu-agent --source replay (from a file removed once sent), its
# engine samples (queue depth, KV cache) straight to Kafka, while the
# events are replayed.
gpu_file=$(mktemp "${TMPDIR:-/tmp}/gpu-demo.XXXXXX.jsonl")
(
  "$BIN"/meterctl engine-samples --fleet demo --duration "$SPAN" --interval 10m --kafka-brokers "$KAFKA"
  quiet "$BIN"/meterctl gpu-samples --fleet demo --duration "$SPAN" --interval 10m --idle-deployment "" --out "$gpu_file"
  "$BIN"/gpu-agent --source replay --file "$gpu_file" --interval 1ms --kafka-brokers "$KAFKA" --http-addr "" --log-level warn
  rm -f "$gpu_file"
) &
samples=$!
# --wait returns once the accepted events are in the usage and the rollups.
"$BIN"/meterctl replay --addr "http://$HTTP" --key "$(cat "$DATA/keys/ingest.key")" --fleet demo --synthetic "$EVENTS" --duration "$SPAN" \
  --wait "$WAIT" --wait-key "$FINANCE"
if ! wait $samples; then echo "publishing the GPU or engine samples failed (see above)" >&2; exit 1; fi

# gpu-agent returned once Kafka acknowledged every sample; the consumer then
# inserts them and the rollup job (every 2 s here) costs their hours. The
# cost rollups keep no count of the samples they cover, so the wait is for
# the GPU usage of the whole history to stop changing: the same answer
# three polls 2 s apart.
HOUR=$(date -u +%Y-%m-%dT%H:00:00Z)
START=$(date -u -d "$HOUR -24 hours" +%Y-%m-%dT%H:00:00Z); END=$(date -u -d "$HOUR +1 hour" +%Y-%m-%dT%H:00:00Z)
FIRST=$(date -u -d "$HOUR -$((DAYS * 24)) hours" +%Y-%m-%dT%H:00:00Z)
prev=""; same=0
for i in $(seq 1 60); do
  cur=$(mctl gpu-usage -- --group-by deployment --start "$FIRST" --end "$END" --output csv 2>/dev/null || true)
  if [ -n "$cur" ] && [ "$(printf '%s\n' "$cur" | wc -l)" -gt 1 ] && [ "$cur" = "$prev" ]; then
    same=$((same + 1)); [ $same -ge 2 ] && break
  else
    same=0
  fi
  prev=$cur
  if [ "$i" = 60 ]; then echo "GPU usage was still changing (or empty) after 2 minutes; the tables below may be partial (see $DATA.log)" >&2; fi
  sleep 2
done

# Last month, closed: its events are all in the past and rolled up; the
# close waits (up to 30 s a try) until ingest and the rollups have costed
# its end, and answers 409 until then.
PERIOD=$(date -u -d "$(date -u +%Y-%m-01) -1 day" +%Y-%m)
mkdir -p "$DATA/exports"
closed=""
for i in $(seq 1 6); do
  if closed=$("$BIN"/meterctl billing close "$PERIOD" --addr "http://$HTTP" --key "$ADMIN" --grace 1s 2>&1); then break; fi
  if [ "$i" = 6 ]; then echo "closing $PERIOD failed: $closed" >&2; exit 1; fi
  sleep 2
done

echo
echo "== usage of the last 24 hours by tenant, from GET /v1/usage"
mctl usage -- --group-by tenant_id --start "$START" --end "$END"
echo
echo "== latency by model over the last 24 hours, from GET /v1/latency (rollups)"
mctl latency -- --group-by model --metric ttft,e2e --start "$START" --end "$END"
echo
echo "== goodput by model over the last 24 hours (SLO: scripts/demo-slo.json), from GET /v1/goodput"
mctl goodput -- --group-by model --start "$START" --end "$END"
echo
echo "== GPU usage and cost by deployment over the last 24 hours, from GET /v1/gpu-usage"
mctl gpu-usage -- --group-by deployment --start "$START" --end "$END"
echo
echo "== GPU cost allocated to tenants over the last 24 hours (tokens policy, idle kept apart), from GET /v1/cost"
mctl cost -- --group-by tenant_id --start "$START" --end "$END"
echo
echo "== GPU cost by deployment over the $DAYS days, and the gross margin of the list charge against it, from GET /v1/cost"
mctl cost -- --group-by deployment --start "$FIRST" --end "$END" --step total
echo
echo "== engine saturation by deployment over the last 24 hours (queue depth, KV cache), from GET /v1/engine-stats"
# The engine rollups keep a watermark of their own: wait for their rows (up to 30 s).
engine_stats() { mctl engine-stats -- --group-by deployment --start "$START" --end "$END" --step total "$@"; }
for i in $(seq 1 15); do
  if engine_stats --output csv 2>/dev/null | grep -q ',summary,'; then break; fi
  sleep 2
done
engine_stats
echo
echo "== capacity report by deployment over $DAYS days (growth 1.3), from GET /v1/reports/capacity"
mctl report capacity -- --start "$FIRST" --end "$END" --growth 1.3 --format table
quiet mctl report capacity -- --start "$FIRST" --end "$END" --growth 1.3 --format html -o "$DATA/capacity.html"
echo "(also written to $DATA/capacity.html: one file, open it in a browser)"
echo
echo "== billing period $PERIOD, closed through POST /v1/billing/periods/$PERIOD:close"
printf '%s\n' "$closed"
echo
echo "== closed statement of tenant acme for $PERIOD, from GET /v1/billing/statements/$PERIOD"
mctl billing statement "$PERIOD" -- --tenant acme
quiet mctl billing export statements "$PERIOD" -- --format csv -o "$DATA/exports/statements-$PERIOD.csv"
quiet mctl billing export statements "$PERIOD" -- --format focus-csv -o "$DATA/exports/statements-$PERIOD.focus.csv"
echo "(every tenant's statement lines: $DATA/exports/statements-$PERIOD.csv, FOCUS: $DATA/exports/statements-$PERIOD.focus.csv)"
echo
echo "The tables above took $((SECONDS - began)) s from meterd ready."
echo "Dashboard: http://$HTTP/ui/ (paste a key: $DATA/keys/finance.key for everything, $DATA/keys/tenant-acme.key for tenant acme)"
echo "meterd keeps running (logs in $DATA.log); try the keys above with meterctl or curl. Ctrl-C stops it."
wait $pid
