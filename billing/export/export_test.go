package export_test

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"tokenmeter/billing"
	"tokenmeter/billing/export"
)

func TestParseFormat(t *testing.T) {
	tests := []struct {
		name, contentType string
		want              export.Format
	}{
		{"csv", "text/csv; charset=utf-8", export.CSV},
		{"jsonl", "application/x-ndjson", export.JSONLines},
		{"parquet", "application/vnd.apache.parquet", export.Parquet},
		{"focus-csv", "text/csv; charset=utf-8", export.FocusCSV},
		{"focus-parquet", "application/vnd.apache.parquet", export.FocusParquet},
	}
	for _, tt := range tests {
		got, err := export.ParseFormat(tt.name)
		if err != nil || got != tt.want || got.ContentType() != tt.contentType {
			t.Errorf("ParseFormat(%q) = %q (%s), %v; want %q (%s)", tt.name, got, got.ContentType(), err, tt.want, tt.contentType)
		}
	}
	for _, bad := range []string{"", "CSV", "xlsx", "json", "focus"} {
		_, err := export.ParseFormat(bad)
		if !errors.Is(err, export.ErrUnknownFormat) {
			t.Errorf("ParseFormat(%q): got %v, want ErrUnknownFormat", bad, err)
			continue
		}
		for _, f := range export.Formats() {
			if !strings.Contains(err.Error(), string(f)) {
				t.Errorf("ParseFormat(%q) error %q does not name %s", bad, err, f)
			}
		}
	}
	if _, err := export.NewUsageCostWriter(io.Discard, "xlsx", export.Options{}); !errors.Is(err, export.ErrUnknownFormat) {
		t.Errorf("NewUsageCostWriter(xlsx): got %v, want ErrUnknownFormat", err)
	}
}

