package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/internal/safecsv"
)

// This file holds what the series commands (latency, goodput, traffic,
// cost, gpu-usage) share: the selector flags, fetching every page of an
// answer, and writing rows as an aligned table or CSV.

var (
	steps = []string{"total", "minute", "hour", "day", "month"}
	// seriesGroupFields are the dimensions the metrics API groups by
	// (rollup.RollupGroupFields, in its order).
	seriesGroupFields = []string{"tenant_id", "model", "model_version", "deployment", "gpu_type", "slo_class"}
)

// maxPageSize is the most series the API returns in one answer.
const maxPageSize = 1000

// selectorShape is what a family of endpoints takes as its selector: where
// the parameters go, the unit the range lies on, the steps and group-by
// fields, and whether it takes a tenant.
type selectorShape struct {
	// prefix goes before every query parameter: "selector." where the
	// selector is a message field (the metrics API), "" where its fields
	// are the request's own (cost).
	prefix string
	// unit is what start and end must be whole multiples of, unitName its
	// name; without a name (usage) they may be any instant, and unit only
	// rounds the default end.
	unit     time.Duration
	unitName string
	// steps are the accepted steps, "total" first (the default), of the
	// series commands.
	steps []string
	// groupFields are the accepted group-by dimensions.
	groupFields []string
	// tenant says whether the endpoint takes tenant_id (--tenant).
	tenant bool
	// nothing names what an empty answer has none of, e.g. "requests".
	nothing string
}

// metricsShape is the SeriesSelector of latency, goodput and traffic.
var metricsShape = selectorShape{prefix: "selector.", unit: time.Minute, unitName: "minute",
	steps: steps, groupFields: seriesGroupFields, tenant: true, nothing: "requests"}

// selectorConfig is the configuration shared by the series commands: the
// selection, the step and the page size.
type selectorConfig struct {
	selection
	Step string
	// PageSize is the series asked per request; every page is fetched.
	PageSize int
}

// register adds the selection flags of shape, --step and --page-size to fs.
// The returned function completes c once fs has parsed the arguments.
func (c *selectorConfig) register(fs *flag.FlagSet, shape selectorShape) (finish func(getenv func(string) string, now time.Time) error) {
	finish = c.selection.register(fs, shape, "the API's answers, pages merged")
	fs.StringVar(&c.Step, "step", shape.steps[0], "step: "+shape.steps[0]+" (the whole range), "+orList(shape.steps[1:]))
	fs.IntVar(&c.PageSize, "page-size", maxPageSize, fmt.Sprintf("series per request, 1 to %d; every page is fetched", maxPageSize))
	return finish
}

