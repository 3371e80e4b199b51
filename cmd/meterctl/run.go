package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"
)

const usageText = `meterctl is the command-line client of tokenmeter's REST API.

Usage:
  meterctl <command> [flags]

Commands:
  replay     send synthetic or Azure-trace events through POST /v1/events
  usage      print usage totals from GET /v1/usage as a table, CSV or JSON
  latency    print TTFT, ITL, E2E and queue-time percentiles from GET /v1/latency
  goodput    print SLO attainment and goodput from GET /v1/goodput
  traffic    print request and token rates and error rates from GET /v1/traffic
  cost       print GPU cost allocated to tenants, per 1k tokens, from GET /v1/cost
  gpu-usage  print GPU-hours, utilization, energy and GPU cost from GET /v1/gpu-usage
  engine-stats  print queue depth, running requests, KV cache and preemptions from GET /v1/engine-stats
  gpu-samples  write synthetic GPU samples of the demo fleet for gpu-agent --source replay
  engine-samples  write or publish synthetic engine samples (queue, KV cache) of the demo fleet
  billing    billing periods, closes, statements and exports ("meterctl billing help")
  report capacity  write the capacity report (GET /v1/reports/capacity) as HTML, CSV or JSON
  keys new   create an API key and its entry for meterd's --auth-keys file
  help       show this text; "meterctl help <command>" shows a command's flags

latency, goodput and traffic take the same selector flags: --tenant, --start
and --end (RFC 3339 or a date, on whole minutes; default the last 24 h), --step
(total, minute, hour, day, month), --group-by (tenant_id, model, model_version,
deployment, gpu_type, slo_class), --page-size and --output (table, csv, json).
They fetch every page of the answer.

cost and gpu-usage take the same flags on whole hours: --start and --end
(RFC 3339 or a date, on whole hours; default the last 24 h), --step (total, hour, day, month),
--group-by (cost: tenant_id, model, deployment, gpu_type; gpu-usage:
deployment, gpu_type, pool, region, mig_profile), --page-size and --output.
cost also takes --tenant, --busy-policy (tokens, weighted_tokens,
request_time) and --idle-policy (separate, shared_weighted, shared_even).

report capacity takes --start and --end on whole hours (default the last 4
weeks), --group-by (deployment, model, gpu_type), --deployment, --target,
--growth or --target-tps, --horizon-weeks, --format (html, json, csv) and
-o FILE (default standard output).

Environment:
  METER_ADDR     API base URL when --addr is not given (default ` + defaultAddr + `)
  METER_API_KEY  API key when --key is not given, sent as "Authorization: Bearer <key>"
`

const defaultAddr = "http://127.0.0.1:8080"

// run is meterctl without the process around it: args are the arguments
// after the program name, getenv reads the environment.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	err := dispatch(ctx, args, getenv, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil // the flag package printed the command's help
	}
	return err
}

func dispatch(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stdout, usageText)
		return nil
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "replay":
		return runReplay(ctx, rest, getenv, stdout, stderr)
	case "usage":
		return runUsage(ctx, rest, getenv, stdout, stderr)
	case "latency":
		return runLatency(ctx, rest, getenv, stdout, stderr)
	case "goodput":
		return runGoodput(ctx, rest, getenv, stdout, stderr)
	case "traffic":
		return runTraffic(ctx, rest, getenv, stdout, stderr)
	case "cost":
		return runCost(ctx, rest, getenv, stdout, stderr)
	case "gpu-usage":
		return runGPUUsage(ctx, rest, getenv, stdout, stderr)
	case "gpu-samples":
		return runGPUSamples(ctx, rest, getenv, stdout, stderr)
	case "engine-stats":
		return runEngineStats(ctx, rest, getenv, stdout, stderr)
	case "engine-samples":
		return runEngineSamples(ctx, rest, getenv, stdout, stderr)
	case "billing":
		return runBilling(ctx, rest, getenv, stdout, stderr)
	case "report":
		return runReport(ctx, rest, getenv, stdout, stderr)
	case "keys":
		if len(rest) == 0 || rest[0] != "new" {
			return errors.New(`keys: want "meterctl keys new --name NAME --role ROLE [--tenant ID]"`)
		}
		return runKeysNew(rest[1:], stdout, stderr)
	case "help", "-h", "-help", "--help":
		if len(rest) == 0 {
			fmt.Fprint(stdout, usageText)
			return nil
		}
		if rest[0] == "keys" {
			rest = []string{"keys", "new"}
		}
		return dispatch(ctx, append(rest, "-h"), getenv, stdout, stderr)
	default:
		return fmt.Errorf("unknown command %q; \"meterctl help\" lists the commands", cmd)
	}
}

// newFlagSet returns a flag set whose help names the command and says what
// it does.
func newFlagSet(name, synopsis, about string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("meterctl "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: meterctl %s %s\n\n%s\n\nFlags:\n", name, synopsis, about)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args and refuses positional arguments.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected arguments: %s", fs.Name(), strings.Join(fs.Args(), " "))
	}
	return nil
}

// validatedOnly says "configuration ok" and returns true when --validate
// asked only for the check: the command then stops.
func validatedOnly(stdout io.Writer, only bool) bool {
	if only {
		fmt.Fprintln(stdout, "configuration ok")
	}
	return only
}

// connConfig says how to reach the API.
type connConfig struct {
	// Addr is the API base URL; a bare host:port means http.
	Addr string
	// Key is the API key.
	Key string
	// Timeout bounds one HTTP request.
	Timeout time.Duration
}

// register adds --addr, --key and --timeout to fs.
func (c *connConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&c.Addr, "addr", "", "API base URL (env METER_ADDR, default "+defaultAddr+")")
	fs.StringVar(&c.Key, "key", "", "API key (env METER_API_KEY)")
	fs.DurationVar(&c.Timeout, "timeout", 60*time.Second, "timeout of one HTTP request")
}

// resolve fills what the flags left empty from the environment, then the
// defaults. The key is never a flag default, so that help output cannot
// show it.
func (c *connConfig) resolve(getenv func(string) string) {
	if c.Addr == "" {
		c.Addr = getenv("METER_ADDR")
	}
	if c.Addr == "" {
		c.Addr = defaultAddr
	}
	if c.Key == "" {
		c.Key = getenv("METER_API_KEY")
	}
}

// validate reports every problem of c.
func (c connConfig) validate() []error {
	var errs []error
	u, err := url.Parse(c.baseURL())
	switch {
	case err != nil:
		errs = append(errs, fmt.Errorf("--addr %q: %w", c.Addr, err))
	case u.Scheme != "http" && u.Scheme != "https":
		errs = append(errs, fmt.Errorf("--addr %q: want an http:// or https:// URL", c.Addr))
	case u.Host == "":
		errs = append(errs, fmt.Errorf("--addr %q: no host", c.Addr))
	case u.RawQuery != "" || u.Fragment != "":
		errs = append(errs, fmt.Errorf("--addr %q: want a base URL without query or fragment", c.Addr))
	}
	if c.Key == "" {
		errs = append(errs, errors.New("no API key: give --key or set METER_API_KEY"))
	}
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("--timeout %s: must be positive", c.Timeout))
	}
	return errs
}

// baseURL is Addr with a scheme and without a trailing slash.
func (c connConfig) baseURL() string {
	a := strings.TrimRight(strings.TrimSpace(c.Addr), "/")
	if !strings.Contains(a, "://") {
		a = "http://" + a
	}
	return a
}
