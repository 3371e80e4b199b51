package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"tokenmeter/internal/safecsv"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// usageConfig is the configuration of "usage".
type usageConfig struct {
	selection
	Granularity string
}

var (
	granularities = []string{"minute", "hour", "day", "month", "total"}
	groupColumns  = []string{"tenant_id", "model", "deployment", "model_version", "engine", "tensor_parallelism"}
	outputs       = []string{"table", "csv", "json"}

	// usageShape is the selection of GET /v1/usage: top-level parameters,
	// any instants (the default end on a whole second).
	usageShape = selectorShape{unit: time.Second, groupFields: groupColumns, tenant: true}
)

// Validate reports every problem at once.
func (c usageConfig) Validate() error {
	errs := c.selection.validate()
	if !slices.Contains(granularities, c.Granularity) {
		errs = append(errs, fmt.Errorf("--granularity %q: want %s", c.Granularity, strings.Join(granularities, ", ")))
	}
	return errors.Join(errs...)
}

func parseUsage(args []string, getenv func(string) string, now time.Time, stderr io.Writer) (usageConfig, error) {
	c := usageConfig{}
	fs := newFlagSet("usage", "[flags]",
		"Prints request and token totals per time bucket and group from GET /v1/usage.\n"+
			"Totals are exact and deduplicated by event_id.", stderr)
	finish := c.selection.register(fs, usageShape, "the API's answer")
	fs.StringVar(&c.Granularity, "granularity", "total", "bucket size: minute, hour, day, month or total")
	if err := parseFlags(fs, args); err != nil {
		return c, err
	}
	if err := finish(getenv, now); err != nil {
		return c, err
	}
	return c, c.Validate()
}

func runUsage(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := parseUsage(args, getenv, time.Now(), stderr)
	if err != nil {
		return err
	}
	if validatedOnly(stdout, cfg.ValidateOnly) {
		return nil
	}
	q := url.Values{}
	if cfg.Tenant != "" {
		q.Set("tenant_id", cfg.Tenant)
	}
	q.Set("start", cfg.Start.UTC().Format(time.RFC3339Nano))
	q.Set("end", cfg.End.UTC().Format(time.RFC3339Nano))
	q.Set("granularity", cfg.Granularity)
	for _, g := range cfg.GroupBy {
		q.Add("group_by", g)
	}
	body, err := newClient(cfg.connConfig, 1).do(ctx, http.MethodGet, "/v1/usage", q, nil)
	if err != nil {
		return err
	}
	if cfg.Output == "json" {
		var buf bytes.Buffer
		if err := json.Indent(&buf, body, "", "  "); err != nil {
			return fmt.Errorf("GET /v1/usage: answer is not JSON: %w", err)
		}
		buf.WriteByte('\n')
		_, err := buf.WriteTo(stdout)
		return err
	}
	var resp meterv1.GetUsageResponse
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(body, &resp); err != nil {
		return fmt.Errorf("GET /v1/usage: decode answer: %w", err)
	}
	if cfg.Output == "csv" {
		return writeUsageCSV(stdout, cfg.GroupBy, resp.GetBuckets())
	}
	if len(resp.GetBuckets()) == 0 {
		_, err := fmt.Fprintf(stdout, "no usage in [%s, %s)\n", cfg.Start.UTC().Format(time.RFC3339), cfg.End.UTC().Format(time.RFC3339))
		return err
	}
	return writeUsageTable(stdout, cfg.GroupBy, resp.GetBuckets())
}

// groupValue returns bucket b's value of the group-by dimension g.
func groupValue(b *meterv1.UsageBucket, g string) string {
	switch g {
	case "tenant_id":
		return b.GetTenantId()
	case "model":
		return b.GetModel()
	case "deployment":
		return b.GetDeployment()
	case "model_version":
		return b.GetModelVersion()
	case "engine":
		return b.GetEngine()
	case "tensor_parallelism":
		return b.GetTensorParallelism()
	}
	return ""
}

// usageCounts are the numeric columns of a usage row, in output order.
func usageCounts(b *meterv1.UsageBucket) [5]int64 {
	return [5]int64{b.GetRequests(), b.GetErrors(), b.GetPromptTokens(), b.GetCachedPromptTokens(), b.GetOutputTokens()}
}

// writeUsageCSV writes the buckets as CSV through safecsv: the group-by
// columns as text that no spreadsheet takes as a formula, the counts as
// plain numbers.
func writeUsageCSV(w io.Writer, groupBy []string, buckets []*meterv1.UsageBucket) error {
	header := append(append([]string{"bucket_start"}, groupBy...),
		"requests", "errors", "prompt_tokens", "cached_prompt_tokens", "output_tokens")
	numeric := make([]bool, len(header))
	for i := 1 + len(groupBy); i < len(header); i++ {
		numeric[i] = true
	}
	cw := safecsv.NewWriter(w, numeric)
	if err := cw.Write(header); err != nil {
		return err
	}
	for _, b := range buckets {
		rec := []string{b.GetStart().AsTime().UTC().Format(time.RFC3339)}
		for _, g := range groupBy {
			rec = append(rec, groupValue(b, g))
		}
		for _, n := range usageCounts(b) {
			rec = append(rec, strconv.FormatInt(n, 10))
		}
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	return cw.Flush()
}

// writeUsageTable writes an aligned table, numbers right-aligned, with a
// TOTAL line when there is more than one row.
func writeUsageTable(w io.Writer, groupBy []string, buckets []*meterv1.UsageBucket) error {
	numHeads := [5]string{"REQUESTS", "ERRORS", "PROMPT", "CACHED", "OUTPUT"}
	groupHeads := map[string]string{"tenant_id": "TENANT", "model": "MODEL", "deployment": "DEPLOYMENT",
		"model_version": "VERSION", "engine": "ENGINE", "tensor_parallelism": "TP"}

	var total [5]int64
	rows := make([][5]int64, len(buckets))
	for i, b := range buckets {
		rows[i] = usageCounts(b)
		for j, n := range rows[i] {
			total[j] += n
		}
	}
	// tabwriter aligns cells to the left; pad numbers to their column's
	// width so that they line up on the right.
	var width [5]int
	for j, h := range numHeads {
		width[j] = max(len(h), len(strconv.FormatInt(total[j], 10)))
	}
	nums := func(v [5]int64) string {
		var sb strings.Builder
		for j, n := range v {
			fmt.Fprintf(&sb, "\t%*d", width[j], n)
		}
		return sb.String()
	}

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "BUCKET START")
	for _, g := range groupBy {
		fmt.Fprint(tw, "\t"+groupHeads[g])
	}
	for j, h := range numHeads {
		fmt.Fprintf(tw, "\t%*s", width[j], h)
	}
	fmt.Fprintln(tw)
	for i, b := range buckets {
		fmt.Fprint(tw, b.GetStart().AsTime().UTC().Format(time.RFC3339))
		for _, g := range groupBy {
			v := groupValue(b, g)
			if v == "" {
				v = "-"
			}
			fmt.Fprint(tw, "\t"+v)
		}
		fmt.Fprintln(tw, nums(rows[i]))
	}
	if len(buckets) > 1 {
		fmt.Fprint(tw, "TOTAL"+strings.Repeat("\t", len(groupBy)))
		fmt.Fprintln(tw, nums(total))
	}
	return tw.Flush()
}
