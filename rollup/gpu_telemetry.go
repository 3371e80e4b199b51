package rollup

// ThrottleClockShare is the share of a GPU's normal SM clock below which a
// busy sample counts as clock-throttled: a GPU under load runs at or near
// its maximum clock unless power, thermal or reliability limits hold it
// back; boost steps of a few percent are not throttling.
const ThrottleClockShare = 0.9

// mib is the unit of GPUTelemetry's memory sums.
const mib = 1 << 20

// GPUTelemetry is the sums and maxima of the GPU samples of a gpu_hour (or
// gpu_device_hour) row from which the telemetry of any range is derived
// (GPUTelemetry.Summary): every field adds up (or takes the max) across
// rows. Seconds are sample seconds (interval_s) of the samples that
// carried the reading, except ClockSeconds and ThrottleSeconds, which are
// effective GPU-seconds (a MIG instance counts its fraction of the card,
// whose clock it shares). A reading of 0 (memory total, power, temperature,
// SM clock) is taken as not reported; SM activity is reported when
// GPUSampleRow.SMActive >= 0.
type GPUTelemetry struct {
	// FBSeconds: samples with fb_total_bytes > 0; the MiB-seconds of
	// memory in use and of memory there was over them (MiB, not bytes:
	// the sums of a month of a large group stay below 1e13, which the
	// stored sums are read exactly up to).
	FBSeconds, FBUsedMiBSeconds, FBTotalMiBSeconds float64
	// FBUsedMax is the most memory in use of one sample; FBUsedMaxRatio the
	// largest used / total of one sample.
	FBUsedMax      uint64
	FBUsedMaxRatio float64
	// PowerSeconds: samples with power; PowerWattSeconds the Σ watts × s.
	PowerSeconds, PowerWattSeconds, PowerMax float64
	// TempSeconds: samples with a temperature; TempDegreeSeconds Σ °C × s.
	TempSeconds, TempDegreeSeconds, TempMax float64
	// ClockSeconds: busy samples (utilization > 0) with an SM clock and a
	// normal clock; ThrottleSeconds those below ThrottleClockShare of it.
	ClockSeconds, ThrottleSeconds float64
	// SMActiveSeconds: samples with SM activity; SMActiveSum Σ ratio × s.
	SMActiveSeconds, SMActiveSum float64
}

// AddSample adds one sample; normalClock is its GPU's normal SM clock in
// MHz (NormalClocks), 0 when unknown.
func (t *GPUTelemetry) AddSample(s GPUSampleRow, normalClock float64) {
	dt := s.IntervalS
	if dt <= 0 {
		return
	}
	if s.FBTotalBytes > 0 {
		t.FBSeconds += dt
		t.FBUsedMiBSeconds += float64(s.FBUsedBytes) / mib * dt
		t.FBTotalMiBSeconds += float64(s.FBTotalBytes) / mib * dt
		t.FBUsedMaxRatio = max(t.FBUsedMaxRatio, float64(s.FBUsedBytes)/float64(s.FBTotalBytes))
	}
	t.FBUsedMax = max(t.FBUsedMax, s.FBUsedBytes)
	if s.PowerWatts > 0 {
		t.PowerSeconds += dt
		t.PowerWattSeconds += s.PowerWatts * dt
		t.PowerMax = max(t.PowerMax, s.PowerWatts)
	}
	if s.TemperatureC > 0 {
		t.TempSeconds += dt
		t.TempDegreeSeconds += s.TemperatureC * dt
		t.TempMax = max(t.TempMax, s.TemperatureC)
	}
	if s.Utilization > 0 && s.SMClockMHz > 0 && normalClock > 0 {
		eff := dt * effectiveFraction(s.MIGFraction)
		t.ClockSeconds += eff
		if s.SMClockMHz < ThrottleClockShare*normalClock {
			t.ThrottleSeconds += eff
		}
	}
	if s.SMActive >= 0 {
		t.SMActiveSeconds += dt
		t.SMActiveSum += min(s.SMActive, 1) * dt
	}
}

// effectiveFraction is the share of the card a sample's GPU time counts
// (billing.GPUUsage's rule): 0 or 1 and out-of-range values mean the whole
// GPU.
func effectiveFraction(f float64) float64 {
	if f <= 0 || f > 1 {
		return 1
	}
	return f
}

