package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"tokenmeter/internal/timearg"
	"tokenmeter/internal/workload"
)

// fleetFlags are the flags of the synthetic sample commands (gpu-samples,
// engine-samples): the span, the interval, the replicas and the output.
type fleetFlags struct {
	end                *string
	duration, interval *time.Duration
	replicas           *int
	out                *string
	fleet              *string
}

// registerFleetFlags adds the fleet flags to fs; what names what is
// sampled ("GPU", "replica") in the interval's help.
func registerFleetFlags(fs *flag.FlagSet, what string) fleetFlags {
	return fleetFlags{
		end:      fs.String("end", "", "end of the samples, RFC 3339 or a date (default: now, rounded down to the minute)"),
		duration: fs.Duration("duration", 24*time.Hour, "span of the samples before --end"),
		interval: fs.Duration("interval", time.Minute, "sampling interval of every "+what),
		replicas: fs.Int("replicas", 2, "replicas per deployment"),
		out:      fs.String("out", "-", "output file (- for stdout)"),
		fleet: fs.String("fleet", "default", "the synthetic fleet, as replay's --fleet: default or demo (whose deployments have replicas of their own: "+
			"--replicas applies to the default fleet)"),
	}
}

// config checks the parsed flags, joining every problem, and returns the
// fleet they describe.
func (f fleetFlags) config() (workload.FleetConfig, error) {
	to := time.Now().UTC().Truncate(time.Minute)
	var errs []error
	if *f.end != "" {
		t, err := timearg.Parse("--end", *f.end)
		if err != nil {
			errs = append(errs, err)
		}
		to = t
	}
	if *f.duration <= 0 || *f.interval <= 0 || *f.replicas <= 0 {
		errs = append(errs, errors.New("--duration, --interval and --replicas must be positive"))
	}
	models, growth, _, ok := workload.FleetNamed(*f.fleet)
	if !ok {
		errs = append(errs, fmt.Errorf("--fleet %q: want one of %s", *f.fleet, strings.Join(workload.Fleets, ", ")))
	}
	return workload.FleetConfig{Start: to.Add(-*f.duration), Duration: *f.duration, Interval: *f.interval, Replicas: *f.replicas,
			Models: models, WeeklyGrowth: growth},
		errors.Join(errs...)
}

// writeJSONLines writes every message gen emits as one protojson line to
// --out (stdout for "-"), and says on stderr how many it wrote to a file.
func writeJSONLines[M proto.Message](f fleetFlags, stdout, stderr io.Writer, what string, gen func(emit func(M) error) error) error {
	w := stdout
	if *f.out != "-" {
		file, err := os.Create(*f.out)
		if err != nil {
			return err
		}
		defer file.Close()
		w = file
	}
	bw := bufio.NewWriter(w)
	n := 0
	err := gen(func(m M) error {
		b, err := protojson.Marshal(m)
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
	if *f.out != "-" {
		fmt.Fprintf(stderr, "wrote %d %s to %s\n", n, what, *f.out)
	}
	return nil
}
