package api_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/testkit/billingtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// engineSamples makes n random engine samples over hours hours from start:
// two deployments of two and three replicas, fields left unset at random.
func engineSamples(rng *rand.Rand, start time.Time, hours, n int) []*meterv1.EngineSample {
	var out []*meterv1.EngineSample
	for i := range n {
		dep := []string{"llama", "qwen"}[i%2]
		rep := fmt.Sprintf("%s-%d", dep, rng.IntN(2+i%2))
		eng := map[string]string{"llama": "vllm", "qwen": "sglang"}[dep]
		at := start.Add(time.Duration(rng.Int64N(int64(hours) * int64(time.Hour)))).Truncate(time.Millisecond)
		s := &meterv1.EngineSample{SampleId: fmt.Sprintf("s%d", i), Deployment: dep, Engine: eng, Replica: rep, Model: dep + "-model",
			SampledAt: timestamppb.New(at), IntervalS: float64(5 + rng.IntN(10)), Source: "scrape"}
		if rng.IntN(10) > 0 {
			s.Running, s.Waiting = proto.Uint32(uint32(rng.IntN(40))), proto.Uint32(uint32(rng.IntN(12)))
		}
		if rng.IntN(4) > 0 {
			s.KvCacheUsage = proto.Float64(float64(rng.IntN(1001)) / 1000)
		}
		switch rng.IntN(3) {
		case 0:
			q := uint64(rng.IntN(5000))
			s.PrefixCacheQueries, s.PrefixCacheHits = proto.Uint64(q), proto.Uint64(q/3)
		case 1:
			s.PrefixCacheHitRate = proto.Float64(float64(rng.IntN(101)) / 100)
		}
		if rng.IntN(2) == 0 {
			s.Preemptions = proto.Uint64(uint64(rng.IntN(3)))
		}
		if eng == "vllm" && rng.IntN(2) == 0 {
			s.BatchTokens = proto.Float64(float64(rng.IntN(4000)))
		}
		if rng.IntN(8) > 0 { // unset: a replica's first scrape
			restarted := uint32(0)
			if rng.IntN(12) == 0 {
				restarted = 1
			}
			s.Restarts = &restarted
		}
		out = append(out, s)
	}
	return out
}

// bruteEngine computes the expected points of one group and step from the
// samples directly (the definitions of proto EngineStatsPoint).
func bruteEngine(samples []*meterv1.EngineSample, start time.Time) *meterv1.EngineStatsPoint {
	p := &meterv1.EngineStatsPoint{Start: timestamppb.New(start)}
	var wW, wS, rW, rS, kW, kS, hW, hS, bW, bS float64
	var waits []uint32
	replicas := map[string]bool{}
	for _, s := range samples {
		iv := s.GetIntervalS()
		p.Samples++
		p.SampledSeconds += iv
		replicas[s.GetReplica()] = true
		if s.Waiting != nil {
			wW += iv * float64(*s.Waiting)
			wS += iv
			p.WaitingMax = max(p.WaitingMax, float64(*s.Waiting))
			waits = append(waits, *s.Waiting)
		}
		if s.Running != nil {
			rW += iv * float64(*s.Running)
			rS += iv
			p.RunningMax = max(p.RunningMax, float64(*s.Running))
		}
		if s.KvCacheUsage != nil {
			kW += iv * *s.KvCacheUsage
			kS += iv
			p.KvCacheUsageMax = max(p.KvCacheUsageMax, *s.KvCacheUsage)
			if p.KvCacheSamples == 0 || *s.KvCacheUsage < p.KvCacheUsageMin {
				p.KvCacheUsageMin = *s.KvCacheUsage
			}
			p.KvCacheSamples++
		}
		p.Restarts += uint64(s.GetRestarts())
		if s.PrefixCacheQueries != nil {
			p.PrefixCacheQueries += *s.PrefixCacheQueries
			p.PrefixCacheHits += *s.PrefixCacheHits
		}
		if s.PrefixCacheHitRate != nil {
			hW += iv * *s.PrefixCacheHitRate
			hS += iv
		}
		if s.Preemptions != nil {
			p.Preemptions += *s.Preemptions
		}
		if s.BatchTokens != nil {
			bW += iv * *s.BatchTokens
			bS += iv
		}
	}
	p.Replicas = uint64(len(replicas))
	div := func(a, b float64) float64 {
		if b == 0 {
			return 0
		}
		return a / b
	}
	p.WaitingMean, p.RunningMean, p.KvCacheUsageMean = div(wW, wS), div(rW, rS), div(kW, kS)
	if len(waits) > 0 {
		slices.Sort(waits)
		// Nearest rank: the smallest value with at least 95% of the values at or below it.
		rank := (95*len(waits) + 99) / 100
		p.WaitingP95 = float64(waits[rank-1])
	}
	switch {
	case p.PrefixCacheQueries > 0:
		p.PrefixCacheHitRate = proto.Float64(float64(p.PrefixCacheHits) / float64(p.PrefixCacheQueries))
	case hS > 0:
		p.PrefixCacheHitRate = proto.Float64(hW / hS)
	}
	if bS > 0 {
		p.BatchTokensMean = proto.Float64(bW / bS)
	}
	return p
}

