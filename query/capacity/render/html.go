package render

import (
	"bufio"
	_ "embed"
	"fmt"
	"html/template"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

//go:embed report.html.tmpl
var reportTemplate string

// page is the template's data: everything but the units' sections, which
// are laid out and written one at a time.
type page struct {
	Title, Range  string
	Params        []param
	NotEnoughData string
	// OthersNote says how many units are summed into the others.
	OthersNote string
	Findings   []finding
	Overview   []overviewRow
	GroupLabel string
	// Plans and FleetPlan are the fleet plan: cost per 1M tokens per
	// deployment and GPU type, the cheapest mixes and their sum.
	Plans     []planView
	FleetPlan *fleetPlanView
}

type param struct{ Label, Value string }

type finding struct {
	Class, Severity, Unit, Kind, Text string
}

// overviewRow is one unit in the table of units.
type overviewRow struct {
	Anchor, Name                                                string
	GPUs, Utilization, IdleCost, Attainment, Sustainable        string
	Headroom, HeadroomClass, NeededPeak, NeededGrowth, Findings string
}

// unitView is one unit's section.
type unitView struct {
	Anchor, Heading, Name string
	// Members lists the deployments, models and GPU types of the unit.
	Members []param
	Cards   []card
	Needed  []needed
	// NeededNote says why no GPUs-needed figure is given.
	NeededNote string
	Charts     []chart
}

// card is one summary figure. Key names it (data-key) and Raw holds the
// report's value (data-value; empty when unknown), for tests and scripts.
type card struct {
	Key, Label, Value, Sub, Class, Raw, Hint string
}

type needed struct {
	For, Load, GPUs, Change, Arithmetic string
}

var tmpl = template.Must(template.New("report").Funcs(template.FuncMap{
	"px":   px,
	"mid":  func(a, b float64) float64 { return (a + b) / 2 },
	"plus": func(a, b float64) float64 { return a + b },
}).Parse(reportTemplate))

// HTML writes r as one self-contained HTML file: no script, no external
// resource (a Content-Security-Policy meta tag forbids any), inline CSS and
// inline SVG charts. Every name in it is escaped. When r has not enough
// data the file says so and shows no figure. The file is written as it is
// laid out, one unit's section at a time (the fleet, the units, then the
// others), so that no more than one section is held in memory.
func HTML(w io.Writer, r *meterv1.CapacityReport) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	p := buildPage(r)
	if err := tmpl.ExecuteTemplate(bw, "top", p); err != nil {
		return fmt.Errorf("render capacity HTML: %w", err)
	}
	if p.NotEnoughData == "" {
		for _, s := range sections(r, p.GroupLabel) {
			if err := tmpl.ExecuteTemplate(bw, "unit", buildUnit(r, s.unit, s.anchor, s.heading)); err != nil {
				return fmt.Errorf("render capacity HTML: unit %q: %w", s.unit.GetName(), err)
			}
		}
	}
	if err := tmpl.ExecuteTemplate(bw, "bottom", p); err != nil {
		return fmt.Errorf("render capacity HTML: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write capacity HTML: %w", err)
	}
	return nil
}

// section is a unit's place in the file.
type section struct {
	unit            *meterv1.CapacityUnit
	anchor, heading string
}

// sections are the units' sections in order: the fleet, the units
// ("unit-1" on), the others.
func sections(r *meterv1.CapacityReport, groupLabel string) []section {
	var out []section
	if f := r.GetFleet(); f != nil {
		out = append(out, section{f, "fleet", "Fleet"})
	}
	for i, u := range r.GetUnits() {
		if u != nil {
			out = append(out, section{u, "unit-" + strconv.Itoa(i+1), groupLabel + " " + u.GetName()})
		}
	}
	if o := r.GetOthers(); o != nil {
		out = append(out, section{o, "others", "Others: " + countU(uint64(r.GetUnitsInOthers())) + " " + unitNoun(r.GetGroupBy()) + "s summed"})
	}
	return out
}

func buildPage(r *meterv1.CapacityReport) page {
	start, end := r.GetStart().AsTime(), r.GetEnd().AsTime()
	p := page{
		Title:         "Capacity report " + dayText(start) + " – " + dayText(end),
		Range:         hourText(start) + " – " + hourText(end) + " (end exclusive)",
		NotEnoughData: r.GetNotEnoughData(),
		GroupLabel:    groupLabel(r.GetGroupBy()),
	}
	targetLoad := "none"
	if t := r.GetTargetTokensPerSecond(); t > 0 {
		targetLoad = human(t) + " tokens/s"
	}
	p.Params = []param{
		{"Units", p.GroupLabel + "s"},
		{"Attainment target", percent(r.GetTarget())},
		{"Growth", "× " + r.GetGrowth()},
		{"Target load", targetLoad},
		{"Forecast horizon", strconv.Itoa(int(r.GetHorizonWeeks())) + " weeks"},
		{"Fewest requests of a qualifying hour", countU(r.GetMinHourRequests())},
		{"Miss tolerance", percent(r.GetMissTolerance())},
		{"Over-provisioned below utilization", percent(r.GetLowUtilization())},
		{"At risk below headroom", percent(r.GetHeadroomRisk())},
		{"Currency", r.GetCurrency()},
	}
	for _, f := range r.GetFindings() {
		sev := "information"
		switch f.GetSeverity() {
		case 2:
			sev = "act now"
		case 1:
			sev = "look at it"
		}
		p.Findings = append(p.Findings, finding{Class: "sev-" + strconv.Itoa(int(min(max(f.GetSeverity(), 0), 2))),
			Severity: sev, Unit: f.GetUnit(), Kind: f.GetKind(), Text: f.GetText()})
	}
	if p.NotEnoughData != "" {
		return p // no figure at all
	}
	p.OthersNote = othersNote(r)
	p.Plans, p.FleetPlan = plans(r), fleetPlan(r)
	for _, s := range sections(r, p.GroupLabel) {
		if s.anchor != "fleet" {
			p.Overview = append(p.Overview, overview(r, s.unit, s.anchor))
		}
	}
	return p
}

