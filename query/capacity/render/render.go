// Package render writes a capacity report (meterv1.CapacityReport, the
// answer of ReportService.GetCapacityReport) as a CSV file with one row per
// unit and as one self-contained HTML file with cards and SVG charts. The
// API server and meterctl share it, so that a report downloaded over REST
// and one rendered by meterctl from the JSON answer are the same bytes.
//
// It computes no figure: every number comes from the report (whose fields
// are defined in report.proto), and a figure the report does not know (a
// utilization without GPU samples, a sustainable throughput without enough
// qualifying hours, a forecast of too few weeks) is left empty in the CSV
// and shown as unknown, with the reason, in the HTML. It does not fetch
// reports.
package render

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"tokenmeter/internal/numtext"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// units returns the rows of a report: the fleet first (when the report has
// one), then the units in the report's order, then the others (the units
// beyond the report's max_units, summed), when there are.
func units(r *meterv1.CapacityReport) []*meterv1.CapacityUnit {
	var out []*meterv1.CapacityUnit
	if f := r.GetFleet(); f != nil {
		out = append(out, f)
	}
	for _, u := range r.GetUnits() {
		if u != nil {
			out = append(out, u)
		}
	}
	if o := r.GetOthers(); o != nil {
		out = append(out, o)
	}
	return out
}

// othersNote says how many units the report summed into its others, or
// nothing when it listed every unit.
func othersNote(r *meterv1.CapacityReport) string {
	n := r.GetUnitsInOthers()
	if n == 0 || r.GetOthers() == nil {
		return ""
	}
	return fmt.Sprintf("%s %ss beyond the %s largest (by GPU time, then tokens) are summed into %s: its counts, tokens, GPU time and cost are their exact sums (ask for up to 100 units with max_units, or one deployment)",
		countU(uint64(n)), unitNoun(r.GetGroupBy()), countU(uint64(r.GetMaxUnits())), r.GetOthers().GetName())
}

// unitNoun is a unit of group_by g in running text.
func unitNoun(g string) string {
	switch g {
	case "model":
		return "model"
	case "gpu_type":
		return "GPU type"
	}
	return "deployment"
}

// hasGPUs tells whether the unit's GPU figures (means, ratios, per-GPU
// rates) are defined: it has sampled GPU time.
func hasGPUs(u *meterv1.CapacityUnit) bool {
	return u.GetHoursWithGpus() > 0 && u.GetGpuHours() > 0
}

// hasTraffic tells whether the unit's attainment is defined.
func hasTraffic(u *meterv1.CapacityUnit) bool { return u.GetRequests() > 0 }

// Slots of the GPUs-needed entries: each entry's "for" names its load.
const (
	slotPeak = iota
	slotGrowth
	slotTarget
	slotForecast
	numSlots
)

// slotNames are the column prefixes of the slots.
var slotNames = [numSlots]string{"observed_peak", "growth", "target", "forecast"}

// neededSlot returns the slot of a GPUs-needed entry from its "for"
// ("observed peak", "growth 1.3", "target 5000 tokens/s", "forecast
// peak"), or -1 for a load it does not know.
func neededSlot(forWhat string) int {
	f := strings.ToLower(strings.TrimSpace(forWhat))
	switch {
	case strings.HasPrefix(f, "forecast"):
		return slotForecast
	case strings.HasPrefix(f, "target"):
		return slotTarget
	case strings.HasPrefix(f, "grow"):
		return slotGrowth
	case strings.HasPrefix(f, "observed") || f == "peak":
		return slotPeak
	}
	return -1
}

// finite replaces NaN and infinities (never in a valid report) by 0, so
// that no chart coordinate or CSV cell is "NaN".
func finite(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return v
}

// num is v in the shortest decimal form that reads back as v, without an
// exponent: the CSV writes figures exactly as the report holds them.
func num(v float64) string { return strconv.FormatFloat(finite(v), 'f', -1, 64) }

// grouped is v with decimals decimals and thousands separators,
// "12,345.6"; a value that rounds to zero has no minus sign.
func grouped(v float64, decimals int) string {
	s := strconv.FormatFloat(finite(v), 'f', decimals, 64)
	if strings.Trim(s, "-0.") == "" {
		s = strings.TrimPrefix(s, "-")
	}
	return numtext.Group(s)
}

// human is v with as many decimals as its size calls for: none from 100
// on, one from 10, two below.
func human(v float64) string {
	a := math.Abs(finite(v))
	switch {
	case a >= 100:
		return grouped(v, 0)
	case a >= 10:
		return grouped(v, 1)
	}
	return grouped(v, 2)
}

// countInt is n with thousands separators, exact for every int64.
func countInt(n int64) string { return numtext.Group(strconv.FormatInt(n, 10)) }

// countU is n with thousands separators, exact for every uint64.
func countU(n uint64) string { return numtext.Group(strconv.FormatUint(n, 10)) }

// percent is a share as a percentage with one decimal, "73.4%".
func percent(v float64) string { return grouped(v*100, 1) + "%" }

// signedPercent is a growth rate with its sign, "+5.0%".
func signedPercent(v float64) string {
	s := percent(v)
	if !strings.HasPrefix(s, "-") && finite(v)*1000 >= 0.5 {
		s = "+" + s
	}
	return s
}

// money is an amount rounded to the cent (half away from zero, on the
// exact nanos) with thousands separators and the currency, "USD 1,234.57".
func money(m *meterv1.Money, currency string) string {
	if m == nil {
		return "—"
	}
	n := m.GetNanos()
	cents, rem := n/10_000_000, n%10_000_000
	if rem >= 5_000_000 {
		cents++
	} else if rem <= -5_000_000 {
		cents--
	}
	neg := cents < 0
	if neg {
		cents = -cents
	}
	s := countInt(cents/100) + "." + strconv.FormatInt(100+cents%100, 10)[1:]
	if neg {
		s = "-" + s
	}
	cur := m.GetCurrency()
	if cur == "" {
		cur = currency
	}
	if cur == "" {
		return s
	}
	return cur + " " + s
}

// hourText is an instant as a reader writes it, "2026-11-03 14:00 UTC".
func hourText(t time.Time) string { return t.UTC().Format("2006-01-02 15:04 UTC") }

// dayText is the day of an instant, "2026-11-03".
func dayText(t time.Time) string { return t.UTC().Format("2006-01-02") }

// rfc3339 is an instant in RFC 3339, UTC.
func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// FileName is the name of a report file with the given extension ("csv",
// "html", "json"): "capacity-20261101T00Z-20261201T00Z.csv".
func FileName(r *meterv1.CapacityReport, ext string) string {
	const layout = "20060102T15Z"
	return "capacity-" + r.GetStart().AsTime().UTC().Format(layout) + "-" + r.GetEnd().AsTime().UTC().Format(layout) + "." + ext
}