// TestEngineStatsExact stores random engine samples (each sent twice, as a
// redelivery would), rolls them up and checks GetEngineStats against brute
// force over the samples, for hour, minute and total steps and several
// groupings; REST answers the same as gRPC; only finance and admin keys
// may read.
func TestEngineStatsExact(t *testing.T) {
	s := newStack(t, false)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(20, 11))
	start := now.Truncate(time.Hour).Add(-3 * time.Hour)
	samples := engineSamples(rng, start, 3, 900)
	var batch chstore.EngineBatch
	for _, m := range samples {
		batch.Append(m, time.Now())
	}
	for range 2 { // the second insert is a redelivery: counted once
		if err := s.store.InsertEngineSamples(ctx, &batch); err != nil {
			t.Fatal(err)
		}
	}
	billingtest.RollUp(t, s.store)

	client := meterv1.NewEngineServiceClient(s.gconn)
	cases := []struct {
		name        string
		req         *meterv1.GetEngineStatsRequest
		step        time.Duration // 0: total
		groupBy     []string
		deployments []string // the deployments kept; none: all
	}{
		{"hour by deployment", &meterv1.GetEngineStatsRequest{Step: "hour", GroupBy: []string{"deployment"}}, time.Hour, []string{"deployment"}, nil},
		{"total by replica", &meterv1.GetEngineStatsRequest{GroupBy: []string{"replica", "engine"}}, 0, []string{"engine", "replica"}, nil},
		{"minute by model", &meterv1.GetEngineStatsRequest{Step: "minute", GroupBy: []string{"model"}}, time.Minute, []string{"model"}, nil},
		{"day", &meterv1.GetEngineStatsRequest{Step: "day"}, 24 * time.Hour, nil, nil},
		// The deployment picker: one deployment's replicas, minute by minute.
		{"minute by replica of qwen", &meterv1.GetEngineStatsRequest{Step: "minute", GroupBy: []string{"replica"}, Deployment: []string{"qwen"}},
			time.Minute, []string{"replica"}, []string{"qwen"}},
		{"hour of qwen", &meterv1.GetEngineStatsRequest{Step: "hour", Deployment: []string{"qwen"}}, time.Hour, nil, []string{"qwen"}},
		{"hour of llama and gone", &meterv1.GetEngineStatsRequest{Step: "hour", Deployment: []string{"llama,gone", "llama"}}, time.Hour, nil, []string{"llama"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			end := start.Add(3 * time.Hour)
			if tc.step == time.Minute {
				end = start.Add(time.Hour)
			}
			tc.req.Start, tc.req.End, tc.req.PageSize = timestamppb.New(start), timestamppb.New(end), 1000
			got, err := client.GetEngineStats(withKey(testKeys["finance"]), tc.req)
			if err != nil {
				t.Fatal(err)
			}
			// Brute force: group the samples of the range, then step them.
			bySeries := map[string][]*meterv1.EngineSample{}
			groups := map[string]map[string]string{}
			var keys []string
			for _, m := range samples {
				at := m.GetSampledAt().AsTime()
				if at.Before(start) || !at.Before(end) || (tc.deployments != nil && !slices.Contains(tc.deployments, m.GetDeployment())) {
					continue
				}
				g := map[string]string{}
				for _, f := range tc.groupBy {
					g[f] = map[string]string{"deployment": m.GetDeployment(), "engine": m.GetEngine(), "model": m.GetModel(), "replica": m.GetReplica()}[f]
				}
				k := fmt.Sprint(g)
				if _, ok := bySeries[k]; !ok {
					keys = append(keys, k)
					groups[k] = g
				}
				bySeries[k] = append(bySeries[k], m)
			}
			slices.Sort(keys)
			want := &meterv1.GetEngineStatsResponse{}
			for _, k := range keys {
				series := &meterv1.EngineStatsSeries{Group: groups[k], Summary: bruteEngine(bySeries[k], start)}
				steps := map[time.Time][]*meterv1.EngineSample{}
				for _, m := range bySeries[k] {
					b := start
					if tc.step > 0 {
						b = m.GetSampledAt().AsTime().Truncate(tc.step)
					}
					steps[b] = append(steps[b], m)
				}
				var times []time.Time
				for b := range steps {
					times = append(times, b)
				}
				slices.SortFunc(times, time.Time.Compare)
				maxReplicas := uint64(0)
				for _, b := range times {
					p := bruteEngine(steps[b], b)
					maxReplicas = max(maxReplicas, p.Replicas)
					series.Points = append(series.Points, p)
				}
				// The summary's replicas is the most of any step.
				series.Summary.Replicas = maxReplicas
				want.Series = append(want.Series, series)
			}
			if len(want.Series) == 0 {
				t.Fatal("no samples in range: the test is wrong")
			}
			opts := []cmp.Option{protocmp.Transform(), cmpopts.EquateApprox(0, 1e-9),
				protocmp.SortRepeated(func(a, b *meterv1.EngineStatsSeries) bool { return fmt.Sprint(a.GetGroup()) < fmt.Sprint(b.GetGroup()) })}
			if d := cmp.Diff(want, got, opts...); d != "" {
				t.Fatalf("engine stats (-brute force +got):\n%s", d)
			}

			v := url.Values{"start": {start.Format(time.RFC3339)}, "end": {end.Format(time.RFC3339)}, "page_size": {"1000"}}
			if tc.req.Step != "" {
				v.Set("step", tc.req.Step)
			}
			for _, g := range tc.req.GroupBy {
				v.Add("group_by", g)
			}
			for _, d := range tc.req.Deployment {
				v.Add("deployment", d)
			}
			code, body := s.rest(t, "GET", "/v1/engine-stats?"+v.Encode(), testKeys["admin"], nil)
			var viaREST meterv1.GetEngineStatsResponse
			if code != 200 || protojson.Unmarshal(body, &viaREST) != nil {
				t.Fatalf("REST: %d %s", code, body)
			}
			if d := cmp.Diff(got, &viaREST, protocmp.Transform()); d != "" {
				t.Errorf("gRPC and REST differ (-grpc +rest):\n%s", d)
			}
		})
	}

	req := &meterv1.GetEngineStatsRequest{Start: timestamppb.New(start), End: timestamppb.New(start.Add(time.Hour))}
	for _, role := range []string{"tenant", "ingest"} {
		if _, err := client.GetEngineStats(withKey(testKeys[role]), req); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s key over gRPC: %v, want PermissionDenied", role, err)
		}
		if code, body := s.rest(t, "GET", "/v1/engine-stats?start="+start.Format(time.RFC3339)+"&end="+start.Add(time.Hour).Format(time.RFC3339), testKeys[role], nil); code != 403 {
			t.Errorf("%s key over REST: %d %s, want 403", role, code, body)
		}
	}
	for _, bad := range []string{"step=minute&start=" + start.Add(30*time.Second).Format(time.RFC3339), "group_by=tenant_id", "step=week"} {
		path := "/v1/engine-stats?end=" + start.Add(time.Hour).Format(time.RFC3339) + "&" + bad
		if !strings.Contains(bad, "start=") {
			path += "&start=" + start.Format(time.RFC3339)
		}
		if code, body := s.rest(t, "GET", path, testKeys["admin"], nil); code != 400 {
			t.Errorf("GET %s: %d %s, want 400", path, code, body)
		}
	}
}