func groupLabel(g string) string {
	switch g {
	case "model":
		return "Model"
	case "gpu_type":
		return "GPU type"
	}
	return "Deployment"
}

const unknown = "—"

// overview is a unit's row in the table of units.
func overview(r *meterv1.CapacityReport, u *meterv1.CapacityUnit, anchor string) overviewRow {
	o := overviewRow{Anchor: anchor, Name: u.GetName(), GPUs: unknown, Utilization: unknown, IdleCost: money(u.GetIdleCost(), r.GetCurrency()),
		Attainment: unknown, Sustainable: unknown, Headroom: unknown, NeededPeak: unknown, NeededGrowth: unknown}
	if u.GetHoursWithGpus() > 0 {
		o.GPUs = human(u.GetMeanGpus()) + " / " + strconv.Itoa(int(u.GetMaxGpus()))
	}
	if hasGPUs(u) {
		o.Utilization = percent(u.GetUtilization())
	}
	if hasTraffic(u) {
		o.Attainment = percent(u.GetAttainment())
	}
	if s := u.GetSustainable(); s.GetKnown() {
		o.Sustainable = sustainableValue(s)
	}
	if u.GetHeadroomKnown() {
		o.Headroom = headroomValue(u)
		o.HeadroomClass = headroomClass(r, u)
	}
	atMost := atMostMark(u)
	for _, n := range u.GetGpusNeeded() {
		switch neededSlot(n.GetFor()) {
		case slotPeak:
			o.NeededPeak = atMost + strconv.FormatInt(n.GetGpus(), 10)
		case slotGrowth, slotTarget:
			if o.NeededGrowth != unknown {
				o.NeededGrowth += ", "
			} else {
				o.NeededGrowth = ""
			}
			o.NeededGrowth += atMost + strconv.FormatInt(n.GetGpus(), 10) + " (" + n.GetFor() + ")"
		}
	}
	var kinds []string
	for _, f := range r.GetFindings() {
		if f.GetUnit() == u.GetName() {
			kinds = append(kinds, strings.ReplaceAll(f.GetKind(), "_", " "))
		}
	}
	o.Findings = strings.Join(kinds, ", ")
	return o
}

// atMostMark prefixes GPUs needed against a sustainable throughput that is
// a lower bound: they are at most the figure.
func atMostMark(u *meterv1.CapacityUnit) string {
	if u.GetSustainable().GetLowerBound() {
		return "≤ "
	}
	return ""
}

// headroomValue is a unit's headroom; "≥" when the sustainable throughput
// is a lower bound (the unit never saturated), and so the headroom too.
func headroomValue(u *meterv1.CapacityUnit) string {
	if u.GetSustainable().GetLowerBound() {
		return "≥ " + percent(u.GetHeadroom())
	}
	return percent(u.GetHeadroom())
}

// headroomClass colours a headroom: below 0 the peak is past the
// sustainable load, below the risk threshold it is close; a lower bound is
// no risk.
func headroomClass(r *meterv1.CapacityReport, u *meterv1.CapacityUnit) string {
	switch {
	case u.GetSustainable().GetLowerBound():
		return ""
	case u.GetHeadroom() < 0:
		return "bad"
	case u.GetHeadroom() < r.GetHeadroomRisk():
		return "warn"
	}
	return "good"
}

func sustainableValue(s *meterv1.SustainableLoad) string {
	v := human(s.GetTokensPerSecondPerGpu()) + " tokens/s per GPU"
	if s.GetLowerBound() {
		v = "≥ " + v
	}
	return v
}

