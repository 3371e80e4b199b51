// Command meterctl is the command-line client of tokenmeter's REST API: it
// replays synthetic or Azure-trace traffic through POST /v1/events, queries
// usage from GET /v1/usage and latency, goodput and traffic from
// GET /v1/latency, /v1/goodput and /v1/traffic, and creates API keys.
// "meterctl help" lists the commands.
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
		fmt.Fprintln(os.Stderr, "meterctl:", err)
		os.Exit(1)
	}
}