// Merge adds o's sums and takes the larger maxima.
func (t *GPUTelemetry) Merge(o GPUTelemetry) {
	t.FBSeconds += o.FBSeconds
	t.FBUsedMiBSeconds += o.FBUsedMiBSeconds
	t.FBTotalMiBSeconds += o.FBTotalMiBSeconds
	t.FBUsedMax = max(t.FBUsedMax, o.FBUsedMax)
	t.FBUsedMaxRatio = max(t.FBUsedMaxRatio, o.FBUsedMaxRatio)
	t.PowerSeconds += o.PowerSeconds
	t.PowerWattSeconds += o.PowerWattSeconds
	t.PowerMax = max(t.PowerMax, o.PowerMax)
	t.TempSeconds += o.TempSeconds
	t.TempDegreeSeconds += o.TempDegreeSeconds
	t.TempMax = max(t.TempMax, o.TempMax)
	t.ClockSeconds += o.ClockSeconds
	t.ThrottleSeconds += o.ThrottleSeconds
	t.SMActiveSeconds += o.SMActiveSeconds
	t.SMActiveSum += o.SMActiveSum
}

// GPUTelemetrySummary is the telemetry of a range as the API serves it
// (tokenmeter.v1.GpuTelemetry): time-weighted means per GPU (or MIG
// instance), maxima of one sample, and the hours each reading covers.
type GPUTelemetrySummary struct {
	MemoryUsedMeanBytes                       float64
	MemoryUsedMaxBytes                        uint64
	MemoryUsedRatio, MemoryUsedMaxRatio       float64
	MemoryHours                               float64
	PowerMeanWatts, PowerMaxWatts, PowerHours float64
	TemperatureMeanC, TemperatureMaxC         float64
	TemperatureHours                          float64
	ClockThrottleSeconds, ClockHours          float64
	ClockThrottleShare                        float64
	SMActive, SMActiveHours                   float64
}

// Summary derives the served figures from the sums.
func (t GPUTelemetry) Summary() GPUTelemetrySummary {
	div := func(a, b float64) float64 {
		if b == 0 {
			return 0
		}
		return a / b
	}
	return GPUTelemetrySummary{
		MemoryUsedMeanBytes:  div(t.FBUsedMiBSeconds, t.FBSeconds) * mib,
		MemoryUsedMaxBytes:   t.FBUsedMax,
		MemoryUsedRatio:      div(t.FBUsedMiBSeconds, t.FBTotalMiBSeconds),
		MemoryUsedMaxRatio:   t.FBUsedMaxRatio,
		MemoryHours:          t.FBSeconds / 3600,
		PowerMeanWatts:       div(t.PowerWattSeconds, t.PowerSeconds),
		PowerMaxWatts:        t.PowerMax,
		PowerHours:           t.PowerSeconds / 3600,
		TemperatureMeanC:     div(t.TempDegreeSeconds, t.TempSeconds),
		TemperatureMaxC:      t.TempMax,
		TemperatureHours:     t.TempSeconds / 3600,
		ClockThrottleSeconds: t.ThrottleSeconds,
		ClockHours:           t.ClockSeconds / 3600,
		ClockThrottleShare:   div(t.ThrottleSeconds, t.ClockSeconds),
		SMActive:             div(t.SMActiveSum, t.SMActiveSeconds),
		SMActiveHours:        t.SMActiveSeconds / 3600,
	}
}

// NormalClocks returns the normal SM clock of each sample, in order: the
// sample's own maximum SM clock (sm_clock_max_mhz) where reported, else
// the highest SM clock that any sample of the same deployment and GPU type
// reached in the samples given (an hour's: a deployment's samples are on
// one shard in cluster mode, so every server derives the same value).
func NormalClocks(samples []GPUSampleRow) []float64 {
	type key struct{ dep, gpuType string }
	highest := map[key]float64{}
	for _, s := range samples {
		k := key{s.Deployment, s.GPUType}
		highest[k] = max(highest[k], s.SMClockMHz)
	}
	out := make([]float64, len(samples))
	for i, s := range samples {
		if s.SMClockMaxMHz > 0 {
			out[i] = s.SMClockMaxMHz
		} else {
			out[i] = highest[key{s.Deployment, s.GPUType}]
		}
	}
	return out
}