// buildUnit lays out one unit's section.
func buildUnit(r *meterv1.CapacityReport, u *meterv1.CapacityUnit, anchor, heading string) unitView {
	v := unitView{Anchor: anchor, Heading: heading, Name: u.GetName()}
	for _, m := range []struct {
		label string
		names []string
		count int32
	}{{"Deployments", u.GetDeployments(), u.GetDeploymentCount()}, {"Models", u.GetModels(), u.GetModelCount()},
		{"GPU types", u.GetGpuTypes(), u.GetGpuTypeCount()}} {
		if len(m.names) > 0 {
			list := strings.Join(m.names, ", ")
			if more := int(m.count) - len(m.names); more > 0 {
				list += " and " + countU(uint64(more)) + " more"
			}
			v.Members = append(v.Members, param{m.label, list})
		}
	}
	v.Cards = unitCards(r, u)
	for _, n := range u.GetGpusNeeded() {
		change := strconv.FormatInt(n.GetChange(), 10)
		if n.GetChange() > 0 {
			change = "+" + change
		}
		v.Needed = append(v.Needed, needed{For: n.GetFor(), Load: human(n.GetTokensPerSecond()), GPUs: atMostMark(u) + strconv.FormatInt(n.GetGpus(), 10),
			Change: atMostMark(u) + change, Arithmetic: n.GetArithmetic()})
	}
	if len(v.Needed) == 0 {
		v.NeededNote = "No GPUs-needed figure: it needs a sustainable throughput"
		if reason := u.GetSustainable().GetReason(); reason != "" {
			v.NeededNote += " (" + reason + ")"
		}
		v.NeededNote += "."
	}
	v.Charts = []chart{
		utilizationChart(u),
		attainmentChart(r, u),
		heatmapChart(u),
		costChart(r, u),
		forecastChart(u),
	}
	for i := range v.Charts {
		v.Charts[i].ID = anchor + "-" + v.Charts[i].Kind
		v.Charts[i].writeMarks()
	}
	return v
}

