package render

import (
	"bytes"
	"encoding/csv"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// readCSV renders r and reads it back, one map per row keyed by column.
func readCSV(t *testing.T, r *meterv1.CapacityReport) []map[string]string {
	t.Helper()
	var buf bytes.Buffer
	if err := CSV(&buf, r); err != nil {
		t.Fatalf("CSV: %v", err)
	}
	records, err := csv.NewReader(&buf).ReadAll() // every record as long as the first
	if err != nil {
		t.Fatalf("read the CSV back: %v", err)
	}
	if len(records) == 0 {
		t.Fatal("no header row")
	}
	if diff := cmp.Diff(csvHeader, records[0]); diff != "" {
		t.Fatalf("header (-want +got):\n%s", diff)
	}
	var rows []map[string]string
	for _, rec := range records[1:] {
		m := map[string]string{}
		for i, v := range rec {
			m[records[0][i]] = v
		}
		rows = append(rows, m)
	}
	return rows
}

func TestCSVRowsAndExactValues(t *testing.T) {
	r := sampleReport()
	rows := readCSV(t, r)
	if got, want := len(rows), 1+len(r.GetUnits()); got != want {
		t.Fatalf("got %d rows, want %d (fleet and units)", got, want)
	}
	for i, u := range units(r) {
		row := rows[i]
		want := map[string]string{
			"name":                                  u.GetName(),
			"deployments":                           strings.Join(u.GetDeployments(), "|"),
			"hours":                                 strconv.Itoa(int(u.GetHours())),
			"max_gpus":                              strconv.Itoa(int(u.GetMaxGpus())),
			"mean_gpus":                             num(u.GetMeanGpus()),
			"utilization":                           num(u.GetUtilization()),
			"p95_utilization":                       num(u.GetP95Utilization()),
			"currency":                              "USD",
			"cost":                                  "12345.678901234",
			"busy_cost":                             "8000.000000001",
			"idle_cost":                             "4345.678901233",
			"requests":                              strconv.FormatUint(u.GetRequests(), 10),
			"input_tokens":                          strconv.FormatUint(u.GetInputTokens(), 10),
			"attainment":                            num(u.GetAttainment()),
			"peak_hour":                             rfc3339(u.GetPeak().GetStart().AsTime()),
			"peak_tokens_per_second_per_gpu":        num(u.GetPeak().GetTokensPerSecondPerGpu()),
			"sustainable_known":                     "true",
			"sustainable_tokens_per_second_per_gpu": num(u.GetSustainable().GetTokensPerSecondPerGpu()),
			"sustainable_supporting_hours":          strconv.Itoa(int(u.GetSustainable().GetSupportingHours())),
			"sustainable_lower_bound":               "false",
			"headroom":                              num(u.GetHeadroom()),
			"gpus_needed_observed_peak_for":         "observed peak",
			"gpus_needed_observed_peak":             strconv.FormatInt(u.GetGpusNeeded()[0].GetGpus(), 10),
			"gpus_needed_observed_peak_arithmetic":  u.GetGpusNeeded()[0].GetArithmetic(),
			"gpus_needed_growth_for":                "growth 1.3",
			"gpus_needed_growth_arithmetic":         u.GetGpusNeeded()[1].GetArithmetic(),
			"gpus_needed_target_for":                "",
			"gpus_needed_target":                    "",
			"gpus_needed_forecast":                  strconv.FormatInt(u.GetGpusNeeded()[2].GetGpus(), 10),
			"weeks":                                 "3",
			"weekly_tokens_growth":                  "0.03",
			"forecast_r2":                           "0.97",
			"forecast_weeks":                        "3",
			"forecast_at":                           rfc3339(u.GetTrend().GetForecast().GetAt().AsTime()),
		}
		for col, w := range want {
			if row[col] != w {
				t.Errorf("%s: %s = %q, want %q", u.GetName(), col, row[col], w)
			}
		}
	}
	// A value reads back as the report's float exactly.
	if got, err := strconv.ParseFloat(rows[1]["tokens_per_second_per_gpu"], 64); err != nil || got != r.GetUnits()[0].GetTokensPerSecondPerGpu() {
		t.Errorf("tokens_per_second_per_gpu reads back as %v (%v), want %v", got, err, r.GetUnits()[0].GetTokensPerSecondPerGpu())
	}
}

// TestCSVUnknownIsEmpty checks that a figure the report does not know is
// an empty cell, not 0.
func TestCSVUnknownIsEmpty(t *testing.T) {
	rows := readCSV(t, unknownReport())
	byName := map[string]map[string]string{}
	for _, r := range rows {
		byName[r["name"]] = r
	}
	tests := []struct {
		unit, col, want string
	}{
		{"no-gpus", "mean_gpus", ""},
		{"no-gpus", "utilization", ""},
		{"no-gpus", "p95_utilization", ""},
		{"no-gpus", "idle_share", ""},
		{"no-gpus", "tokens_per_second_per_gpu", ""},
		{"no-gpus", "gpu_hours", "0"}, // measured: no GPU time
		{"no-gpus", "attainment", "0.998"},
		{"no-gpus", "peak_gpus", "0"},
		{"no-gpus", "peak_tokens_per_second_per_gpu", ""},
		{"no-gpus", "sustainable_known", "false"},
		{"no-gpus", "sustainable_reason", "no GPU samples"},
		{"one-hour", "attainment", ""},
		{"one-hour", "peak_hour", ""},
		{"one-hour", "utilization", "0.5"},
		{"short", "sustainable_known", "false"},
		{"short", "sustainable_tokens_per_second_per_gpu", ""},
		{"short", "sustainable_hour", ""},
		{"short", "sustainable_supporting_hours", ""},
		{"short", "sustainable_missed_hours", ""},
		{"short", "sustainable_qualifying_hours", "3"},
		{"short", "sustainable_lower_bound", ""},
		{"short", "sustainable_reason", "only 3 qualifying hours; an estimate needs 24"},
		{"short", "headroom", ""},
		{"short", "gpus_needed_observed_peak", ""},
		{"short", "gpus_needed_observed_peak_arithmetic", ""},
		{"short", "weeks", "0"},
		{"short", "weekly_tokens_growth", ""},
		{"short", "weekly_peak_growth", ""},
		{"short", "trend_reason", "0 complete weeks in the range; growth needs 2"},
		{"short", "forecast_at", ""},
		{"short", "forecast_peak_tokens_per_second", ""},
		{"short", "forecast_r2", ""},
		{"fleet", "headroom", ""},
	}
	for _, tt := range tests {
		row, ok := byName[tt.unit]
		if !ok {
			t.Fatalf("no row %q", tt.unit)
		}
		if got := row[tt.col]; got != tt.want {
			t.Errorf("%s: %s = %q, want %q", tt.unit, tt.col, got, tt.want)
		}
	}
}

func TestCSVNotEnoughData(t *testing.T) {
	if rows := readCSV(t, emptyReport()); len(rows) != 0 {
		t.Errorf("got %d rows, want only the header: %v", len(rows), rows)
	}
}

func TestCSVRefusesAnUnknownLoad(t *testing.T) {
	r := sampleReport()
	r.Units[0].GpusNeeded = append(r.Units[0].GpusNeeded, &meterv1.GpusNeeded{For: "black friday", Gpus: 3})
	if err := CSV(&bytes.Buffer{}, r); err == nil {
		t.Error("CSV of a report with GPUs needed for an unknown load: no error")
	}
}

func TestFileName(t *testing.T) {
	if got, want := FileName(sampleReport(), "csv"), "capacity-20261102T00Z-20261123T00Z.csv"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestFormats(t *testing.T) {
	tests := []struct {
		got, want string
	}{
		{grouped(1234567.891, 1), "1,234,567.9"},
		{grouped(-1234.6, 0), "-1,235"},
		{grouped(-0.04, 1), "0.0"},
		{grouped(999, 0), "999"},
		{human(12345.6), "12,346"},
		{human(12.345), "12.3"},
		{human(1.2345), "1.23"},
		{percent(0.7345), "73.5%"},
		{signedPercent(0.05), "+5.0%"},
		{signedPercent(-0.05), "-5.0%"},
		{signedPercent(0), "0.0%"},
		{money(usd(1_234_565_000_000), ""), "USD 1,234.57"},
		{money(usd(1_234_564_999_999), ""), "USD 1,234.56"},
		{money(usd(-5_000_000), ""), "USD -0.01"},
		{money(usd(4_999_999), ""), "USD 0.00"},
		{money(nil, "USD"), "—"},
		{countInt(-1234567), "-1,234,567"},
		{countU(18446744073709551615), "18,446,744,073,709,551,615"},
		{num(0.1), "0.1"},
		{num(1e21), "1000000000000000000000"},
	}
	for i, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%d: got %q, want %q", i, tt.got, tt.want)
		}
	}
}

