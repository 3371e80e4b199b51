package capacity

import (
	"cmp"
	"fmt"
	"math"
	"math/big"
	"slices"
	"strconv"
	"time"

	"tokenmeter/rollup"
)

// week is the length of a trend step.
const week = 7 * 24 * time.Hour

// computeUnit computes the figures of a unit made of deps. capacity is
// false for the fleet, whose per-GPU load mixes models and GPU types: it
// gets no sustainable throughput, headroom or GPUs needed.
func computeUnit(q Query, name string, deps []*deployment, capacity bool) Unit {
	n := int(q.End.Sub(q.Start) / time.Hour)
	hours := make([]depHour, n)
	u := Unit{Name: name, Hours: n}
	models, types := map[string]bool{}, map[string]bool{}
	for _, d := range deps { // in name order
		if len(u.Deployments) < MaxMembers {
			u.Deployments = append(u.Deployments, d.name)
		}
		for m := range d.models {
			models[m] = true
		}
		for t := range d.types {
			types[t] = true
		}
		for i, h := range d.hours {
			hours[i].add(h)
		}
	}
	u.DeploymentCount, u.ModelCount, u.GPUTypeCount = len(deps), len(models), len(types)
	u.Models, u.GPUTypes = firstKeys(models, MaxMembers), firstKeys(types, MaxMembers)

	var (
		gpuSec, busySec, tokensOnGPUs float64
		telemetry                     rollup.GPUTelemetry
		utils                         []float64
		peak                          = -1
		profileTokens                 [7][24]uint64
	)
	for i := range hours {
		h := &hours[i]
		start := q.Start.Add(time.Duration(i) * time.Hour)
		if h.gpuSec > 0 {
			u.HoursWithGPUs++
			gpuSec += h.gpuSec
			busySec += h.busySec
			tokensOnGPUs += float64(h.tokens())
			utils = append(utils, h.busySec/h.gpuSec)
		}
		telemetry.Merge(h.telemetry)
		u.MaxGPUs = max(u.MaxGPUs, h.maxGPUs)
		u.MaxGPUEquivalents = max(u.MaxGPUEquivalents, h.gpuSec/3600)
		u.UnpricedGPUHours += h.unpricedSec / 3600
		u.CostNanos += h.cost
		u.BusyCostNanos += h.busyCost
		u.IdleCostNanos += h.idleCost
		u.Requests += h.requests
		u.GoodRequests += h.good
		u.InputTokens += h.in
		u.OutputTokens += h.out
		if h.tokens() > 0 && (peak < 0 || h.tokens() > hours[peak].tokens()) {
			peak = i
		}
		if h.gpuSec > 0 || h.requests > 0 {
			u.HourPoints = append(u.HourPoints, hourPoint(q, start, h))
		}
		wd, hr := start.Weekday(), start.Hour()
		u.ProfileHours[wd][hr]++
		profileTokens[wd][hr] += h.tokens()
		day := start.Truncate(24 * time.Hour)
		if len(u.Days) == 0 || !u.Days[len(u.Days)-1].Start.Equal(day) {
			u.Days = append(u.Days, DayPoint{Start: day})
		}
		dp := &u.Days[len(u.Days)-1]
		dp.BusyCostNanos += h.busyCost
		dp.IdleCostNanos += h.idleCost
		dp.BusyGPUHours += h.busySec / 3600
		dp.GPUHours += h.gpuSec / 3600
		dp.Tokens += h.tokens()
	}
	for wd := range profileTokens {
		for hr, t := range profileTokens[wd] {
			if c := u.ProfileHours[wd][hr]; c > 0 {
				u.Profile[wd][hr] = float64(t) / 3600 / float64(c)
			}
		}
	}
	u.GPUHours, u.BusyGPUHours = gpuSec/3600, busySec/3600
	u.GPUTelemetry = telemetry.Summary()
	u.IdleGPUHours = u.GPUHours - u.BusyGPUHours
	if gpuSec > 0 {
		u.MeanGPUs = u.GPUHours / float64(u.HoursWithGPUs)
		u.Utilization = busySec / gpuSec
		u.IdleShare = 1 - u.Utilization
		u.TokensPerSecondPerGPU = tokensOnGPUs / gpuSec
		u.P95Utilization = nearestRank(utils, 0.95)
	}
	if u.Requests > 0 {
		u.Attainment = float64(u.GoodRequests) / float64(u.Requests)
	}
	if peak >= 0 {
		h := &hours[peak]
		p := hourPoint(q, q.Start.Add(time.Duration(peak)*time.Hour), h)
		u.Peak = &PeakHour{Start: p.Start, TokensPerSecond: p.TokensPerSecond, GPUs: p.GPUs,
			TokensPerSecondPerGPU: p.TokensPerSecondPerGPU, Requests: p.Requests, Attainment: p.Attainment}
	}
	u.Trend = trend(q, hours)
	for _, p := range u.HourPoints {
		switch {
		case !p.Qualifies:
		case p.Utilization > HotUtilization:
			u.Hot.Hours++
			u.Hot.Requests += p.Requests
			u.Hot.GoodRequests += p.GoodRequests
		default:
			u.Hot.OtherHours++
			u.Hot.OtherRequests += p.Requests
			u.Hot.OtherGoodRequests += p.GoodRequests
		}
	}
	if !capacity {
		u.Sustainable.Reason = "not estimated for the fleet: its per-GPU load mixes models and GPU types (see each unit)"
		return u
	}
	var at *depHour // the hour whose load is the sustainable throughput
	u.Sustainable, at = sustainable(q, u.HourPoints, hours)
	if !u.Sustainable.Known {
		return u
	}
	if u.Peak != nil && u.Peak.GPUs > 0 {
		u.Headroom = 1 - u.Peak.TokensPerSecondPerGPU/u.Sustainable.TokensPerSecondPerGPU
		u.HeadroomKnown = true
	}
	if u.Peak != nil {
		// Exact: a peak of T tokens in an hour is T/3600 tokens/s.
		peakRate := new(big.Rat).SetFrac(new(big.Int).SetUint64(hours[peak].tokens()), big.NewInt(3600))
		u.Needed = append(u.Needed, gpusNeeded("observed peak", "", nil, peakRate, at, wholeGPUs(u.MaxGPUEquivalents)))
		if q.Growth != "1" {
			g, _ := parseGrowth(q.Growth)
			u.Needed = append(u.Needed, gpusNeeded("growth "+q.Growth, q.Growth, g, peakRate, at, wholeGPUs(u.MaxGPUEquivalents)))
		}
	}
	if q.TargetTokensPerSecond > 0 {
		// The decimal the planner wrote (its shortest form), not the
		// float64 nearest to it, which may lie above it.
		t, _ := new(big.Rat).SetString(strconv.FormatFloat(q.TargetTokensPerSecond, 'g', -1, 64))
		u.Needed = append(u.Needed, gpusNeeded(fmt.Sprintf("target %s tokens/s", number(q.TargetTokensPerSecond, -1)), "", nil, t, at, wholeGPUs(u.MaxGPUEquivalents)))
	}
	if f := u.Trend.Forecast; f != nil {
		t := new(big.Rat).SetFloat64(f.TokensPerSecond)
		u.Needed = append(u.Needed, gpusNeeded("forecast peak "+f.At.Format("2006-01-02"), "", nil, t, at, wholeGPUs(u.MaxGPUEquivalents)))
	}
	return u
}