// unitCards are a unit's summary figures, unknown ones shown as such with
// the reason.
func unitCards(r *meterv1.CapacityReport, u *meterv1.CapacityUnit) []card {
	cur := r.GetCurrency()
	gpus, traffic := hasGPUs(u), hasTraffic(u)
	const noGPUs = "no GPU samples in the range"
	const noTraffic = "no requests in the range"
	var cards []card
	add := func(c card) { cards = append(cards, c) }

	if u.GetHoursWithGpus() > 0 {
		add(card{Key: "gpus", Label: "GPUs (mean / max)", Value: human(u.GetMeanGpus()) + " / " + strconv.Itoa(int(u.GetMaxGpus())),
			Raw: num(u.GetMeanGpus()), Sub: fmt.Sprintf("samples in %s of %s hours", countU(uint64(u.GetHoursWithGpus())), countU(uint64(u.GetHours())))})
	} else {
		add(card{Key: "gpus", Label: "GPUs (mean / max)", Value: unknown, Sub: noGPUs})
	}
	add(card{Key: "gpu_hours", Label: "GPU-hours", Value: human(u.GetGpuHours()), Raw: num(u.GetGpuHours()),
		Sub: "busy " + human(u.GetBusyGpuHours()) + " · idle " + human(u.GetIdleGpuHours())})
	if gpus {
		add(card{Key: "utilization", Label: "Utilization", Value: percent(u.GetUtilization()), Raw: num(u.GetUtilization()),
			Sub: "p95 of hourly means " + percent(u.GetP95Utilization()), Class: utilClass(r, u)})
		add(card{Key: "idle_share", Label: "Idle share", Value: percent(u.GetIdleShare()), Raw: num(u.GetIdleShare()),
			Sub: "idle cost " + money(u.GetIdleCost(), cur)})
	} else {
		add(card{Key: "utilization", Label: "Utilization", Value: unknown, Sub: noGPUs})
		add(card{Key: "idle_share", Label: "Idle share", Value: unknown, Sub: noGPUs})
	}
	costSub := "busy " + money(u.GetBusyCost(), cur) + " · idle " + money(u.GetIdleCost(), cur)
	if h := u.GetUnpricedGpuHours(); h > 0 {
		costSub += " · " + human(h) + " GPU-hours without a price (not included)"
	}
	add(card{Key: "cost", Label: "GPU cost", Value: money(u.GetCost(), cur), Raw: u.GetCost().GetAmount(), Sub: costSub,
		Hint: "exact: " + u.GetCost().GetAmount()})
	add(card{Key: "requests", Label: "Requests", Value: countU(u.GetRequests()), Raw: strconv.FormatUint(u.GetRequests(), 10),
		Sub: "tokens in " + countU(u.GetInputTokens()) + " · out " + countU(u.GetOutputTokens())})
	if traffic {
		add(card{Key: "attainment", Label: "Goodput attainment", Value: percent(u.GetAttainment()), Raw: num(u.GetAttainment()),
			Sub:   countU(u.GetGoodRequests()) + " of " + countU(u.GetRequests()) + " requests within SLO",
			Class: map[bool]string{true: "good", false: "warn"}[u.GetAttainment() >= r.GetTarget()]})
	} else {
		add(card{Key: "attainment", Label: "Goodput attainment", Value: unknown, Sub: noTraffic})
	}
	if hb := u.GetHotBand(); hb.GetHours() > 0 && hb.GetRequests() > 0 {
		sub := countU(uint64(hb.GetHours())) + " qualifying hours above 90% utilization"
		if hb.GetOtherRequests() > 0 {
			sub += "; the other " + countU(uint64(hb.GetOtherHours())) + " hours " + percent(hb.GetOtherAttainment())
		}
		add(card{Key: "hot_band", Label: "Attainment when hot", Value: percent(hb.GetAttainment()), Raw: num(hb.GetAttainment()), Sub: sub,
			Class: map[bool]string{true: "good", false: "warn"}[hb.GetAttainment() >= r.GetTarget()]})
	}
	peak := u.GetPeak()
	tpsSub := "no peak hour"
	if peak != nil {
		if peak.GetGpus() > 0 {
			tpsSub = "at the peak hour " + human(peak.GetTokensPerSecondPerGpu())
		} else {
			tpsSub = "the peak hour had no GPU samples"
		}
	}
	if gpus {
		add(card{Key: "tokens_per_second_per_gpu", Label: "Tokens/s per GPU", Value: human(u.GetTokensPerSecondPerGpu()),
			Raw: num(u.GetTokensPerSecondPerGpu()), Sub: tpsSub})
	} else {
		add(card{Key: "tokens_per_second_per_gpu", Label: "Tokens/s per GPU", Value: unknown, Sub: noGPUs})
	}
	if peak != nil {
		sub := human(peak.GetTokensPerSecond()) + " tokens/s"
		if peak.GetGpus() > 0 {
			sub += " on " + human(peak.GetGpus()) + " GPUs"
		}
		if peak.GetRequests() > 0 {
			sub += ", attainment " + percent(peak.GetAttainment())
		}
		add(card{Key: "peak", Label: "Peak hour", Value: hourText(peak.GetStart().AsTime()), Raw: rfc3339(peak.GetStart().AsTime()), Sub: sub})
	} else {
		add(card{Key: "peak", Label: "Peak hour", Value: unknown, Sub: noTraffic})
	}
	if sat := peak.GetSaturation(); sat != nil {
		sub := "mean " + human(sat.GetWaitingMean()) + ", max " + human(sat.GetWaitingMax()) + " waiting; " +
			human(sat.GetRunningMean()) + " running; " + countU(sat.GetReplicas()) + " replicas"
		if sat.GetKvCacheSamples() > 0 {
			sub += "; KV cache " + percent(sat.GetKvCacheUsageMean()) + " mean, " + percent(sat.GetKvCacheUsageMax()) + " max"
		}
		if sat.GetPreemptions() > 0 {
			sub += "; " + countU(sat.GetPreemptions()) + " preemptions"
		}
		add(card{Key: "saturation", Label: "Queue at the peak (p95)", Value: countU(uint64(sat.GetWaitingP95())), Raw: num(sat.GetWaitingP95()), Sub: sub,
			Hint: "engine samples (vLLM, SGLang, TGI) of the peak hour: requests waiting per replica"})
	}
	s := u.GetSustainable()
	if s.GetKnown() {
		sub := fmt.Sprintf("supported by %s of %s qualifying hours (%s missed the target)", countU(uint64(s.GetSupportingHours())),
			countU(uint64(s.GetQualifyingHours())), countU(uint64(s.GetMissedHours())))
		if s.GetHour() != nil {
			sub = "load of " + hourText(s.GetHour().AsTime()) + "; " + sub
		}
		if s.GetLowerBound() {
			sub += "; never saturated: a lower bound"
		}
		add(card{Key: "sustainable", Label: "Sustainable throughput", Value: sustainableValue(s), Raw: num(s.GetTokensPerSecondPerGpu()), Sub: sub})
	} else {
		reason := s.GetReason()
		if reason == "" {
			reason = "no estimate"
		}
		add(card{Key: "sustainable", Label: "Sustainable throughput", Value: "unknown", Sub: reason})
	}
	if u.GetHeadroomKnown() {
		sub := "1 − peak load per GPU ÷ sustainable load per GPU"
		if peak != nil && s.GetKnown() {
			sub = "1 − " + human(peak.GetTokensPerSecondPerGpu()) + " ÷ " + human(s.GetTokensPerSecondPerGpu()) + " tokens/s per GPU"
		}
		if s.GetLowerBound() {
			sub += "; never saturated, so at least this"
		}
		add(card{Key: "headroom", Label: "Headroom", Value: headroomValue(u), Raw: num(u.GetHeadroom()), Sub: sub, Class: headroomClass(r, u)})
	} else {
		sub := "needs the sustainable throughput and a peak hour with GPU samples"
		if !s.GetKnown() && s.GetReason() != "" {
			sub = "no sustainable throughput: " + s.GetReason()
		}
		add(card{Key: "headroom", Label: "Headroom", Value: unknown, Sub: sub})
	}
	t := u.GetTrend()
	if t.GetGrowthKnown() {
		add(card{Key: "growth", Label: "Weekly growth", Value: "tokens " + signedPercent(t.GetTokensGrowth()) + " · peak " + signedPercent(t.GetPeakGrowth()),
			Raw: num(t.GetTokensGrowth()), Sub: "compound, over " + strconv.Itoa(len(t.GetWeeks())) + " complete weeks"})
	} else {
		add(card{Key: "growth", Label: "Weekly growth", Value: unknown, Sub: "not enough data: " + trendReason(t)})
	}
	if f := t.GetForecast(); f != nil {
		add(card{Key: "forecast", Label: "Forecast peak", Value: human(f.GetTokensPerSecond()) + " tokens/s", Raw: num(f.GetTokensPerSecond()),
			Sub: fmt.Sprintf("on %s; R² %s over %d weeks, %s tokens/s per week", dayText(f.GetAt().AsTime()), grouped(f.GetR2(), 2), f.GetWeeks(), signedHuman(f.GetSlope()))})
	} else {
		add(card{Key: "forecast", Label: "Forecast peak", Value: unknown, Sub: "not enough data: " + trendReason(t)})
	}
	return cards
}

