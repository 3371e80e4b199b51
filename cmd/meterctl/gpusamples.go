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

	"tokenmeter/internal/timearg"
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
	end := fs.String("end", "", "end of the samples, RFC 3339 or a date (default: now, rounded down to the minute)")
	duration := fs.Duration("duration", 24*time.Hour, "span of the samples before --end")
	interval := fs.Duration("interval", time.Minute, "sampling interval of every GPU")
	replicas := fs.Int("replicas", 2, "replicas per deployment")
	idle := fs.String("idle-deployment", "spare-h100-use1", "also sample one GPU of this deployment that serves no traffic (empty: none)")
	out := fs.String("out", "-", "output file (- for stdout)")
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
	if err := errors.Join(errs...); err != nil {
		return err
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
	err := workload.FleetSamples(workload.FleetConfig{
		Start: to.Add(-*duration), Duration: *duration, Interval: *interval, Replicas: *replicas, IdleDeployment: *idle,
	}, func(s *meterv1.GpuSample) error {
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
		fmt.Fprintf(stderr, "wrote %d GPU samples to %s\n", n, *out)
	}
	return nil
}
