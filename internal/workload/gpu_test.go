package workload

import (
	"testing"
	"time"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

func TestFleetSamplesCoverEveryDeployment(t *testing.T) {
	start := time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
	cfg := FleetConfig{Start: start, Duration: time.Hour, Interval: time.Minute, IdleDeployment: "spare"}
	seconds := map[string]float64{}
	busy := map[string]float64{}
	ids := map[string]bool{}
	var last time.Time
	err := FleetSamples(cfg, func(s *meterv1.GpuSample) error {
		seconds[s.GetDeployment()] += s.GetIntervalS()
		busy[s.GetDeployment()] += s.GetIntervalS() * s.GetUtilization()
		if ids[s.GetSampleId()] {
			t.Errorf("duplicate sample id %s", s.GetSampleId())
		}
		ids[s.GetSampleId()] = true
		if at := s.GetSampledAt().AsTime(); at.Before(last) || !at.After(start) || at.After(start.Add(time.Hour)) {
			t.Errorf("sampled_at %s out of order or range", at)
		} else {
			last = at
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range DefaultModels() {
		want := float64(2*m.TensorParallelism) * 3600
		if seconds[m.Deployment] != want {
			t.Errorf("%s: %v GPU-seconds, want %v (2 replicas × TP %d × 1 h)", m.Deployment, seconds[m.Deployment], want, m.TensorParallelism)
		}
		if busy[m.Deployment] <= 0 || busy[m.Deployment] >= seconds[m.Deployment] {
			t.Errorf("%s: busy %v of %v", m.Deployment, busy[m.Deployment], seconds[m.Deployment])
		}
	}
	if seconds["spare"] != 3600 || busy["spare"] != 0 {
		t.Errorf("idle deployment: %v seconds, %v busy; want 3600 and 0", seconds["spare"], busy["spare"])
	}
}