func signedHuman(v float64) string {
	s := human(v)
	if !strings.HasPrefix(s, "-") && v > 0 {
		s = "+" + s
	}
	return s
}

func utilClass(r *meterv1.CapacityReport, u *meterv1.CapacityUnit) string {
	if u.GetUtilization() < r.GetLowUtilization() {
		return "warn"
	}
	return ""
}

// trendReason says why a unit has no growth or forecast figure.
func trendReason(t *meterv1.CapacityTrend) string {
	if t.GetReason() != "" {
		return t.GetReason()
	}
	switch n := len(t.GetWeeks()); {
	case n < 2:
		return fmt.Sprintf("%d complete weeks in the range, a trend needs at least 2", n)
	case t.GetForecast() == nil:
		return fmt.Sprintf("%d complete weeks in the range, a forecast needs at least 3", n)
	}
	return "no figure"
}

// utilizationChart is (a): each hour with GPU samples by its utilization
// and its tokens per second per GPU.
func utilizationChart(u *meterv1.CapacityUnit) chart {
	c := chart{Kind: "utilization", Title: "Utilization and tokens/s per GPU",
		About:  "Each dot is an hour with GPU samples: its busy share of GPU time against the tokens it served per second per GPU.",
		XLabel: "GPU utilization", YLabel: "tokens/s per GPU", Box: plotBox(), Grid: true}
	var hours []*meterv1.CapacityHour
	maxY := 0.0
	for _, h := range u.GetHoursDetail() {
		if h.GetGpus() > 0 {
			hours = append(hours, h)
			maxY = math.Max(maxY, finite(h.GetTokensPerSecondPerGpu()))
		}
	}
	if len(hours) == 0 {
		c.Note = "No hour with GPU samples: nothing to draw."
		return c
	}
	hours, shown := thinHours(hours, u)
	c.About += shown
	xs := scale{Lo: 0, Hi: 1, P0: plotLeft, P1: plotRight}
	c.XTicks = valueTicks(xs, []float64{0, 0.2, 0.4, 0.6, 0.8, 1}, percentFormat(0.2))
	ys, yt, step := linearAxis(0, maxY, plotBottom, plotTop, 6)
	c.YTicks = valueTicks(ys, yt, numberFormat(step))
	for _, h := range hours {
		at := h.GetStart().AsTime()
		c.Points = append(c.Points, point{X: xs.at(h.GetUtilization()), Y: ys.at(h.GetTokensPerSecondPerGpu()), R: 2.5, Class: "pt",
			DX: num(h.GetUtilization()), DY: num(h.GetTokensPerSecondPerGpu()), DT: rfc3339(at),
			Title: hourText(at) + ": utilization " + percent(h.GetUtilization()) + ", " + human(h.GetTokensPerSecondPerGpu()) + " tokens/s per GPU"})
	}
	return c
}

