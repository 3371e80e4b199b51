package render

import (
	"fmt"
	"math"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// The fixtures are hand-built reports: the renderers compute nothing, so
// the figures need not be consistent with each other, only realistic.

var fixtureStart = time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC) // a Monday

const evilName = `<script>alert(1)</script>`

func ts(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t) }

// usd is an amount of nanos as the API writes it.
func usd(nanos int64) *meterv1.Money {
	sign := ""
	a := nanos
	if a < 0 {
		sign, a = "-", -a
	}
	return &meterv1.Money{Currency: "USD", Nanos: nanos, Amount: fmt.Sprintf("%s%d.%09d", sign, a/1e9, a%1e9)}
}

// fixtureUnit is a unit with days days of hourly detail: a daily load
// wave on gpus GPUs that saturates above satLoad tokens/s per GPU.
func fixtureUnit(name string, days int, gpus float64, peakTPS, satLoad float64, withForecast bool) *meterv1.CapacityUnit {
	u := &meterv1.CapacityUnit{
		Name: name, Deployments: []string{name}, Models: []string{"llama-3.1-70b"}, GpuTypes: []string{"h100-80gb"},
		Hours: int32(days * 24), HoursWithGpus: int32(days * 24), MeanGpus: gpus, MaxGpus: uint32(math.Ceil(gpus)) + 2,
		Cost: usd(12_345_678_901_234), BusyCost: usd(8_000_000_000_001), IdleCost: usd(4_345_678_901_233),
		UnpricedGpuHours: 0,
	}
	var gpuHours, busy float64
	var req, good, in, out uint64
	var peak *meterv1.CapacityHour
	var sust *meterv1.CapacityHour
	qualifying, supporting, missed := 0, 0, 0
	for h := 0; h < days*24; h++ {
		at := fixtureStart.Add(time.Duration(h) * time.Hour)
		wave := 0.5 - 0.45*math.Cos(2*math.Pi*float64(h%24)/24) // 0.05 .. 0.95
		growth := 1 + 0.03*float64(h)/168
		tps := peakTPS * wave * growth
		perGPU := tps / gpus
		att := 0.999
		if perGPU > satLoad {
			att = 0.999 - (perGPU-satLoad)/satLoad*0.8
		}
		requests := uint64(tps * 3600 / 900)
		goodReq := uint64(float64(requests) * att)
		util := math.Min(0.98, 0.1+0.85*wave)
		hd := &meterv1.CapacityHour{Start: ts(at), Gpus: gpus, Utilization: util, TokensPerSecond: tps, TokensPerSecondPerGpu: perGPU,
			Requests: requests, GoodRequests: goodReq, Attainment: float64(goodReq) / float64(max(requests, 1)), Qualifies: requests >= 100}
		u.HoursDetail = append(u.HoursDetail, hd)
		gpuHours += gpus
		busy += gpus * util
		req += requests
		good += goodReq
		in += uint64(tps * 3600 * 0.8)
		out += uint64(tps * 3600 * 0.2)
		if peak == nil || tps > peak.TokensPerSecond {
			peak = hd
		}
		if hd.Qualifies {
			qualifying++
			if hd.Attainment >= 0.99 && (sust == nil || perGPU > sust.TokensPerSecondPerGpu) {
				sust = hd
			}
		}
	}
	for _, hd := range u.HoursDetail {
		if hd.Qualifies && sust != nil && hd.TokensPerSecondPerGpu <= sust.TokensPerSecondPerGpu {
			supporting++
			if hd.Attainment < 0.99 {
				missed++
			}
		}
	}
	u.GpuHours, u.BusyGpuHours, u.IdleGpuHours = gpuHours, busy, gpuHours-busy
	u.Utilization, u.P95Utilization, u.IdleShare = busy/gpuHours, 0.93, 1-busy/gpuHours
	u.Requests, u.GoodRequests, u.InputTokens, u.OutputTokens = req, good, in, out
	u.Attainment = float64(good) / float64(req)
	u.TokensPerSecondPerGpu = float64(in+out) / (gpuHours * 3600)
	u.Peak = &meterv1.CapacityPeakHour{Start: peak.Start, TokensPerSecond: peak.TokensPerSecond, Gpus: peak.Gpus,
		TokensPerSecondPerGpu: peak.TokensPerSecondPerGpu, Requests: peak.Requests, Attainment: peak.Attainment,
		Saturation: &meterv1.EngineStatsPoint{Start: peak.Start, Samples: 2160, Replicas: 6, WaitingMean: 6.5, WaitingMax: 31, WaitingP95: 14,
			RunningMean: 48, RunningMax: 64, KvCacheUsageMean: 0.71, KvCacheUsageMax: 0.97, KvCacheSamples: 2160, Preemptions: 12}}
	u.Sustainable = &meterv1.SustainableLoad{Known: true, TokensPerSecondPerGpu: sust.TokensPerSecondPerGpu, Hour: sust.Start,
		SupportingHours: int32(supporting), MissedHours: int32(missed), QualifyingHours: int32(qualifying)}
	u.HeadroomKnown = true
	u.Headroom = 1 - peak.TokensPerSecondPerGpu/sust.TokensPerSecondPerGpu
	need := func(forWhat string, load float64) *meterv1.GpusNeeded {
		n := int64(math.Ceil(load / sust.TokensPerSecondPerGpu))
		return &meterv1.GpusNeeded{For: forWhat, TokensPerSecond: load, Gpus: n, Change: n - int64(u.MaxGpus),
			Arithmetic: fmt.Sprintf("ceil(%.1f tokens/s ÷ %.1f tokens/s per GPU) = %d", load, sust.TokensPerSecondPerGpu, n)}
	}
	u.GpusNeeded = []*meterv1.GpusNeeded{need("observed peak", peak.TokensPerSecond), need("growth 1.3", 1.3*peak.TokensPerSecond)}
	for wd := 0; wd < 7; wd++ {
		d := &meterv1.LoadProfileDay{Weekday: int32(wd)}
		// The range starts on a Monday: the days-long range covers each
		// weekday's slots n times.
		n := 0
		for day := 0; day < days; day++ {
			if (1+day)%7 == wd {
				n++
			}
		}
		for h := 0; h < 24; h++ {
			v := 0.0
			if n > 0 {
				v = peakTPS * (0.5 - 0.45*math.Cos(2*math.Pi*float64(h)/24)) * (1 + 0.02*float64(wd))
			}
			d.TokensPerSecond = append(d.TokensPerSecond, v)
			d.Hours = append(d.Hours, int32(n))
		}
		u.LoadProfile = append(u.LoadProfile, d)
	}
	for d := 0; d < days; d++ {
		at := fixtureStart.AddDate(0, 0, d)
		u.Days = append(u.Days, &meterv1.CapacityDay{Start: ts(at), BusyCost: usd(int64(300e9 + float64(d)*7e9)), IdleCost: usd(int64(150e9 - float64(d)*2e9)),
			BusyGpuHours: gpus * 24 * 0.55, GpuHours: gpus * 24, Tokens: uint64(peakTPS * 0.5 * 86400)})
	}
	u.Trend = &meterv1.CapacityTrend{}
	for w := 0; w+7 <= days; w += 7 {
		at := fixtureStart.AddDate(0, 0, w)
		u.Trend.Weeks = append(u.Trend.Weeks, &meterv1.CapacityWeek{Start: ts(at), Tokens: uint64(peakTPS * 0.5 * 86400 * 7 * (1 + 0.03*float64(w/7))),
			PeakTokensPerSecond: peakTPS * 0.95 * (1 + 0.03*float64(w/7)), PeakHour: ts(at.Add(12 * time.Hour))})
	}
	if n := len(u.Trend.Weeks); n >= 2 {
		u.Trend.GrowthKnown, u.Trend.TokensGrowth, u.Trend.PeakGrowth = true, 0.03, 0.0297
	} else {
		u.Trend.Reason = fmt.Sprintf("%d complete weeks in the range; growth needs 2", n)
	}
	if n := len(u.Trend.Weeks); withForecast && n >= 3 {
		slope, icpt := peakTPS*0.95*0.03, peakTPS*0.95
		at := fixtureStart.AddDate(0, 0, 7*(n-1+13))
		u.Trend.Forecast = &meterv1.PeakForecast{At: ts(at), Slope: slope, Intercept: icpt, TokensPerSecond: icpt + slope*float64(n-1+13), R2: 0.97, Weeks: int32(n)}
		u.GpusNeeded = append(u.GpusNeeded, need("forecast peak", u.Trend.Forecast.TokensPerSecond))
	}
	return u
}

