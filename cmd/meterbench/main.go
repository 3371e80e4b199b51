// Command meterbench measures the ingest path on this machine and prints a
// report (`make bench`): raw kafka-go fetch throughput, raw columnar
// clickhouse-go insert throughput, the meterd pipeline end to end (protobuf
// and JSON records), event-to-queryable latency at a fixed rate, meterd's
// peak RSS, and ClickHouse's own Kafka table engine on the same JSON records.
// `meterbench queries` (make bench-queries) times the rollup and the query
// API on 100M events; `meterbench hour` (make bench-hour) times the rollup
// of one hour of 1M events.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "meterbench:", err)
		os.Exit(1)
	}
}
