package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query/capacity/render"
)

const reportUsageText = `Usage: meterctl report <command> [flags]

Commands:
  capacity [--start S --end E] [--group-by G] [--deployment D] [--target T]
           [--growth F | --target-tps N] [--horizon-weeks W] --format html|json|csv [-o FILE]
           the capacity report: GPUs, utilization, busy and idle cost, peak,
           sustainable throughput, headroom, GPUs needed, trend and findings

"meterctl report capacity -h" shows its flags.
`

// reportFormats are the formats of "report capacity".
var reportFormats = []string{"html", "json", "csv", "table"}

// reportGroups are the units of a capacity report (capacity.Group).
var reportGroups = []string{"deployment", "model", "gpu_type"}

func runReport(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprint(stdout, reportUsageText)
		return nil
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "capacity":
		return runReportCapacity(ctx, rest, getenv, time.Now(), stdout, stderr)
	default:
		return fmt.Errorf("report: unknown command %q; want capacity", cmd)
	}
}

// capacityConfig is the configuration of "report capacity".
type capacityConfig struct {
	conn       connConfig
	Start, End time.Time
	GroupBy    string
	Deployment string
	// Target, Growth, TargetTPS and HorizonWeeks are sent only when set
	// (zero or empty: the server's default).
	Target       float64
	Growth       string
	TargetTPS    float64
	HorizonWeeks int
	// MaxUnits is sent when set (0: the server's default, 20).
	MaxUnits int
	Format   string
	// File is where the report goes; "" or "-" is standard output.
	File         string
	ValidateOnly bool
}

func parseReportCapacity(args []string, getenv func(string) string, now time.Time, stderr io.Writer) (capacityConfig, error) {
	var c capacityConfig
	fs := newFlagSet("report capacity", "[flags]",
		"Writes the capacity report of GET /v1/reports/capacity (finance and admin keys) as\n"+
			"one self-contained HTML file with charts, as CSV (one row per unit: the fleet,\n"+
			"then each deployment, model or GPU type) or as the API's JSON. The CSV and HTML\n"+
			"are rendered here from the JSON answer, the same bytes the API's format=csv and\n"+
			"format=html give. A figure the data does not support is left empty (CSV) or\n"+
			"shown as unknown with the reason (HTML). Cost and rates are computed per hour,\n"+
			"so --start and --end lie on whole hours.", stderr)
	c.conn.register(fs)
	start := fs.String("start", "", "inclusive start on a whole hour, RFC 3339 or a date such as 2026-11-02 (default: 4 weeks before --end)")
	end := fs.String("end", "", "exclusive end on a whole hour, RFC 3339 or a date (default: now, rounded down to the hour)")
	fs.StringVar(&c.GroupBy, "group-by", "", "unit of the report: "+orList(reportGroups)+" (default deployment)")
	fs.StringVar(&c.Deployment, "deployment", "", "only this deployment")
	fs.Float64Var(&c.Target, "target", 0, "goodput attainment the sustainable throughput keeps, in (0, 1] (default: the server's, 0.99)")
	fs.StringVar(&c.Growth, "growth", "", `growth of the observed peak to size GPUs for, a decimal such as 1.3 (default: the server's, "1")`)
	fs.Float64Var(&c.TargetTPS, "target-tps", 0, "a load in tokens/s to size GPUs for as well")
	fs.IntVar(&c.HorizonWeeks, "horizon-weeks", 0, "weeks past the last complete week to forecast the peak, up to 104 (default: the server's, 13)")
	fs.IntVar(&c.MaxUnits, "max-units", 0, "most units listed one by one, up to 100; the smaller ones are summed into (others) (default: the server's, 20)")
	fs.StringVar(&c.Format, "format", "html", "file format: "+orList(reportFormats))
	outputFlag(fs, &c.File, "", "file to write (default, or -: standard output)")
	fs.BoolVar(&c.ValidateOnly, "validate", false, "check the flags and exit")
	if err := parseFlags(fs, args); err != nil {
		return c, err
	}
	c.conn.resolve(getenv)
	errs := c.conn.validate()
	var err error
	if c.Start, c.End, err = timeRange(*start, *end, now.UTC().Truncate(time.Hour)); err != nil {
		errs = append(errs, err)
	}
	if *start == "" {
		c.Start = c.End.AddDate(0, 0, -28)
	}
	for _, t := range []struct {
		flag string
		at   time.Time
	}{{"--start", c.Start}, {"--end", c.End}} {
		if !t.at.Truncate(time.Hour).Equal(t.at) {
			errs = append(errs, fmt.Errorf("%s %s: must be a whole hour", t.flag, t.at.Format(time.RFC3339Nano)))
		}
	}
	if err == nil && !c.Start.Before(c.End) {
		errs = append(errs, fmt.Errorf("--start %s is not before --end %s", c.Start.Format(time.RFC3339), c.End.Format(time.RFC3339)))
	}
	if c.GroupBy != "" && !slices.Contains(reportGroups, c.GroupBy) {
		errs = append(errs, fmt.Errorf("--group-by %q: want %s", c.GroupBy, orList(reportGroups)))
	}
	if c.Target < 0 || c.Target > 1 {
		errs = append(errs, fmt.Errorf("--target %v: want an attainment in (0, 1], e.g. 0.99", c.Target))
	}
	if c.TargetTPS < 0 {
		errs = append(errs, fmt.Errorf("--target-tps %v: want a load of at least 0 tokens/s", c.TargetTPS))
	}
	if c.HorizonWeeks < 0 {
		errs = append(errs, fmt.Errorf("--horizon-weeks %d: want 1 to 104", c.HorizonWeeks))
	}
	if c.MaxUnits < 0 || c.MaxUnits > 100 {
		errs = append(errs, fmt.Errorf("--max-units %d: want 1 to 100", c.MaxUnits))
	}
	if !slices.Contains(reportFormats, c.Format) {
		errs = append(errs, fmt.Errorf("--format %q: want %s", c.Format, orList(reportFormats)))
	}
	return c, errors.Join(errs...)
}