// encodeStatements writes the rows of sts in f.
func encodeStatements(t testing.TB, f export.Format, opts export.Options, rows []export.StatementRow) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := export.NewStatementWriter(&buf, f, opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if err := w.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func encodeUsage(t testing.TB, f export.Format, opts export.Options, rows []export.UsageCostRow) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := export.NewUsageCostWriter(&buf, f, opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if err := w.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func readCSV(t *testing.T, data []byte) [][]string {
	t.Helper()
	recs, err := csv.NewReader(bytes.NewReader(data)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// TestStatementCSV pins the header and the first line of a statement in
// CSV, with and without the finance columns, and checks the charges add up
// exactly to the statement's.
func TestStatementCSV(t *testing.T) {
	st := testStatement(t, "acme")
	rows := export.StatementRows(st)
	recs := readCSV(t, encodeStatements(t, export.CSV, export.Options{}, rows))
	wantHeader := []string{"tenant", "period", "zone", "period_start", "period_end", "currency", "price_book", "statement_hash",
		"kind", "model", "deployment", "original_period", "charge_start", "charge_end", "price_id", "priced",
		"requests", "input_tokens", "cached_input_tokens", "output_tokens",
		"input_per_1m", "cached_input_per_1m", "output_per_1m", "charge"}
	if diff := cmp.Diff(wantHeader, recs[0]); diff != "" {
		t.Errorf("header (-want +got):\n%s", diff)
	}
	wantFirst := []string{"acme", "2026-11", "'+05:30", // a text cell starting with + has an apostrophe (safecsv)
		"2026-10-31T18:30:00Z", "2026-11-30T18:30:00Z", "USD", st.PriceBook, st.Hash,
		"usage", "m", "d1", "", "2026-11-15T10:00:00Z", "2026-11-15T12:00:00Z", "token:m@2026-01-01T00:00:00Z", "true",
		"6", "1500001", "400000", "100003", "0.6", "0.3", "1.8", "0.960006"}
	if diff := cmp.Diff(wantFirst, recs[1]); diff != "" {
		t.Errorf("first line (-want +got):\n%s", diff)
	}
	if len(recs) != len(st.Lines)+1 {
		t.Fatalf("got %d records, want a header and %d lines", len(recs), len(st.Lines))
	}
	var sum billing.Money
	for _, rec := range recs[1:] {
		m, err := billing.ParseMoney(rec[len(rec)-1])
		if err != nil {
			t.Fatal(err)
		}
		sum += m
	}
	if sum != st.Charge {
		t.Errorf("sum of CSV charges %s, want the statement's %s", sum, st.Charge)
	}
	if adj := recs[len(recs)-2]; adj[8] != "adjustment" || adj[11] != "2026-10" {
		t.Errorf("line %v: want the adjustment of 2026-10", adj)
	}
	if last := recs[len(recs)-1]; last[8] != "repricing" || last[11] != "2026-10" || last[len(last)-1] != "-1.234567891" {
		t.Errorf("last line %v: want the repricing of 2026-10, a credit of 1.234567891", last)
	}

	rows[0].Finance = &export.LineFinance{AllocatedCost: 400_000_000, Margin: 560_006_000}
	fin := readCSV(t, encodeStatements(t, export.CSV, export.Options{Finance: true}, rows))
	if diff := cmp.Diff(append(wantHeader, "allocated_cost", "margin"), fin[0]); diff != "" {
		t.Errorf("finance header (-want +got):\n%s", diff)
	}
	if got := fin[1][len(fin[1])-2:]; !slicesEqual(got, []string{"0.4", "0.560006"}) {
		t.Errorf("finance figures of line 1: got %v, want [0.4 0.560006]", got)
	}
	if got := fin[2][len(fin[2])-2:]; !slicesEqual(got, []string{"", ""}) {
		t.Errorf("finance figures of line 2 (none given): got %v, want nulls", got)
	}
}

func slicesEqual(a, b []string) bool { return cmp.Equal(a, b) }

// TestStatementJSONLines pins a JSON line: money as exact decimal strings,
// times in UTC, the finance keys only with Finance.
func TestStatementJSONLines(t *testing.T) {
	st := testStatement(t, "acme")
	rows := export.StatementRows(st)
	data := encodeStatements(t, export.JSONLines, export.Options{}, rows)
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	if len(lines) != len(st.Lines) {
		t.Fatalf("got %d lines, want %d", len(lines), len(st.Lines))
	}
	want := `{"tenant":"acme","period":"2026-11","zone":"+05:30","period_start":"2026-10-31T18:30:00Z","period_end":"2026-11-30T18:30:00Z",` +
		`"currency":"USD","price_book":"` + st.PriceBook + `","statement_hash":"` + st.Hash + `","kind":"usage","model":"m","deployment":"d1",` +
		`"original_period":"","charge_start":"2026-11-15T10:00:00Z","charge_end":"2026-11-15T12:00:00Z","price_id":"token:m@2026-01-01T00:00:00Z",` +
		`"priced":true,"requests":6,"input_tokens":1500001,"cached_input_tokens":400000,"output_tokens":100003,` +
		`"input_per_1m":"0.6","cached_input_per_1m":"0.3","output_per_1m":"1.8","charge":"0.960006"}`
	if lines[0] != want {
		t.Errorf("first line:\n got %s\nwant %s", lines[0], want)
	}
	var sum billing.Money
	for _, l := range lines {
		var v struct {
			Charge billing.Money `json:"charge"`
		}
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatal(err)
		}
		sum += v.Charge
	}
	if sum != st.Charge {
		t.Errorf("sum of JSON charges %s, want %s", sum, st.Charge)
	}
	rows[0].Finance = &export.LineFinance{AllocatedCost: 1, Margin: 2}
	fin := strings.Split(string(encodeStatements(t, export.JSONLines, export.Options{Finance: true}, rows)), "\n")
	if !strings.HasSuffix(fin[0], `"allocated_cost":"0.000000001","margin":"0.000000002"}`) ||
		!strings.HasSuffix(fin[1], `"allocated_cost":null,"margin":null}`) {
		t.Errorf("finance lines: %s\n%s", fin[0], fin[1])
	}
	if strings.Contains(string(data), "allocated_cost") {
		t.Error("tenant export has allocated_cost")
	}
}

// TestUsageCostCSV pins the header and a row of the detailed dataset; the
// margin is list charge − allocated cost.
func TestUsageCostCSV(t *testing.T) {
	rows := usageRows(t, 3)
	recs := readCSV(t, encodeUsage(t, export.CSV, export.Options{Finance: true}, rows))
	wantHeader := []string{"charge_period_start", "charge_period_end", "billing_period", "billing_period_start", "billing_period_end",
		"tenant", "model", "deployment", "requests", "input_tokens", "cached_input_tokens", "output_tokens",
		"currency", "input_per_1m", "cached_input_per_1m", "output_per_1m", "list_charge", "allocated_cost", "margin",
		"price_id", "price_book"}
	if diff := cmp.Diff(wantHeader, recs[0]); diff != "" {
		t.Errorf("header (-want +got):\n%s", diff)
	}
	r := rows[0]
	want := []string{"2026-11-01T00:00:00Z", "2026-11-01T01:00:00Z", "2026-11", "2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z",
		"tenant-00", "m", "dep-0", uintString(r.Requests), uintString(r.InputTokens), uintString(r.CachedInputTokens), uintString(r.OutputTokens),
		"USD", "0.6", "0.3", "1.8", r.ListCharge.String(), r.AllocatedCost.String(), (r.ListCharge - r.AllocatedCost).String(),
		"token:m@2026-01-01T00:00:00Z", r.PriceBook}
	if diff := cmp.Diff(want, recs[1]); diff != "" {
		t.Errorf("row (-want +got):\n%s", diff)
	}
	tenant := readCSV(t, encodeUsage(t, export.CSV, export.Options{}, rows))
	if slicesContain(tenant[0], "allocated_cost") || slicesContain(tenant[0], "margin") {
		t.Errorf("header without finance %v has finance columns", tenant[0])
	}
}

func uintString(n uint64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

func slicesContain(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestDeterministic encodes the same rows twice in every format of both
// datasets, with and without finance, and wants identical bytes.
func TestDeterministic(t *testing.T) {
	st := testStatement(t, "acme")
	stRows := append(export.StatementRows(st), export.StatementRows(testStatement(t, "globex"))...)
	stRows[1].Finance = &export.LineFinance{AllocatedCost: 123, Margin: 456}
	usage := usageRows(t, 5000)
	for _, f := range export.Formats() {
		for _, finance := range []bool{false, true} {
			opts := export.Options{Finance: finance, RowGroupRows: 1000}
			a, b := encodeStatements(t, f, opts, stRows), encodeStatements(t, f, opts, stRows)
			if len(a) == 0 || !bytes.Equal(a, b) {
				t.Errorf("%s statements (finance %v): %d and %d bytes differ", f, finance, len(a), len(b))
			}
			a, b = encodeUsage(t, f, opts, usage), encodeUsage(t, f, opts, usage)
			if len(a) == 0 || !bytes.Equal(a, b) {
				t.Errorf("%s usage (finance %v): %d and %d bytes differ", f, finance, len(a), len(b))
			}
		}
	}
}

// TestStatementRowsCarryFinance checks that the finance part of a statement
// reaches its usage lines' rows, and nothing of it the tenant's view.
func TestStatementRowsCarryFinance(t *testing.T) {
	st := billing.Statement{Tenant: "acme", Period: "2026-11", Lines: []billing.StatementLine{
		{Kind: billing.LineUsage, Model: "m", Charge: 100}, {Kind: billing.LineAdjustment, Model: "m", Charge: 5}}}
	st.Finance = &billing.StatementFinance{Lines: []billing.LineCost{{Line: 0, AllocatedCost: 30, Margin: 70}}}
	rows := export.StatementRows(st)
	if rows[0].Finance == nil || rows[0].Finance.AllocatedCost != 30 || rows[0].Finance.Margin != 70 || rows[1].Finance != nil {
		t.Errorf("finance rows %+v, %+v", rows[0].Finance, rows[1].Finance)
	}
	st.Finance = nil
	for _, r := range export.StatementRows(st) {
		if r.Finance != nil {
			t.Errorf("tenant's view row has finance %+v", r.Finance)
		}
	}
}
