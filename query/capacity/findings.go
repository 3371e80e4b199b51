package capacity

import (
	"cmp"
	"fmt"
	"math"
	"math/big"
	"slices"
	"strconv"
	"strings"

	"tokenmeter/billing"
	"tokenmeter/internal/numtext"
)

// Finding kinds.
const (
	KindAtRisk          = "at_risk"
	KindOverProvisioned = "over_provisioned"
	KindSaturated       = "saturated"
	KindNotEnoughData   = "not_enough_data"
	KindHot             = "hot"
	KindMemoryPressure  = "memory_pressure"
	KindThermal         = "thermal_throttling"
)

// The GPU thresholds of the findings, the alert rules' (deploy/helm's
// alerts.rules.yaml: GPUMemoryHigh, GPUTemperatureHigh).
const (
	// MemoryPressureRatio: an hour whose GPU memory in use averaged above
	// it (sum of used over sum of total, the hour's mean) is under memory
	// pressure; one whose highest sample only went above it came close.
	MemoryPressureRatio = 0.95
	// HotTemperatureC: an hour whose hottest sample was above it ran hot.
	HotTemperatureC = 83.0
	// ThrottleShare: clocks throttled (below 90% of the GPU's normal SM
	// clock while busy) for at least this share of the busy sampled time.
	ThrottleShare = 0.01
)

// HotUtilization is the utilization above which an hour is in the hot
// band: its GPUs were busy nearly all the time, so queues build.
const HotUtilization = 0.9

