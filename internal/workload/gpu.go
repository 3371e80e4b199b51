package workload

import (
	"cmp"
	"fmt"
	"math"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// FleetConfig shapes synthetic GPU samples for a fleet of models: each
// model's deployment runs Replicas replicas of TensorParallelism GPUs,
// sampled every Interval, busy in step with the diurnal traffic cycle.
type FleetConfig struct {
	// Start and Duration bound sampled_at: samples fall in (Start, Start+Duration].
	Start    time.Time
	Duration time.Duration
	// Interval between samples of one GPU. Default 10s.
	Interval time.Duration
	// Replicas per deployment. Default 2.
	Replicas int
	// Models is the fleet; nil means DefaultModels().
	Models []Model
	// DiurnalAmplitude as in Config; default DefaultDiurnalAmplitude.
	DiurnalAmplitude float64
	// WeeklyGrowth as in Config: the load grows by this share a week.
	WeeklyGrowth float64
	// IdleDeployment adds a deployment of one GPU that serves no traffic
	// (all of its time is idle), when non-empty.
	IdleDeployment string
}

// withDefaults fills what c leaves zero and checks the span; what names
// the fleet in the error.
func (c FleetConfig) withDefaults(what string) (FleetConfig, error) {
	if c.Interval == 0 {
		c.Interval = 10 * time.Second
	}
	if c.Replicas == 0 {
		c.Replicas = 2
	}
	if c.Models == nil {
		c.Models = DefaultModels()
	}
	if c.DiurnalAmplitude == 0 {
		c.DiurnalAmplitude = DefaultDiurnalAmplitude
	}
	if c.Duration <= 0 || c.Interval <= 0 {
		return c, fmt.Errorf("%s: duration %s and interval %s must be positive", what, c.Duration, c.Interval)
	}
	if !(c.WeeklyGrowth >= 0 && c.WeeklyGrowth <= 1) {
		return c, fmt.Errorf("%s: weekly growth %g must be in [0, 1]", what, c.WeeklyGrowth)
	}
	return c, nil
}

// replicas is the number of replicas of m's deployment.
func (c FleetConfig) replicas(m Model) int {
	if m.Replicas > 0 {
		return m.Replicas
	}
	return c.Replicas
}

// busy is how busy (0 to 1) a deployment of m is at a time of load
// (relative to its mean), given its busyness at mean load: in step with
// the load, flat out from m.Saturation on.
func busy(m Model, base, load float64) float64 {
	b := base * load
	if m.Saturation > 0 {
		// Busy reaches ~0.97 at the knee and stays there.
		b = min(0.97, 0.97*load/m.Saturation)
	}
	return b
}

// FleetSamples calls emit with every sample of the fleet, in time order.
// The samples are deterministic: the same config gives the same samples
// (sample ids included), so a replay is idempotent.
func FleetSamples(cfg FleetConfig, emit func(*meterv1.GpuSample) error) error {
	cfg, err := cfg.withDefaults("fleet")
	if err != nil {
		return err
	}
	type gpu struct {
		m     Model
		uuid  string
		node  string
		index uint32
		base  float64 // mean utilization
		idle  bool
	}
	var gpus []gpu
	for mi, m := range cfg.Models {
		for r := 0; r < cfg.replicas(m); r++ {
			for i := uint32(0); i < max(m.TensorParallelism, 1); i++ {
				node := fmt.Sprintf("%s-node-%d", m.Deployment, r)
				base := 0.35 + 0.1*float64(mi%4)
				if m.Busy > 0 {
					base = m.Busy
				}
				gpus = append(gpus, gpu{m: m, uuid: fmt.Sprintf("GPU-%02d%02d%02d-synthetic", mi, r, i), node: node, index: i,
					base: base})
			}
		}
	}
	if cfg.IdleDeployment != "" && len(cfg.Models) > 0 {
		m := cfg.Models[0]
		m.Deployment = cfg.IdleDeployment
		gpus = append(gpus, gpu{m: m, uuid: "GPU-idle-synthetic", node: cfg.IdleDeployment + "-node-0", idle: true})
	}
	start := cfg.Start.UTC().Truncate(time.Second)
	tr := newTrend(start, cfg.Duration, cfg.WeeklyGrowth)
	for at := start.Add(cfg.Interval); !at.After(start.Add(cfg.Duration)); at = at.Add(cfg.Interval) {
		load := dayCycle(at.UnixNano(), cfg.DiurnalAmplitude) * tr.at(at.UnixNano())
		for k, g := range gpus {
			util := 0.0
			if !g.idle {
				// A deterministic wobble per GPU and sample keeps the series lifelike.
				wobble := 0.05 * math.Sin(float64(at.Unix())/97+float64(k))
				if g.m.Busy > 0 {
					wobble *= min(1, 2*g.base) // a quiet GPU wobbles less
				}
				util = min(1, max(0, busy(g.m, g.base, load)+wobble))
			}
			power := 90 + 600*util
			s := &meterv1.GpuSample{
				SampleId:     fmt.Sprintf("%s/%s/0/%d", g.node, g.uuid, at.UnixMilli()),
				Node:         g.node,
				GpuUuid:      g.uuid,
				GpuIndex:     g.index,
				GpuType:      g.m.GPUType,
				Deployment:   g.m.Deployment,
				Region:       g.m.Region,
				Pool:         cmp.Or(g.m.Pool, "on-demand"),
				SampledAt:    timestamppb.New(at),
				IntervalS:    cfg.Interval.Seconds(),
				Utilization:  util,
				FbUsedBytes:  uint64(60+15*util) << 30,
				FbTotalBytes: 80 << 30,
				PowerWatts:   power,
				EnergyJoules: power * cfg.Interval.Seconds(),
				TemperatureC: 35 + 40*util,
				SmClockMhz:   1980,
				// The H100's maximum SM clock (the normal clock of
				// throttling); SM activity a little below the engine's.
				SmClockMaxMhz: 1980,
				SmActive:      proto.Float64(0.9 * util),
				Source:        "replay",
			}
			if err := emit(s); err != nil {
				return err
			}
		}
	}
	return nil
}