// query is the request as REST query parameters; the report is always
// asked as JSON and rendered here.
func (c capacityConfig) query() url.Values {
	q := url.Values{"start": {c.Start.Format(time.RFC3339)}, "end": {c.End.Format(time.RFC3339)}}
	set := func(k, v string) {
		if v != "" {
			q.Set(k, v)
		}
	}
	float := func(v float64) string {
		if v == 0 {
			return ""
		}
		return strconv.FormatFloat(v, 'g', -1, 64)
	}
	set("group_by", c.GroupBy)
	set("deployment", c.Deployment)
	set("target", float(c.Target))
	set("growth", c.Growth)
	set("target_tokens_per_second", float(c.TargetTPS))
	if c.HorizonWeeks > 0 {
		q.Set("horizon_weeks", strconv.Itoa(c.HorizonWeeks))
	}
	if c.MaxUnits > 0 {
		q.Set("max_units", strconv.Itoa(c.MaxUnits))
	}
	return q
}

func runReportCapacity(ctx context.Context, args []string, getenv func(string) string, now time.Time, stdout, stderr io.Writer) error {
	cfg, err := parseReportCapacity(args, getenv, now, stderr)
	if err != nil {
		return err
	}
	if validatedOnly(stdout, cfg.ValidateOnly) {
		return nil
	}
	resp := &meterv1.GetCapacityReportResponse{}
	if err := getJSON(ctx, cfg.conn, "GET", "/v1/reports/capacity", cfg.query(), nil, resp); err != nil {
		return err
	}
	r := resp.GetReport()
	var buf bytes.Buffer
	switch cfg.Format {
	case "json":
		err = writeJSON(&buf, resp)
	case "csv":
		err = render.CSV(&buf, r)
	case "table":
		err = capacityTable(&buf, r)
	default:
		err = render.HTML(&buf, r)
	}
	if err != nil {
		return err
	}
	if err := writeOutput(cfg.File, buf.Bytes(), stdout); err != nil {
		return err
	}
	if reason := r.GetNotEnoughData(); reason != "" {
		fmt.Fprintf(stderr, "warning: not enough data: %s\n", reason)
	}
	if n := r.GetUnitsInOthers(); n > 0 {
		fmt.Fprintf(stderr, "note: %d units beyond the %d largest are summed into %s (--max-units)\n", n, r.GetMaxUnits(), r.GetOthers().GetName())
	}
	if cfg.File != "" && cfg.File != "-" {
		fmt.Fprintf(stderr, "meterctl: wrote %s: %d bytes, %s, %d units (%s)\n", cfg.File, buf.Len(), cfg.Format,
			len(r.GetUnits()), render.FileName(r, cfg.Format))
	}
	return nil
}

