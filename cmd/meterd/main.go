// Command meterd is the tokenmeter server: it ingests inference events from
// Kafka into ClickHouse and serves the gRPC and REST API. See README.md.
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
		fmt.Fprintln(os.Stderr, "meterd:", err)
		os.Exit(1)
	}
}
