#!/usr/bin/env bash
# Measure the dev footprint of `make run`: run scripts/run-demo.sh on a fresh
# data directory and sample, every second, the size of that directory, the
# number of ClickHouse part folders in it, and the RSS of the dev
# clickhouse-server and of meterd, until the demo printed its last table and
# HOLD seconds more. Prints the peaks and writes a per-second CSV.
#
#   make build && scripts/measure-demo.sh
#
# Settings (environment): DATA (default: a new folder under /tmp, removed
# first if it exists), HOLD (seconds to keep sampling after the last table,
# 120), CSV (default $DATA.csv), BIN (bin), DEMO (the demo script,
# scripts/run-demo.sh), LIMIT_DATA_MB (200) and
# LIMIT_CH_RSS_MB (1024): the exit status is 1 when a sample went over either.
# METER_HTTP_ADDR, METER_GRPC_ADDR, METER_KAFKA_BROKERS and DEMO_* are passed
# to the demo as they are.
#
# The columns: t (seconds since start), phase (start, demo, hold), data_kb
# (disk blocks of the files under DATA, what the disk holds; a find sum,
# as du -sk counts), data_apparent_kb (their sizes, as du -sk --apparent-size), parts (part folders of every table, active and inactive),
# ch_rss_kb, meterd_rss_kb (VmRSS; empty while the process is not running),
# clickhouse_kb and kafka_kb (disk blocks of DATA/clickhouse, DATA/kafka).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-/tmp/tokenmeter-measure/data}
HOLD=${HOLD:-120}
CSV=${CSV:-$DATA.csv}
LIMIT_DATA_MB=${LIMIT_DATA_MB:-200}
LIMIT_CH_RSS_MB=${LIMIT_CH_RSS_MB:-1024}
export BIN=${BIN:-bin}
DEMO=${DEMO:-scripts/run-demo.sh}

rm -rf "$DATA" "$DATA.log" "$DATA.log.1"
mkdir -p "$(dirname "$DATA")"
OUT=$DATA.out
DATA="$DATA" "$DEMO" >"$OUT" 2>&1 &
demo=$!
stop_demo() { kill -TERM "$demo" 2>/dev/null || true; wait "$demo" 2>/dev/null || true; }
trap stop_demo EXIT
trap 'exit 130' INT TERM

rss_kb() { # VmRSS of pid $1 in kB, or nothing
  [ -n "${1:-}" ] && awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || true
}
meterd_pid() { # the meterd that run-demo.sh started (its child)
  ps -o pid=,comm= --ppid "$demo" 2>/dev/null | awk '$2 == "meterd" {print $1; exit}'
}
ch_pid() { # the dev ClickHouse: its pid file, if that process is alive
  local p
  p=$(cat "$DATA/clickhouse/clickhouse.pid" 2>/dev/null || true)
  [ -n "$p" ] && [ -d "/proc/$p" ] && echo "$p" || true
}
# One pass over DATA (find): disk blocks, apparent size, the disk blocks of DATA/clickhouse and DATA/kafka, and
# part folders: data/<db>/<table>/<part> (18.x) and store/<xxx>/<uuid>/<part>
# (Atomic databases), six levels below DATA.
footprint() {
  find "$DATA" -printf '%y %d %b %s %P\n' 2>/dev/null |
    awk '{ blocks += $3; bytes += $4; split($5, p, "/") }
      p[1] == "clickhouse" { ch += $3 } p[1] == "kafka" { kafka += $3 }
      $1 == "d" && $2 == 6 && p[6] != "detached" { parts++ }
      END { printf "%d %d %d %d %d\n", blocks / 2, (bytes + 1023) / 1024, parts, ch / 2, kafka / 2 }'
}

echo "t,phase,data_kb,data_apparent_kb,parts,ch_rss_kb,meterd_rss_kb,clickhouse_kb,kafka_kb" >"$CSV"
start=$(date +%s); tick=$start; phase=start; done_at=""
peak_data=0 peak_app=0 peak_parts=0 peak_ch=0 peak_md=0 peak_chdir=0 peak_kafka=0
while :; do
  now=$(date +%s); t=$((now - start))
  if [ "$phase" = start ] && grep -q '^== replaying' "$OUT" 2>/dev/null; then phase=demo; fi
  if [ -z "$done_at" ] && grep -q '^Dashboard:' "$OUT" 2>/dev/null; then done_at=$now; phase=hold; fi
  read -r data app parts chdir kafka < <(footprint)
  ch=$(rss_kb "$(ch_pid)"); md=$(rss_kb "$(meterd_pid)")
  echo "$t,$phase,${data:-0},${app:-0},$parts,$ch,$md,${chdir:-0},${kafka:-0}" >>"$CSV"
  [ "${data:-0}" -gt $peak_data ] && peak_data=$data
  [ "${app:-0}" -gt $peak_app ] && peak_app=$app
  [ "$parts" -gt $peak_parts ] && peak_parts=$parts
  [ "${ch:-0}" -gt $peak_ch ] && peak_ch=$ch
  [ "${md:-0}" -gt $peak_md ] && peak_md=$md
  [ "${chdir:-0}" -gt $peak_chdir ] && peak_chdir=$chdir
  [ "${kafka:-0}" -gt $peak_kafka ] && peak_kafka=$kafka
  if ! kill -0 "$demo" 2>/dev/null; then
    echo "the demo exited before its last table; see $OUT and $DATA.log" >&2
    tail -20 "$OUT" >&2
    exit 1
  fi
  if [ -n "$done_at" ] && [ $((now - done_at)) -ge "$HOLD" ]; then break; fi
  # The next sample at the next whole second of the clock.
  tick=$((tick + 1)); ms=$((tick * 1000 - $(date +%s%3N)))
  while [ $ms -le 0 ]; do tick=$((tick + 1)); ms=$((ms + 1000)); done
  sleep "$((ms / 1000)).$(printf '%03d' $((ms % 1000)))"
done
stop_demo; trap - EXIT

mb() { echo $((($1 + 1023) / 1024)); }
demo_s=$(awk -F, '$2 == "hold" {print $1; exit}' "$CSV")
echo "demo: last table after ${demo_s:-?} s; sampled every second until ${HOLD} s later ($(($(wc -l <"$CSV") - 1)) samples)"
echo "peak data directory:  $(mb $peak_data) MB on disk ($(mb $peak_app) MB apparent), limit $LIMIT_DATA_MB MB"
echo "  of which clickhouse/ $(mb $peak_chdir) MB, kafka/ $(mb $peak_kafka) MB at their own peaks"
echo "peak part folders:    $peak_parts"
echo "peak ClickHouse RSS:  $(mb $peak_ch) MB, limit $LIMIT_CH_RSS_MB MB"
echo "peak meterd RSS:      $(mb $peak_md) MB"
echo "end: $(tail -1 "$CSV")"
echo "per-second samples: $CSV; demo output: $OUT; meterd log: $DATA.log"
fail=0
if [ "$(mb $peak_data)" -ge "$LIMIT_DATA_MB" ]; then echo "over the limit: data directory" >&2; fail=1; fi
if [ "$(mb $peak_ch)" -ge "$LIMIT_CH_RSS_MB" ]; then echo "over the limit: ClickHouse RSS" >&2; fail=1; fi
exit $fail