// hourPoint is the chart point of an hour.
func hourPoint(q Query, start time.Time, h *depHour) HourPoint {
	p := HourPoint{Start: start, GPUs: h.gpuSec / 3600, TokensPerSecond: float64(h.tokens()) / 3600,
		Requests: h.requests, GoodRequests: h.good,
		Qualifies: h.gpuSec > 0 && h.requests >= q.MinHourRequests, GPUTelemetry: h.telemetry.Summary()}
	if h.gpuSec > 0 {
		p.Utilization = h.busySec / h.gpuSec
		p.TokensPerSecondPerGPU = float64(h.tokens()) / h.gpuSec
	}
	if h.requests > 0 {
		p.Attainment = float64(h.good) / float64(h.requests)
	}
	return p
}

// sustainable estimates the highest per-GPU load at which attainment
// stayed at or above the target. It orders the qualifying hours by load
// and takes the highest load L such that an hour at L met the target and
// at most MissTolerance of the hours at or below L missed it: a clean knee
// gives the last load before attainment falls, and an isolated incident at
// a low load does not drag the estimate down. It also returns the hour at
// L, whose tokens and GPU-seconds make the GPUs-needed arithmetic exact.
func sustainable(q Query, points []HourPoint, hours []depHour) (Sustainable, *depHour) {
	var qual []HourPoint
	for _, p := range points {
		if p.Qualifies {
			qual = append(qual, p)
		}
	}
	s := Sustainable{QualifyingHours: len(qual)}
	if len(qual) < MinQualifyingHours {
		s.Reason = fmt.Sprintf("not enough data: %d qualifying hours (GPU samples and at least %d requests); the estimate needs %d",
			len(qual), q.MinHourRequests, MinQualifyingHours)
		return s, nil
	}
	slices.SortStableFunc(qual, func(a, b HourPoint) int { return cmp.Compare(a.TokensPerSecondPerGPU, b.TokensPerSecondPerGPU) })
	meets := func(p HourPoint) bool { return p.Attainment >= q.Target }
	missed := make([]int, len(qual)) // misses among qual[:i+1]
	for i, p := range qual {
		if i > 0 {
			missed[i] = missed[i-1]
		}
		if !meets(p) {
			missed[i]++
		}
	}
	best, bestEnd := -1, -1
	for i := 0; i < len(qual); {
		j := i // qual[i..j] share one load
		for j+1 < len(qual) && qual[j+1].TokensPerSecondPerGPU == qual[i].TokensPerSecondPerGPU {
			j++
		}
		if float64(missed[j]) <= *q.MissTolerance*float64(j+1) {
			for k := i; k <= j; k++ {
				if meets(qual[k]) {
					best, bestEnd = k, j
					break
				}
			}
		}
		i = j + 1
	}
	if best < 0 || qual[best].TokensPerSecondPerGPU <= 0 {
		n := len(qual)
		if !meets(qual[n-1]) {
			s.Saturated = true
			s.Reason = fmt.Sprintf("the %s attainment target was missed from the lowest loads to the highest: %d of %d qualifying hours missed it, more than %s of them at every load from %s tokens/s per GPU up",
				percent(q.Target), missed[n-1], n, percent(*q.MissTolerance), number(qual[0].TokensPerSecondPerGPU, 1))
		} else {
			s.Reason = fmt.Sprintf("the %s attainment target was missed in %d of %d qualifying hours, too many of them at low loads for the %s tolerance to name a sustainable load (the busiest hours met it): look at the missed hours before sizing",
				percent(q.Target), missed[n-1], n, percent(*q.MissTolerance))
		}
		return s, nil
	}
	b := qual[best]
	s.Known = true
	s.TokensPerSecondPerGPU = b.TokensPerSecondPerGPU
	s.Hour = b.Start
	s.SupportingHours = bestEnd + 1
	s.MissedHours = missed[bestEnd]
	s.LowerBound = missed[len(qual)-1] == missed[bestEnd]
	return s, &hours[int(b.Start.Sub(q.Start)/time.Hour)]
}

