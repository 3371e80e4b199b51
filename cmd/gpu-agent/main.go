// Command gpu-agent reads GPU telemetry on a node — from DCGM, from NVML,
// from NVIDIA dcgm-exporter's /metrics, or from a replay file — attributes each GPU (or
// MIG instance) to a deployment and publishes one GpuSample per GPU and
// interval to the meter.gpu.v1 Kafka topic. With --once it prints one
// reading as JSON lines instead (the format --source replay reads). See
// ingest/gpu; every flag has a METER_* environment fallback.
//
//	# check a node: what would be published
//	gpu-agent --source dcgm-exporter --exporter-url http://127.0.0.1:9400/metrics --once
//	# DCGM through the node's nv-hostengine
//	gpu-agent --source dcgm --dcgm-mode standalone --dcgm-address localhost:5555 \
//	    --kafka-brokers kafka:9092 --region us-east-1 --pool reserved --deployment-map deployments.json
//	# demo: 2 nodes, 4 H100s (one split in 1g.10gb slices), 5 minutes
//	gpu-agent --source replay --file testdata/gpu/replay-demo.jsonl --interval 100ms --kafka-brokers 127.0.0.1:9092
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
		fmt.Fprintln(os.Stderr, "gpu-agent:", err)
		os.Exit(1)
	}
}
