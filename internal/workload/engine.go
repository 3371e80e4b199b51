package workload

import (
	"fmt"
	"math"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// EngineSamples calls emit with synthetic engine samples of the fleet (the
// replicas of each vLLM and SGLang deployment, cfg.Replicas of them; the
// scraper does not read TensorRT-LLM), in time order: running requests
// follow the diurnal load, the queue builds up and the KV cache fills near
// the peak, with preemptions once it is full.
// The samples are deterministic, so a replay is idempotent.
func EngineSamples(cfg FleetConfig, emit func(*meterv1.EngineSample) error) error {
	cfg, err := cfg.withDefaults("engine fleet")
	if err != nil {
		return err
	}
	start := cfg.Start.UTC().Truncate(time.Second)
	iv := cfg.Interval.Seconds()
	for at := start.Add(cfg.Interval); !at.After(start.Add(cfg.Duration)); at = at.Add(cfg.Interval) {
		sod := float64(at.Hour()*3600 + at.Minute()*60 + at.Second())
		load := 1 + cfg.DiurnalAmplitude*math.Cos(2*math.Pi*(sod-PeakHourUTC*3600)/86400)
		for mi, m := range cfg.Models {
			if m.Engine != "vllm" && m.Engine != "sglang" {
				continue
			}
			for r := range cfg.Replicas {
				wobble := math.Sin(float64(at.Unix())/89 + float64(7*mi+r))
				busy := min(1, max(0, (0.3+0.08*float64(mi%4))*load+0.04*wobble))
				kv := min(1, 0.1+1.3*busy)
				replica := fmt.Sprintf("%s-%d", m.Deployment, r)
				s := &meterv1.EngineSample{
					SampleId: fmt.Sprintf("%s/%d", replica, at.UnixMilli()), Deployment: m.Deployment, Engine: m.Engine,
					Replica: replica, Model: m.Name, Node: fmt.Sprintf("%s-node-%d", m.Deployment, r),
					SampledAt: timestamppb.New(at), IntervalS: iv, Source: "replay",
					Running: proto.Uint32(uint32(math.Round(64 * busy))),
					// The queue builds up once the replica is more than 35% busy.
					Waiting:      proto.Uint32(uint32(math.Round(max(0, 80*(busy-0.35)+2*wobble)))),
					KvCacheUsage: proto.Float64(kv),
				}
				queries := uint64(math.Round(40 * iv * 64 * busy * 30))
				s.PrefixCacheQueries, s.PrefixCacheHits = proto.Uint64(queries), proto.Uint64(uint64(float64(queries)*m.CacheHitRate))
				pre := uint64(0)
				if kv >= 0.98 {
					pre = uint64(1 + r%2)
				}
				s.Preemptions = proto.Uint64(pre)
				if s.Engine == "vllm" {
					s.BatchTokens = proto.Float64(math.Round(64*busy) + 512*busy)
				}
				if err := emit(s); err != nil {
					return err
				}
			}
		}
	}
	return nil
}
