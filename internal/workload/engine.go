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
// the peak, with preemptions once it is full. Each replica's engine
// restarts about once in restartEvery (a replica's first sample knows of
// no restart).
// The samples are deterministic, so a replay is idempotent.
func EngineSamples(cfg FleetConfig, emit func(*meterv1.EngineSample) error) error {
	cfg, err := cfg.withDefaults("engine fleet")
	if err != nil {
		return err
	}
	start := cfg.Start.UTC().Truncate(time.Second)
	iv := cfg.Interval.Seconds()
	tr := newTrend(start, cfg.Duration, cfg.WeeklyGrowth)
	every := max(int64(restartEvery/cfg.Interval), 1)
	for at := start.Add(cfg.Interval); !at.After(start.Add(cfg.Duration)); at = at.Add(cfg.Interval) {
		n := int64(at.Sub(start) / cfg.Interval) // 1 at the first samples
		load := dayCycle(at.UnixNano(), cfg.DiurnalAmplitude) * tr.at(at.UnixNano())
		for mi, m := range cfg.Models {
			if m.Engine != "vllm" && m.Engine != "sglang" {
				continue
			}
			for r := range cfg.replicas(m) {
				wobble := math.Sin(float64(at.Unix())/89 + float64(7*mi+r))
				base := 0.3 + 0.08*float64(mi%4)
				if m.Busy > 0 {
					base = m.Busy
				}
				busy := min(1, max(0, busy(m, base, load)+0.04*wobble))
				kv := min(1, 0.1+1.3*busy)
				replica := fmt.Sprintf("%s-%d", m.Deployment, r)
				s := &meterv1.EngineSample{
					SampleId: fmt.Sprintf("%s/%d", replica, at.UnixMilli()), Deployment: m.Deployment, Engine: m.Engine,
					Replica: replica, Model: m.Name, Node: fmt.Sprintf("%s-node-%d", m.Deployment, r),
					SampledAt: timestamppb.New(at), IntervalS: iv, Source: "replay",
					Running: proto.Uint32(uint32(math.Round(64 * busy))),
					// The queue builds up once the replica is more than 35% busy.
					Waiting:      proto.Uint32(uint32(math.Round(max(0, waiting(m, busy)+2*wobble)))),
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
				if n > 1 {
					var restarted uint32
					if (n+int64(97*mi+31*r))%every == 0 {
						restarted = 1
					}
					s.Restarts = &restarted
				}
				if err := emit(s); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// restartEvery is how often, about, a synthetic replica's engine restarts.
const restartEvery = 30 * time.Hour

// waiting is the mean queue depth of a replica of m this busy: it builds up
// once the replica is more than 35% busy, or, for a deployment sized by
// Model.Busy, only near flat out.
func waiting(m Model, busy float64) float64 {
	if m.Busy > 0 {
		return 150 * max(0, busy-0.85)
	}
	return 80 * (busy - 0.35)
}