// findings states in plain words what a planner acts on: units at risk
// (little headroom, attainment falling at high load), units that miss the
// target at every load, over-provisioned units (low utilization, idle
// cost) and what the data could not support. Most urgent first.
func findings(q Query, units []Unit) []Finding {
	var out []Finding
	add := func(u *Unit, kind string, severity int, format string, a ...any) {
		out = append(out, Finding{Unit: u.Name, Kind: kind, Severity: severity, Text: u.Name + " " + fmt.Sprintf(format, a...)})
	}
	for i := range units {
		u := &units[i]
		s := &u.Sustainable
		switch {
		case u.HoursWithGPUs > 0 && u.Requests == 0 && u.BusyGPUHours > 0:
			// Busy GPUs without a request counted: traffic under another
			// deployment name, or work the meter does not see.
			add(u, KindOverProvisioned, 2, "served no traffic, yet its GPUs were busy %s of their %s GPU-hours (is its traffic recorded under another deployment name?); the idle time cost %s of %s.",
				percent(u.Utilization), number(u.GPUHours, 1), money(u.IdleCostNanos, q.Currency), money(u.CostNanos, q.Currency))
		case u.HoursWithGPUs > 0 && u.Requests == 0:
			add(u, KindOverProvisioned, 2, "served no traffic: all %s GPU-hours were idle, costing %s.",
				number(u.GPUHours, 1), money(u.IdleCostNanos, q.Currency))
		case u.HoursWithGPUs > 0 && u.Utilization < q.LowUtilization:
			text := fmt.Sprintf("is over-provisioned: utilization %s (p95 of hours %s); %s of %s GPU-hours were idle, costing %s",
				percent(u.Utilization), percent(u.P95Utilization), number(u.IdleGPUHours, 1), number(u.GPUHours, 1), money(u.IdleCostNanos, q.Currency))
			if u.CostNanos > 0 {
				text += fmt.Sprintf(" (%s of its GPU cost)", percent(float64(u.IdleCostNanos)/float64(u.CostNanos)))
			}
			if len(u.Needed) > 0 && u.Needed[0].Change < 0 {
				atMost := ""
				if s.LowerBound {
					atMost = "at most " // against a lower bound of its capacity
				}
				text += fmt.Sprintf(". Its observed peak needs %s%d GPUs of the %d it ran", atMost, u.Needed[0].GPUs, wholeGPUs(u.MaxGPUEquivalents))
			}
			add(u, KindOverProvisioned, 1, "%s.", text)
		}
		switch {
		case s.Saturated:
			add(u, KindSaturated, 2, "misses its SLO under load: %s", s.Reason)
		case !s.Known && s.QualifyingHours >= MinQualifyingHours:
			add(u, KindNotEnoughData, 1, "has no sustainable-throughput estimate: %s.", s.Reason)
		case !s.Known && u.Requests > 0:
			add(u, KindNotEnoughData, 0, "has no sustainable-throughput estimate: %s.", s.Reason)
		case s.Known && s.LowerBound:
			add(u, KindNotEnoughData, 0, "never missed the %s target at any observed load: its sustainable throughput is at least %s tokens/s per GPU (%d supporting hours).",
				percent(q.Target), number(s.TokensPerSecondPerGPU, 1), s.SupportingHours)
		}
		// Against a lower bound, headroom is a lower bound too: no risk shown.
		if u.HeadroomKnown && !s.LowerBound && u.Headroom < q.HeadroomRisk {
			text := fmt.Sprintf("is at risk: headroom %s at the peak hour %s (%s tokens/s per GPU against a sustainable %s)",
				percent(u.Headroom), u.Peak.Start.Format("2006-01-02 15:04 UTC"), number(u.Peak.TokensPerSecondPerGPU, 1), number(s.TokensPerSecondPerGPU, 1))
			for _, n := range u.Needed {
				if n.Change > 0 {
					text += fmt.Sprintf("; %s needs %d GPUs (%+d)", n.For, n.GPUs, n.Change)
				}
			}
			add(u, KindAtRisk, 2, "%s.", text)
		}
		if good, all, hours := highLoadAttainment(u.HourPoints); s.QualifyingHours >= MinQualifyingHours && hours > 0 && float64(good) < q.Target*float64(all) {
			add(u, KindAtRisk, 2, "drops below its SLO at high load: attainment %s over its %d busiest qualifying hours (per GPU), against the %s target.",
				percent(float64(good)/float64(all)), hours, percent(q.Target))
		}
	}
	for i := range units {
		u := &units[i]
		if h := u.Hot; h.Hours > 0 && h.Requests > 0 && hotDrops(q, h) {
			text := fmt.Sprintf("runs hot: in its %d qualifying hours with utilization above %s, attainment was %s (%s of %s requests), below the %s target",
				h.Hours, percent(HotUtilization), percent(float64(h.GoodRequests)/float64(h.Requests)), countU(h.GoodRequests), countU(h.Requests), percent(q.Target))
			if h.OtherRequests > 0 {
				text += fmt.Sprintf(" and below the %s of its %d other qualifying hours", percent(float64(h.OtherGoodRequests)/float64(h.OtherRequests)), h.OtherHours)
			}
			add(u, KindHot, 2, "%s: add GPUs or shed load before the busy hours.", text)
		}
	}
	for i := range units {
		u := &units[i]
		gpuFindings(u, add)
	}
	slices.SortStableFunc(out, func(a, b Finding) int {
		return cmp.Or(cmp.Compare(b.Severity, a.Severity), cmp.Compare(a.Unit, b.Unit), cmp.Compare(a.Kind, b.Kind))
	})
	return out
}