// attainmentChart is (b): each hour with GPU samples and requests by its
// load per GPU and its attainment; qualifying hours solid, the others
// hollow; the target as a line and the sustainable point marked.
func attainmentChart(r *meterv1.CapacityReport, u *meterv1.CapacityUnit) chart {
	c := chart{Kind: "attainment", Title: "Goodput attainment and load per GPU",
		About: "Each dot is an hour with GPU samples and requests. Solid dots are the hours that count toward the sustainable " +
			"throughput (at least " + countU(r.GetMinHourRequests()) + " requests), hollow dots the others.",
		XLabel: "tokens/s per GPU", YLabel: "attainment", Box: plotBox(), Grid: true,
		Keys: []key{{"key-q", "qualifying hour"}, {"key-nq", "other hour"}, {"key-target", "target " + percent(r.GetTarget())}}}
	var hours []*meterv1.CapacityHour
	maxX, minY := 0.0, finite(r.GetTarget())
	for _, h := range u.GetHoursDetail() {
		if h.GetGpus() > 0 && h.GetRequests() > 0 {
			hours = append(hours, h)
			maxX = math.Max(maxX, finite(h.GetTokensPerSecondPerGpu()))
			minY = math.Min(minY, finite(h.GetAttainment()))
		}
	}
	if len(hours) == 0 {
		c.Note = "No hour with both GPU samples and requests: nothing to draw."
		return c
	}
	hours, shown := thinHours(hours, u)
	c.About += shown
	s := u.GetSustainable()
	if s.GetKnown() {
		maxX = math.Max(maxX, finite(s.GetTokensPerSecondPerGpu()))
		c.Keys = append(c.Keys, key{"key-sustainable", "sustainable throughput"})
	}
	xs, xt, xstep := linearAxis(0, maxX, plotLeft, plotRight, 6)
	c.XTicks = valueTicks(xs, xt, numberFormat(xstep))
	// The attainment axis ends at 100% and starts a little below the
	// lowest of the hours and the target.
	minY = math.Max(0, math.Min(minY, 1))
	lo := math.Max(0, minY-(1-minY)*0.1)
	ylo, _, yt := niceRange(lo, 1, 6)
	var ticks []float64
	for _, v := range yt {
		if v <= 1+1e-9 {
			ticks = append(ticks, v)
		}
	}
	ylo = math.Max(ylo, 0)
	ys := scale{Lo: ylo, Hi: 1, P0: plotBottom, P1: plotTop}
	ystep := 1.0
	if len(yt) > 1 {
		ystep = yt[1] - yt[0]
	}
	c.YTicks = valueTicks(ys, ticks, percentFormat(ystep))
	for _, h := range hours {
		at := h.GetStart().AsTime()
		class, what := "pt nq", "does not count"
		if h.GetQualifies() {
			class, what = "pt q", "counts"
		}
		c.Points = append(c.Points, point{X: xs.at(h.GetTokensPerSecondPerGpu()), Y: ys.at(h.GetAttainment()), R: 3, Class: class,
			DX: num(h.GetTokensPerSecondPerGpu()), DY: num(h.GetAttainment()), DT: rfc3339(at),
			Title: fmt.Sprintf("%s: %s tokens/s per GPU, attainment %s of %s requests (%s)", hourText(at),
				human(h.GetTokensPerSecondPerGpu()), percent(h.GetAttainment()), countU(h.GetRequests()), what)})
	}
	ty := ys.at(r.GetTarget())
	c.Lines = append(c.Lines, line{X1: plotLeft, Y1: ty, X2: plotRight, Y2: ty, Class: "target"})
	// Below the line: the hours meeting the target are above it.
	c.Texts = append(c.Texts, text{X: plotLeft + 4, Y: math.Min(ty+14, plotBottom-4), Anchor: "start", Class: "target-label", Text: "target " + percent(r.GetTarget())})
	if s.GetKnown() {
		x := xs.at(s.GetTokensPerSecondPerGpu())
		y := ty
		for _, h := range hours {
			if s.GetHour() != nil && h.GetStart().AsTime().Equal(s.GetHour().AsTime()) {
				y = ys.at(h.GetAttainment())
			}
		}
		c.Lines = append(c.Lines, line{X1: x, Y1: plotTop, X2: x, Y2: plotBottom, Class: "sustainable"})
		c.Points = append(c.Points, point{X: x, Y: y, R: 6, Class: "sustainable-pt", DX: num(s.GetTokensPerSecondPerGpu()),
			Title: "sustainable throughput " + sustainableValue(s)})
		anchor, tx := "start", x+6
		if x > (plotLeft+plotRight)/2 {
			anchor, tx = "end", x-6
		}
		// Below the dots, which gather near 100%.
		c.Texts = append(c.Texts, text{X: tx, Y: plotBottom - 8, Anchor: anchor, Class: "sustainable-label",
			Text: "sustainable " + sustainableValue(s) + " (" + countU(uint64(s.GetSupportingHours())) + " hours)"})
	}
	return c
}

// noDataFill marks a heat map slot outside the range.
const noDataFill = "#f6f8fa"

var weekdays = [7]string{"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"}

// heatmapChart is (c): the mean tokens per second of each UTC weekday and
// hour of day.
func heatmapChart(u *meterv1.CapacityUnit) chart {
	c := chart{Kind: "heatmap", Title: "Load by weekday and hour (UTC)",
		About:  "Mean tokens per second of each weekday and hour of the day over the range; blank slots are not in the range.",
		XLabel: "hour of day (UTC)", Box: box{heatLeft, heatTop, heatRight, heatBottom}}
	prof := u.GetLoadProfile()
	if len(prof) == 0 {
		c.Note = "No load profile: nothing to draw."
		return c
	}
	hi := 0.0
	for _, d := range prof {
		for h, v := range d.GetTokensPerSecond() {
			if hours := d.GetHours(); h >= len(hours) || hours[h] > 0 {
				hi = math.Max(hi, finite(v))
			}
		}
	}
	cw, ch := float64(heatRight-heatLeft)/24, float64(heatBottom-heatTop)/7
	for i, d := range prof {
		wd := int(d.GetWeekday())
		if wd < 0 || wd > 6 {
			wd = i % 7
		}
		y := heatTop + float64(wd)*ch
		for h, v := range d.GetTokensPerSecond() {
			if h >= 24 {
				break
			}
			x := heatLeft + float64(h)*cw
			if hours := d.GetHours(); h < len(hours) && hours[h] == 0 {
				// The slot is not in the range: its value means nothing.
				c.Cells = append(c.Cells, cell{X: x, Y: y, W: cw, H: ch, Class: "cell none", Fill: noDataFill, Weekday: wd, Hour: h,
					Title: fmt.Sprintf("%s %02d:00: not in the range", weekdays[wd], h)})
				continue
			}
			share := 0.0
			if hi > 0 {
				share = finite(v) / hi
			}
			n := ""
			if hours := d.GetHours(); h < len(hours) {
				n = fmt.Sprintf(" (mean of %d hours)", hours[h])
			}
			c.Cells = append(c.Cells, cell{X: x, Y: y, W: cw, H: ch, Class: "cell", Fill: heatColour(share), Weekday: wd, Hour: h,
				DV: num(v), Title: fmt.Sprintf("%s %02d:00: %s tokens/s%s", weekdays[wd], h, human(v), n)})
		}
	}
	for wd, name := range weekdays {
		c.YTicks = append(c.YTicks, tick{Pos: heatTop + (float64(wd)+0.5)*ch, Label: name})
	}
	for h := 0; h < 24; h += 2 {
		c.XTicks = append(c.XTicks, tick{Pos: heatLeft + (float64(h)+0.5)*cw, Label: strconv.Itoa(h)})
	}
	// The colour scale: legendSteps swatches from 0 to the highest value.
	lw := 240.0 / legendSteps
	for i := 0; i < legendSteps; i++ {
		share := float64(i) / (legendSteps - 1)
		c.Legend = append(c.Legend, bar{X: heatLeft + float64(i)*lw, Y: legendTop, W: lw, H: legendH, Class: "legend-step", Fill: heatColour(share),
			Title: human(share*hi) + " tokens/s"})
	}
	c.Texts = append(c.Texts,
		text{X: heatLeft, Y: legendTop + legendH + 12, Anchor: "start", Class: "legend-label", Text: "0"},
		text{X: heatLeft + 240, Y: legendTop + legendH + 12, Anchor: "end", Class: "legend-label", Text: human(hi) + " tokens/s"},
		text{X: heatLeft + 250, Y: legendTop + legendH - 2, Anchor: "start", Class: "legend-label", Text: "mean tokens/s"})
	return c
}