// writeOutput writes data to dest ("" or "-": stdout) through a temporary
// file beside it, renamed to dest once written: a failed write leaves no
// dest (and an older one untouched).
func writeOutput(dest string, data []byte, stdout io.Writer) error {
	if dest == "" || dest == "-" {
		_, err := stdout.Write(data)
		return err
	}
	f, err := createOutput(dest)
	if err != nil {
		return err
	}
	defer f.Discard()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("-o %s: %w", dest, err)
	}
	return f.Commit()
}

// capacityTable writes the headline figures of each unit, the fleet first,
// as a text table, then the findings: "-" marks a figure the data does not
// support (the HTML and JSON say why); "≥" a sustainable load (and the
// headroom and GPUs from it) that is a lower bound, the unit never
// saturated in the range. The fleet plan follows (render.PlanText).
func capacityTable(w io.Writer, r *meterv1.CapacityReport) error {
	if reason := r.GetNotEnoughData(); reason != "" {
		_, err := fmt.Fprintf(w, "Not enough data: %s\n", reason)
		return err
	}
	g := &grid{cols: append([]column{{head: "UNIT"}}, numColumns("GPUS", "UTIL", "TOK/S/GPU", "PEAK TOK/S/GPU", "SUSTAINABLE TOK/S/GPU",
		"HEADROOM", "GPUS NEEDED", "WEEKLY GROWTH", "COST", "IDLE COST")...)}
	pct := func(f float64) string { return strconv.FormatFloat(100*f, 'f', 1, 64) + "%" }
	rate := func(f float64) string { return strconv.FormatFloat(f, 'f', 0, 64) }
	for _, u := range append([]*meterv1.CapacityUnit{r.GetFleet()}, r.GetUnits()...) {
		bound := ""
		s := u.GetSustainable()
		if s.GetLowerBound() {
			bound = "≥"
		}
		sustainable, headroom, needed := "-", "-", "-"
		if s.GetKnown() {
			sustainable = bound + rate(s.GetTokensPerSecondPerGpu())
		}
		if u.GetHeadroomKnown() {
			headroom = bound + pct(u.GetHeadroom())
		}
		// The GPUs the grown peak needs (--growth), else the observed peak.
		for _, n := range u.GetGpusNeeded() {
			if strings.HasPrefix(n.GetFor(), "growth ") || (needed == "-" && n.GetFor() == "observed peak") {
				lower := ""
				if bound != "" {
					lower = "≤" // a lower bound of the load per GPU: at most this many GPUs
				}
				needed = fmt.Sprintf("%s%d (%+d, %s)", lower, n.GetGpus(), n.GetChange(), n.GetFor())
			}
		}
		growth := "-"
		if t := u.GetTrend(); t.GetGrowthKnown() {
			growth = fmt.Sprintf("%+.1f%%", 100*t.GetTokensGrowth())
		}
		util, perGPU, peak := "-", "-", "-"
		if u.GetGpuHours() > 0 {
			util, perGPU = pct(u.GetUtilization()), rate(u.GetTokensPerSecondPerGpu())
		}
		if p := u.GetPeak(); p != nil && p.GetGpus() > 0 {
			peak = rate(p.GetTokensPerSecondPerGpu())
		}
		g.add(u.GetName(), fmt.Sprint(u.GetMaxGpus()), util, perGPU, peak, sustainable, headroom, needed, growth,
			moneyText(u.GetCost()), moneyText(u.GetIdleCost()))
	}
	if err := g.writeTable(w); err != nil {
		return err
	}
	if len(r.GetFindings()) > 0 {
		fmt.Fprintln(w, "\nFindings:")
	}
	for _, f := range r.GetFindings() {
		fmt.Fprintf(w, "  [%s] %s: %s\n", strings.ReplaceAll(f.GetKind(), "_", " "), f.GetUnit(), f.GetText())
	}
	return render.PlanText(w, r)
}

// moneyText is an amount rounded to cents, with its currency.
func moneyText(m *meterv1.Money) string {
	if m.GetAmount() == "" {
		return "-"
	}
	f, err := strconv.ParseFloat(m.GetAmount(), 64)
	if err != nil {
		return m.GetAmount() + " " + m.GetCurrency()
	}
	return strconv.FormatFloat(f, 'f', 2, 64) + " " + m.GetCurrency()
}
