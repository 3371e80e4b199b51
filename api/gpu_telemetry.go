package api

import (
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/rollup"
)

// gpuTelemetry is the API form of a range's GPU telemetry (GetGpuUsage's
// points and the capacity report's units and hours).
func gpuTelemetry(t rollup.GPUTelemetrySummary) *meterv1.GpuTelemetry {
	return &meterv1.GpuTelemetry{
		MemoryUsedMeanBytes:  t.MemoryUsedMeanBytes,
		MemoryUsedMaxBytes:   t.MemoryUsedMaxBytes,
		MemoryUsedRatio:      t.MemoryUsedRatio,
		MemoryUsedMaxRatio:   t.MemoryUsedMaxRatio,
		MemoryHours:          t.MemoryHours,
		PowerMeanWatts:       t.PowerMeanWatts,
		PowerMaxWatts:        t.PowerMaxWatts,
		PowerHours:           t.PowerHours,
		TemperatureMeanC:     t.TemperatureMeanC,
		TemperatureMaxC:      t.TemperatureMaxC,
		TemperatureHours:     t.TemperatureHours,
		ClockThrottleSeconds: t.ClockThrottleSeconds,
		ClockHours:           t.ClockHours,
		ClockThrottleShare:   t.ClockThrottleShare,
		SmActive:             t.SMActive,
		SmActiveHours:        t.SMActiveHours,
	}
}
