package main

import (
	"context"
	"io"

	"tokenmeter/internal/workload"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// runGPUSamples writes synthetic GPU samples of the demo fleet as JSON
// lines, the format gpu-agent --source replay reads.
func runGPUSamples(_ context.Context, args []string, _ func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("gpu-samples", "[flags]",
		"Writes synthetic GPU samples of the fleet that \"meterctl replay --synthetic\" serves\n"+
			"(each model's deployment: --replicas replicas of its tensor-parallel GPUs,\n"+
			"busy in step with the daily traffic cycle) as JSON lines, one GpuSample per\n"+
			"line, for \"gpu-agent --source replay --file F\" to publish. The samples are\n"+
			"deterministic: the same flags give the same sample ids, so a re-publish\n"+
			"deduplicates.", stderr)
	flags := registerFleetFlags(fs, "GPU")
	idle := fs.String("idle-deployment", "spare-h100-use1", "also sample one GPU of this deployment that serves no traffic (empty: none)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := flags.config()
	if err != nil {
		return err
	}
	cfg.IdleDeployment = *idle
	return writeJSONLines(flags, stdout, stderr, "GPU samples", func(emit func(*meterv1.GpuSample) error) error {
		return workload.FleetSamples(cfg, emit)
	})
}