// gpusNeeded is ceil(factor × base / sustainable), exact: the sustainable
// load is the tokens of its hour over its GPU-seconds, so GPUs =
// ceil(factor × base × GPU-seconds / tokens) in rationals. factor is nil
// for a load given as is; factorText is how the arithmetic writes it.
func gpusNeeded(label, factorText string, factor, base *big.Rat, at *depHour, maxGPUs uint32) GPUsNeeded {
	rate := new(big.Rat).Set(base)
	prefix := ""
	if factor != nil {
		rate.Mul(rate, factor)
		prefix = factorText + " × "
	}
	perGPU := new(big.Rat).SetFrac(new(big.Int).SetUint64(at.tokens()), big.NewInt(1))
	perGPU.Quo(perGPU, new(big.Rat).SetFloat64(at.gpuSec))
	ratio := new(big.Rat).Quo(rate, perGPU)
	gpus := ceilRat(ratio)
	rateF, _ := rate.Float64()
	baseF, _ := base.Float64()
	perGPUF, _ := perGPU.Float64()
	return GPUsNeeded{
		For:             label,
		TokensPerSecond: rateF,
		GPUs:            gpus,
		Arithmetic: fmt.Sprintf("ceil(%s%s tokens/s ÷ %s tokens/s per GPU) = ceil(%s) = %d GPUs",
			prefix, number(baseF, 1), number(perGPUF, 1), ratio.FloatString(4), gpus),
		Change: gpus - int64(maxGPUs),
	}
}

// ceilRat is the smallest integer at least r (r ≥ 0), at most MaxInt64.
func ceilRat(r *big.Rat) int64 {
	q, m := new(big.Int).QuoRem(r.Num(), r.Denom(), new(big.Int))
	if m.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	if !q.IsInt64() {
		return math.MaxInt64
	}
	return q.Int64()
}

