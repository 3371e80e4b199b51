package render

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"tokenmeter/internal/safecsv"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// csvHeader names the columns of the CSV file, one row per unit. Shares
// (utilization, idle share, attainment, headroom, growth) are fractions
// (0.734, not 73.4); amounts are the report's exact decimal strings in
// currency; instants are RFC 3339 UTC; lists are joined with "|".
var csvHeader = func() []string {
	h := []string{
		"name", "deployments", "models", "gpu_types",
		"hours", "hours_with_gpus", "mean_gpus", "max_gpus", "max_gpu_equivalents",
		"gpu_hours", "busy_gpu_hours", "idle_gpu_hours", "unpriced_gpu_hours",
		"utilization", "p95_utilization", "idle_share",
		"currency", "cost", "busy_cost", "idle_cost",
		"requests", "good_requests", "input_tokens", "output_tokens", "attainment",
		"tokens_per_second_per_gpu",
		"peak_hour", "peak_tokens_per_second", "peak_gpus", "peak_tokens_per_second_per_gpu", "peak_requests", "peak_attainment",
		"sustainable_known", "sustainable_tokens_per_second_per_gpu", "sustainable_hour",
		"sustainable_supporting_hours", "sustainable_missed_hours", "sustainable_qualifying_hours",
		"sustainable_lower_bound", "sustainable_saturated", "sustainable_reason",
		"headroom",
	}
	for _, s := range slotNames {
		p := "gpus_needed_" + s
		h = append(h, p+"_for", p+"_tokens_per_second", p, p+"_change", p+"_arithmetic")
	}
	return append(h,
		"weeks", "weekly_tokens_growth", "weekly_peak_growth", "trend_reason",
		"forecast_at", "forecast_peak_tokens_per_second", "forecast_slope_per_week", "forecast_r2", "forecast_weeks")
}()

// csvTextColumn reports whether a column of the CSV holds text (names,
// lists, currency, instants, booleans, reasons and arithmetic); every other
// column holds numbers. safecsv escapes text cells so that none opens as a
// spreadsheet formula (a deployment named "=HYPERLINK(...)"), and writes
// number cells as plain numbers (a growth of -0.25 stays a number).
func csvTextColumn(column string) bool {
	switch column {
	case "name", "deployments", "models", "gpu_types", "currency", "peak_hour",
		"sustainable_known", "sustainable_hour", "sustainable_lower_bound", "sustainable_saturated", "sustainable_reason",
		"trend_reason", "forecast_at":
		return true
	}
	return strings.HasPrefix(column, "gpus_needed_") && (strings.HasSuffix(column, "_for") || strings.HasSuffix(column, "_arithmetic"))
}

// CSV writes r as a CSV file: a header row, then one row per unit, the
// fleet first. A figure the report does not know is an empty cell, never
// 0. The findings are not rows of this file (they are in the HTML and the
// JSON). A report with not enough data has only the header: it supports
// no figure (the JSON and HTML say why).
func CSV(w io.Writer, r *meterv1.CapacityReport) error {
	cw := safecsv.NewWriter(w, safecsv.Numeric(csvHeader, func(c string) bool { return !csvTextColumn(c) }))
	if err := cw.Write(csvHeader); err != nil {
		return fmt.Errorf("write capacity CSV: %w", err)
	}
	var rows []*meterv1.CapacityUnit
	if r.GetNotEnoughData() == "" {
		rows = units(r)
	}
	for _, u := range rows {
		row, err := csvRow(r, u)
		if err != nil {
			return err
		}
		if err := cw.Write(row); err != nil {
			return fmt.Errorf("write capacity CSV: %w", err)
		}
	}
	if err := cw.Flush(); err != nil {
		return fmt.Errorf("write capacity CSV: %w", err)
	}
	return nil
}