// costChart is (d): busy and idle GPU cost per UTC day, stacked.
func costChart(r *meterv1.CapacityReport, u *meterv1.CapacityUnit) chart {
	cur := r.GetCurrency()
	c := chart{Kind: "cost", Title: "Busy and idle GPU cost per day",
		About:  "Cost of busy GPU time (below) and of idle GPU time (above) per UTC day.",
		YLabel: cur + " per day", Box: plotBox(), Grid: true,
		Keys: []key{{"key-busy", "busy"}, {"key-idle", "idle"}}}
	days := u.GetDays()
	if len(days) == 0 {
		c.Note = "No day with GPU samples: nothing to draw."
		return c
	}
	hi := 0.0
	for _, d := range days {
		hi = math.Max(hi, float64(d.GetBusyCost().GetNanos()+d.GetIdleCost().GetNanos())/1e9)
	}
	ys, yt, step := linearAxis(0, hi, plotBottom, plotTop, 6)
	c.YTicks = valueTicks(ys, yt, numberFormat(step))
	band := float64(plotRight-plotLeft) / float64(len(days))
	w := math.Max(band*0.8, 0.5)
	every := max(1, int(math.Ceil(float64(len(days))/8)))
	for i, d := range days {
		at := d.GetStart().AsTime()
		x := plotLeft + float64(i)*band + (band-w)/2
		busy, idle := float64(d.GetBusyCost().GetNanos())/1e9, float64(d.GetIdleCost().GetNanos())/1e9
		yBusy := ys.at(busy)
		yTop := ys.at(busy + idle)
		c.Bars = append(c.Bars,
			bar{X: x, Y: yBusy, W: w, H: math.Max(plotBottom-yBusy, 0), Class: "bar busy", DT: rfc3339(at), DV: d.GetBusyCost().GetAmount(),
				Title: dayText(at) + ": busy " + money(d.GetBusyCost(), cur) + " (" + human(d.GetBusyGpuHours()) + " GPU-hours)"},
			bar{X: x, Y: yTop, W: w, H: math.Max(yBusy-yTop, 0), Class: "bar idle", DT: rfc3339(at), DV: d.GetIdleCost().GetAmount(),
				Title: dayText(at) + ": idle " + money(d.GetIdleCost(), cur) + " (" + human(d.GetGpuHours()-d.GetBusyGpuHours()) + " GPU-hours)"})
		if i%every == 0 {
			c.XTicks = append(c.XTicks, tick{Pos: plotLeft + (float64(i)+0.5)*band, Label: at.UTC().Format("Jan 2")})
		}
	}
	return c
}