// sampleReport is a realistic report: three weeks of two deployments, one
// of them named like a script, and the fleet.
func sampleReport() *meterv1.CapacityReport {
	a := fixtureUnit("llama-70b-prod", 21, 16, 48_000, 2_400, true)
	b := fixtureUnit(evilName, 21, 8, 6_000, 2_000, true)
	b.Utilization, b.IdleShare = 0.18, 0.82
	fleet := fixtureUnit("fleet", 21, 24, 54_000, 2_300, true)
	fleet.Deployments = []string{evilName, "llama-70b-prod"}
	return &meterv1.CapacityReport{
		Start: ts(fixtureStart), End: ts(fixtureStart.AddDate(0, 0, 21)), GroupBy: "deployment",
		Target: 0.99, Growth: "1.3", HorizonWeeks: 13, MinHourRequests: 100, MissTolerance: 0.05,
		LowUtilization: 0.3, HeadroomRisk: 0.2, Currency: "USD",
		Fleet: fleet, Units: []*meterv1.CapacityUnit{b, a},
		Findings: []*meterv1.CapacityFinding{
			{Unit: "llama-70b-prod", Kind: "at_risk", Severity: 2, Text: "headroom 8.0% at the peak, below 20%: add GPUs before next week's peak"},
			{Unit: evilName, Kind: "over_provisioned", Severity: 1, Text: "utilization 18.0%, idle cost USD 4,345.68: " + evilName},
			{Unit: "fleet", Kind: "saturated", Severity: 0, Text: "attainment falls above 2,300 tokens/s per GPU"},
		},
	}
}