// gpuFindings adds the unit's memory-pressure and thermal findings from
// its hours' GPU telemetry: memory pressure (severity 2) when an hour's
// memory in use averaged above MemoryPressureRatio, 1 when only a sample
// went above it; thermal throttling (2) when an hour's hottest sample was
// above HotTemperatureC, 1 when no hour was but the clocks were throttled
// for at least ThrottleShare of the busy time.
func gpuFindings(u *Unit, add func(u *Unit, kind string, severity int, format string, a ...any)) {
	var (
		pressured, peaked, hot int
		worst, hottest         *HourPoint
	)
	for i := range u.HourPoints {
		p := &u.HourPoints[i]
		m := &p.GPUTelemetry
		switch {
		case m.MemoryHours > 0 && m.MemoryUsedRatio > MemoryPressureRatio:
			pressured++
		case m.MemoryUsedMaxRatio > MemoryPressureRatio:
			peaked++
		}
		if m.MemoryHours > 0 && (worst == nil || m.MemoryUsedRatio > worst.GPUTelemetry.MemoryUsedRatio) {
			worst = p
		}
		if m.TemperatureMaxC > HotTemperatureC {
			hot++
		}
		if m.TemperatureHours > 0 && (hottest == nil || m.TemperatureMaxC > hottest.GPUTelemetry.TemperatureMaxC) {
			hottest = p
		}
	}
	t := &u.GPUTelemetry
	switch {
	case pressured > 0:
		add(u, KindMemoryPressure, 2, "is under GPU memory pressure: in %d of its %d hours with GPU samples the memory in use averaged above %s (highest %s in the hour %s; the fullest sample %s), where the GPUMemoryHigh alert fires: KV-cache evictions, preemptions and out-of-memory errors follow; add GPUs or memory, or cap the batch size.",
			pressured, u.HoursWithGPUs, percent(MemoryPressureRatio), percent(worst.GPUTelemetry.MemoryUsedRatio), worst.Start.Format("2006-01-02 15:04 UTC"), percent(t.MemoryUsedMaxRatio))
	case peaked > 0:
		add(u, KindMemoryPressure, 1, "came close to GPU memory pressure: in %d hours a sample had more than %s of its GPU's memory in use (the fullest %s), though no hour averaged above it.",
			peaked, percent(MemoryPressureRatio), percent(t.MemoryUsedMaxRatio))
	}
	throttled := t.ClockHours > 0 && t.ClockThrottleShare >= ThrottleShare
	throttle := ""
	if t.ClockHours > 0 {
		throttle = fmt.Sprintf("; its clocks ran below 90%% of normal for %s of %s busy GPU-hours (%s)",
			number(t.ClockThrottleSeconds/3600, 1), number(t.ClockHours, 1), percent(t.ClockThrottleShare))
	}
	switch {
	case hot > 0:
		add(u, KindThermal, 2, "runs its GPUs too hot: in %d hours a GPU was above %s °C (hottest %s °C in the hour %s), where the GPUTemperatureHigh alert fires and data-center GPUs slow their clocks%s; check cooling and power limits.",
			hot, number(HotTemperatureC, 0), number(hottest.GPUTelemetry.TemperatureMaxC, 1), hottest.Start.Format("2006-01-02 15:04 UTC"), throttle)
	case throttled:
		add(u, KindThermal, 1, "had its GPU clocks throttled (heat or a power cap) though no GPU went above %s °C (hottest %s °C)%s: it serves fewer tokens per GPU than the GPUs can.",
			number(HotTemperatureC, 0), number(t.TemperatureMaxC, 1), throttle)
	}
}

// hotDrops tells whether attainment drops in the hot band: the hot hours'
// pooled attainment is below the target and below the other qualifying
// hours' (compared exactly, in integers).
func hotDrops(q Query, h HotBand) bool {
	if float64(h.GoodRequests) >= q.Target*float64(h.Requests) {
		return false
	}
	// good/requests < otherGood/otherRequests
	return h.OtherRequests == 0 || new(big.Int).Mul(new(big.Int).SetUint64(h.GoodRequests), new(big.Int).SetUint64(h.OtherRequests)).Cmp(
		new(big.Int).Mul(new(big.Int).SetUint64(h.OtherGoodRequests), new(big.Int).SetUint64(h.Requests))) < 0
}

// countU is n with thousands separators.
func countU(n uint64) string { return numtext.Group(strconv.FormatUint(n, 10)) }

// highLoadAttainment pools the requests of the highest-load tenth (at
// least one) of the qualifying hours.
func highLoadAttainment(points []HourPoint) (good, all uint64, hours int) {
	var qual []HourPoint
	for _, p := range points {
		if p.Qualifies {
			qual = append(qual, p)
		}
	}
	if len(qual) == 0 {
		return 0, 0, 0
	}
	slices.SortStableFunc(qual, func(a, b HourPoint) int { return cmp.Compare(b.TokensPerSecondPerGPU, a.TokensPerSecondPerGPU) })
	hours = max(1, len(qual)/10)
	for _, p := range qual[:hours] {
		good += p.GoodRequests
		all += p.Requests
	}
	return good, all, hours
}

// number writes v with thousands separators and the given decimals.
func number(v float64, decimals int) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	return numtext.Group(strconv.FormatFloat(v, 'f', decimals, 64))
}

// percent writes a share as a percentage with one decimal.
func percent(v float64) string { return number(v*100, 1) + "%" }

// money writes an amount rounded to cents, with its currency.
func money(nanos int64, currency string) string {
	return strings.TrimSpace(currency + " " + numtext.Group(billing.Money(nanos).StringFixed(2)))
}
