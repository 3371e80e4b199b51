package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"tokenmeter/ingest"
	"tokenmeter/ingest/engine"
	"tokenmeter/internal/envflag"
	"tokenmeter/internal/workload"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// runEngineSamples writes synthetic engine samples of the demo fleet as
// JSON lines, or publishes them to the engine topic.
func runEngineSamples(ctx context.Context, args []string, _ func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("engine-samples", "[flags]",
		"Makes synthetic engine samples (queue depth, running requests, KV cache,\n"+
			"prefix cache, preemptions) of the vLLM and SGLang deployments that\n"+
			"\"meterctl replay --synthetic\" serves, --replicas replicas each, busy in step\n"+
			"with the daily traffic cycle, and writes them as JSON lines (one EngineSample\n"+
			"per line) or, with --kafka-brokers, publishes them to the engine topic as\n"+
			"gpu-agent does. The samples are deterministic: the same flags give the same\n"+
			"sample ids, so a re-publish deduplicates.", stderr)
	flags := registerFleetFlags(fs, "replica")
	brokers := fs.String("kafka-brokers", "", "publish to these Kafka brokers (comma-separated) instead of writing to --out")
	topic := fs.String("topic", ingest.DefaultEngineTopic, "Kafka topic of engine samples, with --kafka-brokers")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := flags.config()
	if err == nil && *brokers != "" && *flags.out != "-" {
		err = errors.New("--out and --kafka-brokers: give one")
	}
	if err != nil {
		return err
	}
	if *brokers != "" {
		var all []*meterv1.EngineSample
		if err := workload.EngineSamples(cfg, func(s *meterv1.EngineSample) error { all = append(all, s); return nil }); err != nil {
			return err
		}
		pub, err := engine.NewKafkaPublisher(envflag.List(*brokers), nil, *topic)
		if err != nil {
			return err
		}
		defer pub.Close()
		limits := ingest.DefaultLimits()
		for _, s := range all {
			if err := limits.ValidateEngineSample(s, time.Now()); err != nil {
				return fmt.Errorf("synthetic sample %s: %w", s.GetSampleId(), err)
			}
		}
		for len(all) > 0 {
			n := min(len(all), 5_000)
			if _, err := pub.Publish(ctx, all[:n]); err != nil {
				return err
			}
			all = all[n:]
		}
		return nil
	}
	return writeJSONLines(flags, stdout, stderr, "engine samples", func(emit func(*meterv1.EngineSample) error) error {
		return workload.EngineSamples(cfg, emit)
	})
}
