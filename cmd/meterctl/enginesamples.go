package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"tokenmeter/ingest"
	"tokenmeter/ingest/engine"
	"tokenmeter/internal/envflag"
	"tokenmeter/internal/timearg"
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
	end := fs.String("end", "", "end of the samples, RFC 3339 or a date (default: now, rounded down to the minute)")
	duration := fs.Duration("duration", 24*time.Hour, "span of the samples before --end")
	interval := fs.Duration("interval", time.Minute, "sampling interval of every replica")
	replicas := fs.Int("replicas", 2, "replicas per deployment")
	out := fs.String("out", "-", "output file (- for stdout); not with --kafka-brokers")
	brokers := fs.String("kafka-brokers", "", "publish to these Kafka brokers (comma-separated) instead of writing")
	topic := fs.String("topic", ingest.DefaultEngineTopic, "Kafka topic of engine samples, with --kafka-brokers")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	to := time.Now().UTC().Truncate(time.Minute)
	var errs []error
	if *end != "" {
		t, err := timearg.Parse("--end", *end)
		if err != nil {
			errs = append(errs, err)
		}
		to = t
	}
	if *duration <= 0 || *interval <= 0 || *replicas <= 0 {
		errs = append(errs, errors.New("--duration, --interval and --replicas must be positive"))
	}
	if *brokers != "" && *out != "-" {
		errs = append(errs, errors.New("--out and --kafka-brokers: give one"))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	cfg := workload.FleetConfig{Start: to.Add(-*duration), Duration: *duration, Interval: *interval, Replicas: *replicas}
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
	w := stdout
	if *out != "-" {
		f, err := os.Create(*out)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	bw := bufio.NewWriter(w)
	n := 0
	err := workload.EngineSamples(cfg, func(s *meterv1.EngineSample) error {
		b, err := protojson.Marshal(s)
		if err != nil {
			return err
		}
		n++
		bw.Write(b)
		return bw.WriteByte('\n')
	})
	if err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	if *out != "-" {
		fmt.Fprintf(stderr, "wrote %d engine samples to %s\n", n, *out)
	}
	return nil
}