// wholeGPUs is a number of GPU equivalents rounded up to whole GPUs (a
// sum of MIG fractions a hair over an integer counts as that integer).
func wholeGPUs(v float64) uint32 {
	return uint32(math.Ceil(v - 1e-9))
}

// parseGrowth reads a decimal growth factor exactly.
func parseGrowth(s string) (*big.Rat, bool) {
	if !decimal.MatchString(s) {
		return nil, false
	}
	return new(big.Rat).SetString(s)
}

// trend computes the weekly points, growth and forecast of a unit's hours.
func trend(q Query, hours []depHour) Trend {
	var t Trend
	weeks := len(hours) / (7 * 24)
	for w := range weeks {
		p := WeekPoint{Start: q.Start.Add(time.Duration(w) * week)}
		var peak uint64
		for i := w * 168; i < (w+1)*168; i++ {
			tok := hours[i].tokens()
			p.Tokens += tok
			if tok > peak {
				peak = tok
				p.PeakTokensPerSecondHour = q.Start.Add(time.Duration(i) * time.Hour)
			}
		}
		p.PeakTokensPerSecond = float64(peak) / 3600
		t.Weeks = append(t.Weeks, p)
	}
	if weeks < 2 {
		t.Reason = fmt.Sprintf("not enough data for a trend: the range holds %d complete week(s); growth needs 2 and a forecast 3", weeks)
		return t
	}
	xs := make([]float64, weeks)
	logTokens, logPeaks, peaks := make([]float64, weeks), make([]float64, weeks), make([]float64, weeks)
	for w, p := range t.Weeks {
		if p.Tokens == 0 {
			t.Reason = fmt.Sprintf("no trend: the week of %s has no traffic", p.Start.Format("2006-01-02"))
			return t
		}
		xs[w] = float64(w)
		logTokens[w] = math.Log(float64(p.Tokens))
		logPeaks[w] = math.Log(p.PeakTokensPerSecond)
		peaks[w] = p.PeakTokensPerSecond
	}
	t.GrowthKnown = true
	slope, _, _ := leastSquares(xs, logTokens)
	t.TokensGrowth = math.Expm1(slope)
	slope, _, _ = leastSquares(xs, logPeaks)
	t.PeakGrowth = math.Expm1(slope)
	if weeks < 3 {
		t.Reason = "growth from 2 complete weeks; a forecast needs 3"
		return t
	}
	slope, intercept, r2 := leastSquares(xs, peaks)
	at := float64(weeks - 1 + q.HorizonWeeks)
	t.Forecast = &Forecast{
		At:              q.Start.Add(time.Duration(weeks-1+q.HorizonWeeks) * week),
		TokensPerSecond: max(0, intercept+slope*at),
		Slope:           slope, Intercept: intercept, R2: r2, Weeks: weeks,
	}
	return t
}

// leastSquares fits y = intercept + slope·x and returns the coefficient of
// determination (1 for a perfect fit, constant data included).
func leastSquares(xs, ys []float64) (slope, intercept, r2 float64) {
	n := float64(len(xs))
	var mx, my float64
	for i := range xs {
		mx += xs[i]
		my += ys[i]
	}
	mx, my = mx/n, my/n
	var sxy, sxx float64
	for i := range xs {
		sxy += (xs[i] - mx) * (ys[i] - my)
		sxx += (xs[i] - mx) * (xs[i] - mx)
	}
	slope = sxy / sxx
	intercept = my - slope*mx
	var res, tot float64
	for i := range xs {
		e := ys[i] - (intercept + slope*xs[i])
		res += e * e
		tot += (ys[i] - my) * (ys[i] - my)
	}
	r2 = 1
	if tot > 0 {
		r2 = 1 - res/tot
	}
	return slope, intercept, r2
}

// nearestRank is the p-quantile of vs by the nearest-rank rule (vs is
// reordered).
func nearestRank(vs []float64, p float64) float64 {
	slices.Sort(vs)
	i := int(math.Ceil(p*float64(len(vs)))) - 1
	return vs[max(0, min(i, len(vs)-1))]
}

// firstKeys is the first n keys of m in order.
func firstKeys(m map[string]bool, n int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	if len(out) > n {
		return slices.Clone(out[:n]) // not the whole array
	}
	return out
}