// unknownReport has a unit whose sustainable throughput, headroom, growth
// and forecast are unknown, one without GPU samples, and one of a single hour.
func unknownReport() *meterv1.CapacityReport {
	u := fixtureUnit("short", 2, 4, 4_000, 1e9, false)
	u.Sustainable = &meterv1.SustainableLoad{Known: false, Reason: "only 3 qualifying hours; an estimate needs 24", QualifyingHours: 3}
	u.HeadroomKnown, u.Headroom = false, 0
	u.GpusNeeded = nil

	noGPU := &meterv1.CapacityUnit{Name: "no-gpus", Deployments: []string{"no-gpus"}, Hours: 48, Requests: 500, GoodRequests: 499,
		InputTokens: 10_000, OutputTokens: 2_000, Attainment: 0.998,
		Cost: usd(0), BusyCost: usd(0), IdleCost: usd(0),
		Peak:        &meterv1.CapacityPeakHour{Start: ts(fixtureStart.Add(5 * time.Hour)), TokensPerSecond: 1.5, Requests: 40, Attainment: 1},
		Sustainable: &meterv1.SustainableLoad{Reason: "no GPU samples"},
		Trend:       &meterv1.CapacityTrend{Reason: "0 complete weeks in the range; growth needs 2"},
		HoursDetail: []*meterv1.CapacityHour{{Start: ts(fixtureStart.Add(5 * time.Hour)), TokensPerSecond: 1.5, Requests: 40, GoodRequests: 40, Attainment: 1}},
	}

	one := &meterv1.CapacityUnit{Name: "one-hour", Hours: 48, HoursWithGpus: 1, MeanGpus: 2, MaxGpus: 2, GpuHours: 2, BusyGpuHours: 1, IdleGpuHours: 1,
		Utilization: 0.5, P95Utilization: 0.5, IdleShare: 0.5, Cost: usd(7_000_000_000), BusyCost: usd(3_500_000_000), IdleCost: usd(3_500_000_000),
		Sustainable: &meterv1.SustainableLoad{Reason: "no hour with requests"},
		Trend:       &meterv1.CapacityTrend{Reason: "0 complete weeks in the range; growth needs 2"},
		HoursDetail: []*meterv1.CapacityHour{{Start: ts(fixtureStart.Add(3 * time.Hour)), Gpus: 2, Utilization: 0.5}},
		Days:        []*meterv1.CapacityDay{{Start: ts(fixtureStart), BusyCost: usd(3_500_000_000), IdleCost: usd(3_500_000_000), BusyGpuHours: 1, GpuHours: 2}},
	}
	r := sampleReport()
	r.Start, r.End = ts(fixtureStart), ts(fixtureStart.Add(48*time.Hour))
	r.Growth = "1"
	r.Fleet = fixtureUnit("fleet", 2, 6, 5_000, 1e9, false)
	r.Fleet.Sustainable = &meterv1.SustainableLoad{Reason: "too few qualifying hours"}
	r.Fleet.HeadroomKnown, r.Fleet.GpusNeeded = false, nil
	r.Units = []*meterv1.CapacityUnit{noGPU, one, u}
	r.Findings = []*meterv1.CapacityFinding{{Unit: "short", Kind: "not_enough_data", Severity: 0, Text: "two days are too short for a trend"}}
	return r
}

// emptyReport is a report of a range without any data.
func emptyReport() *meterv1.CapacityReport {
	return &meterv1.CapacityReport{
		Start: ts(fixtureStart), End: ts(fixtureStart.AddDate(0, 0, 7)), GroupBy: "deployment",
		Target: 0.99, Growth: "1", HorizonWeeks: 13, MinHourRequests: 100, MissTolerance: 0.05, LowUtilization: 0.3, HeadroomRisk: 0.2,
		Currency:      "USD",
		NotEnoughData: "no GPU samples and no traffic between 2026-11-02T00:00:00Z and 2026-11-09T00:00:00Z",
		// As the API sends it: a fleet of nothing.
		Fleet: &meterv1.CapacityUnit{Name: "fleet", Hours: 168, Sustainable: &meterv1.SustainableLoad{Reason: "no qualifying hour"},
			Cost: usd(0), BusyCost: usd(0), IdleCost: usd(0), Trend: &meterv1.CapacityTrend{Reason: "no complete week with tokens"}},
	}
}