func TestNiceRange(t *testing.T) {
	tests := []struct {
		lo, hi         float64
		wantLo, wantHi float64
		wantTicks      int
	}{
		{0, 0, 0, 1, 6},       // empty range at 0
		{5, 5, 4.4, 5.6, 7},   // empty range elsewhere: widened by 10%, to round ends
		{0, 9.3, 0, 10, 6},    // to a round end
		{0, 2345, 0, 2500, 6}, // step 500
		{0.97, 1, 0.97, 1, 4}, // step 0.01
	}
	for _, tt := range tests {
		lo, hi, ticks := niceRange(tt.lo, tt.hi, 6)
		if diff := cmp.Diff([]float64{tt.wantLo, tt.wantHi}, []float64{lo, hi}, cmp.Comparer(func(a, b float64) bool { return abs(a-b) < 1e-9 })); diff != "" {
			t.Errorf("niceRange(%v, %v) (-want +got):\n%s", tt.lo, tt.hi, diff)
		}
		if len(ticks) != tt.wantTicks {
			t.Errorf("niceRange(%v, %v): got %d ticks %v, want %d", tt.lo, tt.hi, len(ticks), ticks, tt.wantTicks)
		}
	}
	if s := (scale{Lo: 3, Hi: 3, P0: 0, P1: 100}); s.at(3) != 50 {
		t.Errorf("a scale of an empty range puts its value at %v, want the middle, 50", s.at(3))
	}
}

func abs(v float64) float64 {
	if v < 0 {
		return -v
	}
	return v
}