// forecastChart is (e): the peak of each complete week and the
// least-squares line to the forecast at the horizon.
func forecastChart(u *meterv1.CapacityUnit) chart {
	t := u.GetTrend()
	c := chart{Kind: "forecast", Title: "Weekly peak and forecast",
		About:  "The busiest hour's tokens per second of each complete week, and the least-squares line through them to the forecast horizon.",
		YLabel: "peak tokens/s", Box: plotBox(), Grid: true}
	weeks, f := t.GetWeeks(), t.GetForecast()
	if len(weeks) == 0 && f == nil {
		c.Note = "Not enough data: " + trendReason(t) + "."
		return c
	}
	var lo, hi time.Time
	if len(weeks) > 0 {
		lo, hi = weeks[0].GetStart().AsTime(), weeks[len(weeks)-1].GetStart().AsTime()
	}
	maxY := 0.0
	for _, w := range weeks {
		maxY = math.Max(maxY, finite(w.GetPeakTokensPerSecond()))
	}
	var origin time.Time
	if f != nil {
		at := f.GetAt().AsTime()
		if lo.IsZero() || at.Before(lo) {
			lo = at
		}
		if at.After(hi) {
			hi = at
		}
		origin = lo
		if n := int(f.GetWeeks()); n > 0 && n <= len(weeks) {
			origin = weeks[len(weeks)-n].GetStart().AsTime()
		}
		maxY = math.Max(maxY, math.Max(finite(f.GetTokensPerSecond()), finite(f.GetIntercept())))
	}
	xs := scale{Lo: float64(lo.Unix()), Hi: float64(hi.Unix()), P0: plotLeft + 10, P1: plotRight - 10}
	c.XTicks = timeTicks(xs, lo, hi, 7)
	ys, yt, step := linearAxis(0, maxY, plotBottom, plotTop, 6)
	c.YTicks = valueTicks(ys, yt, numberFormat(step))
	for _, w := range weeks {
		at := w.GetStart().AsTime()
		// A week without traffic has no peak hour.
		peakAt, title := "", "week of "+dayText(at)+": no traffic"
		if w.GetPeakHour() != nil && w.GetTokens() > 0 {
			peakAt = rfc3339(w.GetPeakHour().AsTime())
			title = "week of " + dayText(at) + ": peak " + human(w.GetPeakTokensPerSecond()) + " tokens/s at " + hourText(w.GetPeakHour().AsTime()) +
				", " + countU(w.GetTokens()) + " tokens"
		}
		c.Points = append(c.Points, point{X: xs.at(float64(at.Unix())), Y: ys.at(w.GetPeakTokensPerSecond()), R: 3.5, Class: "pt week",
			DX: rfc3339(at), DY: num(w.GetPeakTokensPerSecond()), DT: peakAt, Title: title})
	}
	c.Keys = []key{{"key-week", "weekly peak"}}
	if f == nil {
		c.Texts = append(c.Texts, text{X: (plotLeft + plotRight) / 2, Y: plotTop + 14, Anchor: "middle", Class: "chart-note",
			Text: "No forecast: not enough data: " + trendReason(t)})
		return c
	}
	at := f.GetAt().AsTime()
	x0, y0 := xs.at(float64(origin.Unix())), ys.at(f.GetIntercept())
	x1, y1 := xs.at(float64(at.Unix())), ys.at(f.GetTokensPerSecond())
	c.Lines = append(c.Lines, line{X1: x0, Y1: y0, X2: x1, Y2: y1, Class: "forecast"})
	c.Points = append(c.Points, point{X: x1, Y: y1, R: 5, Class: "forecast-pt", DX: rfc3339(at), DY: num(f.GetTokensPerSecond()),
		Title: "forecast peak " + human(f.GetTokensPerSecond()) + " tokens/s on " + dayText(at)})
	c.Texts = append(c.Texts, text{X: x1 - 8, Y: math.Max(y1-10, plotTop+10), Anchor: "end", Class: "forecast-label",
		Text: fmt.Sprintf("forecast %s tokens/s on %s (R² %s, %d weeks)", human(f.GetTokensPerSecond()), dayText(at), grouped(f.GetR2(), 2), f.GetWeeks())})
	c.Keys = append(c.Keys, key{"key-forecast", "least-squares forecast"})
	return c
}

func plotBox() box { return box{plotLeft, plotTop, plotRight, plotBottom} }

// maxScatterPoints bounds the dots of one scatter chart: a year of hours
// of 50 deployments would otherwise make a file of hundreds of megabytes.
const maxScatterPoints = 2000

// thinHours keeps at most about maxScatterPoints of hours for a scatter
// chart: every k-th hour in time order, and always the peak hour and the
// sustainable throughput's hour. It returns the hours kept and, when some
// were left out, a sentence saying so for the chart's caption. The axes
// are computed from every hour before thinning.
func thinHours(hours []*meterv1.CapacityHour, u *meterv1.CapacityUnit) ([]*meterv1.CapacityHour, string) {
	if len(hours) <= maxScatterPoints {
		return hours, ""
	}
	k := (len(hours) + maxScatterPoints - 1) / maxScatterPoints
	special := func(h *meterv1.CapacityHour) bool {
		at := h.GetStart().AsTime()
		if p := u.GetPeak(); p != nil && p.GetStart().AsTime().Equal(at) {
			return true
		}
		s := u.GetSustainable()
		return s.GetKnown() && s.GetHour() != nil && s.GetHour().AsTime().Equal(at)
	}
	var out []*meterv1.CapacityHour
	for i, h := range hours {
		if i%k == 0 || special(h) {
			out = append(out, h)
		}
	}
	return out, fmt.Sprintf(" Showing %s of the %s hours: every %s hour, with the peak and sustainable hours.",
		countU(uint64(len(out))), countU(uint64(len(hours))), ordinal(k))
}

// ordinal writes 2 as "2nd", 11 as "11th".
func ordinal(n int) string {
	suffix := "th"
	if n%100 < 11 || n%100 > 13 {
		switch n % 10 {
		case 1:
			suffix = "st"
		case 2:
			suffix = "nd"
		case 3:
			suffix = "rd"
		}
	}
	return fmt.Sprintf("%d%s", n, suffix)
}