// orList joins words as "a, b or c".
func orList(words []string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

// validate reports every problem of c.
func (c selectorConfig) validate() []error {
	errs := c.selection.validate()
	if !slices.Contains(c.shape.steps, c.Step) {
		errs = append(errs, fmt.Errorf("--step %q: want %s", c.Step, strings.Join(c.shape.steps, ", ")))
	}
	if c.PageSize < 1 || c.PageSize > maxPageSize {
		errs = append(errs, fmt.Errorf("--page-size %d: want 1 to %d", c.PageSize, maxPageSize))
	}
	return errs
}

// Validate reports every problem at once.
func (c selectorConfig) Validate() error { return errors.Join(c.validate()...) }

// parseSelectorFlags parses the flags of command name into c: the
// selector flags of shape and those extra adds (nil: none). The caller
// validates c with what its extra flags need.
func parseSelectorFlags(c *selectorConfig, name, about string, shape selectorShape, extra func(*flag.FlagSet), args []string, getenv func(string) string, now time.Time, stderr io.Writer) error {
	fs := newFlagSet(name, "[flags]", about, stderr)
	finish := c.register(fs, shape)
	if extra != nil {
		extra(fs)
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	return finish(getenv, now)
}

// parseSelectorCommand parses the flags of a command that takes only the
// selector flags of shape (goodput, traffic, gpu-usage).
func parseSelectorCommand(name, about string, shape selectorShape, args []string, getenv func(string) string, now time.Time, stderr io.Writer) (selectorConfig, error) {
	var c selectorConfig
	if err := parseSelectorFlags(&c, name, about, shape, nil, args, getenv, now, stderr); err != nil {
		return c, err
	}
	return c, c.Validate()
}

// query is the selector as REST query parameters.
func (c selectorConfig) query() url.Values {
	p := c.shape.prefix
	q := url.Values{}
	if c.Tenant != "" {
		q.Set(p+"tenant_id", c.Tenant)
	}
	q.Set(p+"start", c.Start.UTC().Format(time.RFC3339))
	q.Set(p+"end", c.End.UTC().Format(time.RFC3339))
	q.Set(p+"step", c.Step)
	for _, g := range c.GroupBy {
		q.Add(p+"group_by", g)
	}
	q.Set(p+"page_size", strconv.Itoa(c.PageSize))
	return q
}

// pageTokenParam is the query parameter that asks for a further page.
func (c selectorConfig) pageTokenParam() string { return c.shape.prefix + "page_token" }

// writeEmpty says that the selection holds nothing: the API answers no
// series then.
func (c selectorConfig) writeEmpty(w io.Writer) error {
	of := ""
	if c.Tenant != "" {
		of = " of tenant " + c.Tenant
	}
	_, err := fmt.Fprintf(w, "no %s%s in [%s, %s)\n", c.shape.nothing, of, c.Start.UTC().Format(time.RFC3339), c.End.UTC().Format(time.RFC3339))
	return err
}

// splitList splits a comma-separated flag value, dropping blanks and
// repeats.
func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" && !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

// pagedAnswer is a metrics answer that may continue on another page.
type pagedAnswer interface {
	proto.Message
	GetNextPageToken() string
}

// fetchPages GETs path with q, then every further page its answers point
// to, passing the token as the query parameter tokenParam, and hands each
// decoded page to add in order.
func fetchPages[T any, R interface {
	*T
	pagedAnswer
}](ctx context.Context, c *client, path string, q url.Values, tokenParam string, add func(R)) error {
	op := http.MethodGet + " " + path
	q = maps.Clone(q) // Set below replaces values, it never changes them
	seen := map[string]bool{}
	for {
		body, err := c.do(ctx, http.MethodGet, path, q, nil)
		if err != nil {
			return err
		}
		page := R(new(T))
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(body, page); err != nil {
			return fmt.Errorf("%s: decode answer: %w", op, err)
		}
		add(page)
		next := page.GetNextPageToken()
		if next == "" {
			return nil
		}
		if seen[next] {
			return fmt.Errorf("%s: the server repeated page token %q", op, next)
		}
		seen[next] = true
		q.Set(tokenParam, next)
	}
}

// writeJSON writes m as the gateway does (proto field names, zero values
// included, unset messages left out), indented.
func writeJSON(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{UseProtoNames: true, EmitDefaultValues: true}.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode answer: %w", err)
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, b, "", "  "); err != nil {
		return fmt.Errorf("encode answer: %w", err)
	}
	buf.WriteByte('\n')
	_, err = buf.WriteTo(w)
	return err
}

// column is a column of a grid.
type column struct {
	// head is the table header, csvHead the CSV header.
	head, csvHead string
	// num right-aligns the column in tables.
	num bool
}

// numColumns returns right-aligned columns whose CSV header is the table
// header in lower case.
func numColumns(heads ...string) []column {
	out := make([]column, len(heads))
	for i, h := range heads {
		out[i] = column{head: h, csvHead: strings.ToLower(h), num: true}
	}
	return out
}

// grid holds rows of cells, written as an aligned table or as CSV.
type grid struct {
	cols []column
	rows [][]string
}

func (g *grid) add(cells ...string) { g.rows = append(g.rows, cells) }

// writeCSV writes the grid as CSV through safecsv: the num columns as plain
// numbers, the others as text that no spreadsheet takes as a formula.
func (g *grid) writeCSV(w io.Writer) error {
	head := make([]string, len(g.cols))
	numeric := make([]bool, len(g.cols))
	for i, c := range g.cols {
		head[i], numeric[i] = c.csvHead, c.num
	}
	cw := safecsv.NewWriter(w, numeric)
	for _, rec := range append([][]string{head}, g.rows...) {
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	return cw.Flush()
}

// writeTable writes the rows aligned, text to the left and numbers to the
// right, two spaces apart.
func (g *grid) writeTable(w io.Writer) error {
	width := make([]int, len(g.cols))
	for i, c := range g.cols {
		width[i] = utf8.RuneCountInString(c.head)
	}
	for _, r := range g.rows {
		for i, s := range r {
			width[i] = max(width[i], utf8.RuneCountInString(s))
		}
	}
	bw := bufio.NewWriter(w)
	line := func(cells []string) {
		var sb strings.Builder
		for i, s := range cells {
			if i > 0 {
				sb.WriteString("  ")
			}
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(s))
			if g.cols[i].num {
				sb.WriteString(pad + s)
			} else {
				sb.WriteString(s + pad)
			}
		}
		bw.WriteString(strings.TrimRight(sb.String(), " "))
		bw.WriteByte('\n')
	}
	head := make([]string, len(g.cols))
	for i, c := range g.cols {
		head[i] = c.head
	}
	line(head)
	for _, r := range g.rows {
		line(r)
	}
	return bw.Flush()
}

// groupByColumns are the columns of the group-by dimensions.
func groupByColumns(groupBy []string) []column {
	out := make([]column, len(groupBy))
	for i, g := range groupBy {
		head := strings.ToUpper(g)
		if g == "tenant_id" {
			head = "TENANT"
		}
		out[i] = column{head: head, csvHead: g}
	}
	return out
}

// cellFormat turns values into cells: rounded for people in tables, at
// full precision for programs in CSV.
type cellFormat struct{ csv bool }

// summaryStart is the START cell of a series' summary row.
func (f cellFormat) summaryStart() string {
	if f.csv {
		return "summary"
	}
	return "SUMMARY"
}

func (f cellFormat) group(groupBy []string, g map[string]string) []string {
	out := make([]string, len(groupBy))
	for i, k := range groupBy {
		out[i] = g[k]
		if out[i] == "" && !f.csv {
			out[i] = "-"
		}
	}
	return out
}

func (f cellFormat) time(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func (f cellFormat) count(n uint64) string { return strconv.FormatUint(n, 10) }

// missing is the cell of a value that does not exist (a quantile of no
// requests).
func (f cellFormat) missing() string {
	if f.csv {
		return ""
	}
	return "-"
}

// float is a measurement (milliseconds, a rate): four significant digits
// with one to three decimals in tables, which is finer than the 1%
// accuracy of the histograms.
func (f cellFormat) float(v float64) string {
	if f.csv {
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	switch a := math.Abs(v); {
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 2, 64)
	default:
		return strconv.FormatFloat(v, 'f', 3, 64)
	}
}

// fixed is a dimensionless ratio with the given decimals in tables.
func (f cellFormat) fixed(v float64, decimals int) string {
	if f.csv {
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	return strconv.FormatFloat(v, 'f', decimals, 64)
}

// percent is a fraction in [0, 1]: a percentage with two decimals in
// tables, which never rounds a fraction that is not 0 or 1 to one that is;
// the fraction itself in CSV.
func (f cellFormat) percent(v float64) string {
	if f.csv {
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	s := strconv.FormatFloat(v*100, 'f', 2, 64) + "%"
	switch {
	case v > 0 && s == "0.00%":
		return "<0.01%"
	case v < 1 && s == "100.00%":
		return ">99.99%"
	}
	return s
}

// seriesOf is an answer's series of one group: a point per step and a
// summary over the whole range.
type seriesOf[P any] interface {
	GetGroup() map[string]string
	GetPoints() []P
	GetSummary() P
}

// stepPoint is a point of a series.
type stepPoint interface {
	GetStart() *timestamppb.Timestamp
}

// seriesRows calls row for every step of every series of all, then for
// the series' summary, with the group and START cells. With step total the
// one step is the summary, so only the summary rows are written.
func seriesRows[S seriesOf[P], P stepPoint](c selectorConfig, f cellFormat, all []S, row func(group []string, start string, p P)) {
	for _, s := range all {
		group := f.group(c.GroupBy, s.GetGroup())
		if c.Step != "total" {
			for _, p := range s.GetPoints() {
				row(group, f.time(p.GetStart().AsTime()), p)
			}
		}
		row(group, f.summaryStart(), s.GetSummary())
	}
}

// writeSeries writes a merged answer of n series as the --output asks: the
// API's JSON, CSV, or a table (or the no-data line). table reports whether a
// table was written, for commands that add a footer under it.
func (c selectorConfig) writeSeries(w io.Writer, all proto.Message, n int, build func(cellFormat) *grid) (table bool, err error) {
	switch c.Output {
	case "json":
		return false, writeJSON(w, all)
	case "csv":
		return false, build(cellFormat{csv: true}).writeCSV(w)
	}
	if n == 0 {
		return false, c.writeEmpty(w)
	}
	return true, build(cellFormat{}).writeTable(w)
}