// csvRow is the row of one unit.
func csvRow(r *meterv1.CapacityReport, u *meterv1.CapacityUnit) ([]string, error) {
	gpus, traffic := hasGPUs(u), hasTraffic(u)
	when := func(ok bool, s string) string {
		if ok {
			return s
		}
		return ""
	}
	amount := func(m *meterv1.Money) string { return m.GetAmount() } // "" when absent
	currency := r.GetCurrency()
	for _, m := range []*meterv1.Money{u.GetCost(), u.GetBusyCost(), u.GetIdleCost()} {
		if c := m.GetCurrency(); c != "" {
			currency = c
			break
		}
	}
	row := []string{
		u.GetName(), strings.Join(u.GetDeployments(), "|"), strings.Join(u.GetModels(), "|"), strings.Join(u.GetGpuTypes(), "|"),
		strconv.Itoa(int(u.GetHours())), strconv.Itoa(int(u.GetHoursWithGpus())),
		when(u.GetHoursWithGpus() > 0, num(u.GetMeanGpus())), strconv.FormatUint(uint64(u.GetMaxGpus()), 10),
		when(u.GetHoursWithGpus() > 0, num(u.GetMaxGpuEquivalents())),
		num(u.GetGpuHours()), num(u.GetBusyGpuHours()), num(u.GetIdleGpuHours()), num(u.GetUnpricedGpuHours()),
		when(gpus, num(u.GetUtilization())), when(gpus, num(u.GetP95Utilization())), when(gpus, num(u.GetIdleShare())),
		currency, amount(u.GetCost()), amount(u.GetBusyCost()), amount(u.GetIdleCost()),
		strconv.FormatUint(u.GetRequests(), 10), strconv.FormatUint(u.GetGoodRequests(), 10),
		strconv.FormatUint(u.GetInputTokens(), 10), strconv.FormatUint(u.GetOutputTokens(), 10),
		when(traffic, num(u.GetAttainment())),
		when(gpus, num(u.GetTokensPerSecondPerGpu())),
	}

	if p := u.GetPeak(); p != nil {
		row = append(row, rfc3339(p.GetStart().AsTime()), num(p.GetTokensPerSecond()), num(p.GetGpus()),
			when(p.GetGpus() > 0, num(p.GetTokensPerSecondPerGpu())), strconv.FormatUint(p.GetRequests(), 10),
			when(p.GetRequests() > 0, num(p.GetAttainment())))
	} else {
		row = append(row, "", "", "", "", "", "")
	}

	if s := u.GetSustainable(); s != nil {
		k := s.GetKnown()
		hour := ""
		if k && s.GetHour() != nil {
			hour = rfc3339(s.GetHour().AsTime())
		}
		row = append(row, strconv.FormatBool(k), when(k, num(s.GetTokensPerSecondPerGpu())), hour,
			when(k, strconv.Itoa(int(s.GetSupportingHours()))), when(k, strconv.Itoa(int(s.GetMissedHours()))),
			strconv.Itoa(int(s.GetQualifyingHours())), when(k, strconv.FormatBool(s.GetLowerBound())),
			strconv.FormatBool(s.GetSaturated()), s.GetReason())
	} else {
		row = append(row, "false", "", "", "", "", "", "", "", "")
	}

	row = append(row, when(u.GetHeadroomKnown(), num(u.GetHeadroom())))

	var slots [numSlots][]string
	for _, n := range u.GetGpusNeeded() {
		i := neededSlot(n.GetFor())
		if i < 0 {
			return nil, fmt.Errorf("write capacity CSV: unit %q: GPUs needed for %q: not a load this file has columns for", u.GetName(), n.GetFor())
		}
		if slots[i] != nil {
			return nil, fmt.Errorf("write capacity CSV: unit %q: GPUs needed for %q listed twice", u.GetName(), slotNames[i])
		}
		slots[i] = []string{n.GetFor(), num(n.GetTokensPerSecond()), strconv.FormatInt(n.GetGpus(), 10),
			strconv.FormatInt(n.GetChange(), 10), n.GetArithmetic()}
	}
	for _, s := range slots {
		if s == nil {
			s = []string{"", "", "", "", ""}
		}
		row = append(row, s...)
	}

	t := u.GetTrend()
	g := t.GetGrowthKnown()
	row = append(row, strconv.Itoa(len(t.GetWeeks())), when(g, num(t.GetTokensGrowth())), when(g, num(t.GetPeakGrowth())), t.GetReason())
	if f := t.GetForecast(); f != nil {
		row = append(row, rfc3339(f.GetAt().AsTime()), num(f.GetTokensPerSecond()), num(f.GetSlope()), num(f.GetR2()),
			strconv.Itoa(int(f.GetWeeks())))
	} else {
		row = append(row, "", "", "", "", "")
	}
	if len(row) != len(csvHeader) {
		// A bug of this file; caught by its tests.
		return nil, fmt.Errorf("write capacity CSV: row of %d cells, header of %d", len(row), len(csvHeader))
	}
	return row, nil
}
