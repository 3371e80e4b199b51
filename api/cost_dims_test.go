package api_test

import (
	"fmt"
	"math/rand/v2"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/billing"
	"tokenmeter/ingest"
	"tokenmeter/ingest/sink"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/testkit/billingtest"
	"tokenmeter/internal/testkit/servingtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// dimsPrices price an H100 second at 1,000,000 nanos and an A100 second at
// 500,000, so that a deployment-hour's cost is its GPU-milliseconds × 1,000
// (× 500) exactly; the L40S is unpriced.
const dimsPrices = `{"currency":"USD","gpu_prices":[
  {"gpu_type":"H100","effective_from":"2026-01-01T00:00:00Z","per_hour":"3.60"},
  {"gpu_type":"A100","effective_from":"2026-01-01T00:00:00Z","per_hour":"1.80"}],
 "token_prices":[{"model":"m","effective_from":"2026-01-01T00:00:00Z","input_per_1m":"0.60","cached_input_per_1m":"0.30","output_per_1m":"1.80"}]}`

// dimsServing says what served deployment dep's events at minute m of hour
// h (0-2) and for tenant: dA moves from vllm (TP 2) to sglang (TP 4) at
// 01:30, so hour 1 is both; dB serves acme a canary model version; dC and
// dNone report no engine; dNone has no GPUs (its usage is unattributed).
func dimsServing(dep string, h, m int, tenant string) (model, version, engine string, tp uint32) {
	switch dep {
	case "dA":
		if h*60+m < 90 {
			return "m", "v1", "vllm", 2
		}
		return "m", "v1", "sglang", 4
	case "dB":
		if tenant == "acme" {
			return "m2", "v2", "trt-llm", 1
		}
		return "m2", "v1", "trt-llm", 1
	default:
		return "m", "", "", 0
	}
}

// dimsGPUs is the GPU type and count of each deployment with GPUs.
var dimsGPUs = map[string]struct {
	gpuType string
	n       int
}{"dA": {"H100", 2}, "dB": {"A100", 1}, "dC": {"H100", 1}, "dIdle": {"L40S", 1}}

// TestCostGPUTimeAndServingDimsExact: GetCost's allocated GPU time, cost per
// request, and grouping by engine, tensor_parallelism and model_version,
// against a brute force over the generated events and samples, under every
// busy and idle policy, gRPC equal to REST.
func TestCostGPUTimeAndServingDimsExact(t *testing.T) {
	s := newStack(t, false)
	ctx := t.Context()
	if code, body := s.rest(t, "PUT", "/v1/admin/price-book", testKeys["admin"], []byte(dimsPrices)); code != 200 {
		t.Fatalf("PUT price book: %d %s", code, body)
	}
	h0 := now.Truncate(time.Hour).Add(-4 * time.Hour)
	rng := rand.New(rand.NewPCG(33, 4))
	tenants := []string{"acme", "globex", "initech"}

	// Brute-force state: per (hour, deployment) the GPU and busy
	// milliseconds, and the usage and serving labels of its lines.
	type depHour = servingtest.DepHour
	type lineKey = servingtest.Line
	gpuMs, busyMs := map[depHour]int64{}, map[depHour]int64{}
	served := servingtest.NewHours()

	var events chstore.EventBatch
	var all []*meterv1.InferenceEvent
	for i := range 900 {
		h, m := i/300, rng.IntN(60)
		dep := []string{"dA", "dA", "dB", "dC", "dNone"}[rng.IntN(5)]
		tenant := tenants[rng.IntN(len(tenants))]
		model, version, engine, tp := dimsServing(dep, h, m, tenant)
		e := &meterv1.InferenceEvent{
			EventId: fmt.Sprintf("dims-%d", i), TenantId: tenant, Model: model, ModelVersion: version, Deployment: dep,
			Engine: engine, TensorParallelism: tp,
			CompletedAt:  timestamppb.New(h0.Add(time.Duration(h)*time.Hour + time.Duration(m)*time.Minute + time.Duration(rng.IntN(60))*time.Second)),
			PromptTokens: proto.Int64(int64(rng.IntN(2000))), OutputTokens: proto.Int64(int64(rng.IntN(500))),
			TtftMs: proto.Float64(float64(10 + rng.IntN(300))), E2EMs: proto.Float64(float64(100 + rng.IntN(5000))),
		}
		if i%11 == 0 { // a failed request without tokens: traffic without a token basis
			e.Status, e.PromptTokens, e.OutputTokens, e.TtftMs, e.E2EMs = meterv1.Status_STATUS_TIMEOUT, nil, nil, nil, nil
		}
		all = append(all, e)
		events.Append(e, ingest.ITL(e), time.Now(), sink.Source{})
		served.Add(h, e)
	}
	// The first 50 events again: a redelivery, counted once.
	for _, e := range all[:50] {
		events.Append(e, ingest.ITL(e), time.Now(), sink.Source{})
	}
	var gpus chstore.GPUBatch
	for dep, g := range dimsGPUs {
		for gpu := range g.n {
			for k := range 3 * 360 {
				util := float64(rng.IntN(9)) / 8 // exact in binary: the sums are too
				gpus.Append(&meterv1.GpuSample{SampleId: fmt.Sprintf("%s/%d/%d", dep, gpu, k), GpuUuid: fmt.Sprintf("GPU-%s-%d", dep, gpu),
					GpuType: g.gpuType, Deployment: dep, SampledAt: timestamppb.New(h0.Add(time.Duration(k) * 10 * time.Second)),
					IntervalS: 10, Utilization: util}, time.Now())
				dh := depHour{H: k / 360, Dep: dep}
				gpuMs[dh] += 10_000
				busyMs[dh] += int64(util * 10_000)
			}
		}
	}
	if err := s.store.InsertEvents(ctx, &events); err != nil {
		t.Fatal(err)
	}
	if err := s.store.InsertGPUSamples(ctx, &gpus); err != nil {
		t.Fatal(err)
	}
	billingtest.RollUp(t, s.store)

	nanosPerMs := map[string]int64{"H100": 1000, "A100": 500, "L40S": 0}

	// point is what the test compares of a CostPoint.
	type point struct {
		Start                                time.Time
		GPUSeconds                           string
		GPUHours, BusyGPUHours, IdleGPUHours float64
		Cost, Busy                           int64
		Requests, Unattributed               uint64
		CostPerRequest                       string
	}
	type line struct {
		group                  map[string]string
		h                      int
		ms, busyMs, cost, busy int64
		requests, unattributed uint64
	}
	// brute computes every line of every deployment-hour under policy p.
	brute := func(p billing.Policy, groupBy []string) []line {
		var out []line
		for h := range 3 {
			for _, dep := range []string{"dA", "dB", "dC", "dIdle", "dNone"} {
				dh := depHour{H: h, Dep: dep}
				us, keyOf := served.Usages(dh)
				group := func(lk lineKey) map[string]string {
					all := served.Labels(dh, lk)
					g := map[string]string{}
					for _, f := range groupBy {
						g[f] = all[f]
					}
					return g
				}
				if _, ok := dimsGPUs[dep]; !ok {
					for lk, u := range served.Usage[dh] {
						out = append(out, line{group: group(lk), h: h, unattributed: uint64(u.Requests)})
					}
					continue
				}
				ms, bms := gpuMs[dh], busyMs[dh]
				per := nanosPerMs[dimsGPUs[dep].gpuType]
				timeAlloc, err := billing.AllocateHour(billing.GPUCost{GPUSeconds: float64(ms) / 1000,
					Cost: billing.Money(ms), BusyCost: billing.Money(bms), IdleCost: billing.Money(ms - bms)}, us, p)
				if err != nil {
					t.Fatal(err)
				}
				costAlloc, err := billing.AllocateHour(billing.GPUCost{GPUSeconds: float64(ms) / 1000,
					Cost: billing.Money(ms * per), BusyCost: billing.Money(bms * per), IdleCost: billing.Money((ms - bms) * per)}, us, p)
				if err != nil {
					t.Fatal(err)
				}
				for k, l := range timeAlloc.Lines {
					lk := keyOf[l.Tenant]
					out = append(out, line{group: group(lk), h: h, ms: int64(l.Total), busyMs: int64(l.Busy),
						cost: int64(costAlloc.Lines[k].Total), busy: int64(costAlloc.Lines[k].Busy), requests: uint64(l.Usage.Requests)})
				}
			}
		}
		return out
	}
	toPoint := func(start time.Time, ls []line) (point, bool) {
		var ms, bms, cost, busy int64
		var req, unattr uint64
		for _, l := range ls {
			ms, bms, cost, busy, req, unattr = ms+l.ms, bms+l.busyMs, cost+l.cost, busy+l.busy, req+l.requests, unattr+l.unattributed
		}
		p := point{Start: start, GPUSeconds: fmt.Sprintf("%d.%03d", ms/1000, ms%1000),
			GPUHours: float64(ms) / 3.6e6, BusyGPUHours: float64(bms) / 3.6e6, IdleGPUHours: float64(ms-bms) / 3.6e6,
			Cost: cost, Busy: busy, Requests: req, Unattributed: unattr}
		if req > 0 {
			m, _ := billing.CostPer1K(billing.Money(cost), int64(req)*1000)
			p.CostPerRequest = m.StringFixed(9)
		}
		return p, cost != 0 || ms != 0 || req+unattr > 0
	}
	servedPoint := func(p *meterv1.CostPoint) point {
		return point{Start: p.GetStart().AsTime(), GPUSeconds: p.GetGpuSeconds(), GPUHours: p.GetGpuHours(),
			BusyGPUHours: p.GetBusyGpuHours(), IdleGPUHours: p.GetIdleGpuHours(), Cost: p.GetCost().GetNanos(),
			Busy: p.GetBusyCost().GetNanos(), Requests: p.GetRequests(), Unattributed: p.GetUnattributedRequests(),
			CostPerRequest: p.GetCostPerRequest()}
	}

	costC := meterv1.NewCostServiceClient(s.gconn)
	var cases []struct {
		groupBy []string
		step    string
		p       billing.Policy
	}
	add := func(groupBy []string, step string, p billing.Policy) {
		cases = append(cases, struct {
			groupBy []string
			step    string
			p       billing.Policy
		}{groupBy, step, p})
	}
	def := billing.DefaultPolicy()
	for _, g := range [][]string{{"engine"}, {"tensor_parallelism"}, {"model_version"}, {"tenant_id"},
		{"deployment", "engine", "tensor_parallelism"}, {"tenant_id", "model", "model_version"}, nil} {
		add(g, "hour", def)
		add(g, "total", def)
	}
	for _, b := range billing.BusyPolicies() {
		for _, i := range billing.IdlePolicies() {
			p := def
			p.Busy, p.Idle = b, i
			add([]string{"tenant_id", "engine"}, "hour", p)
		}
	}
	for _, tc := range cases {
		name := fmt.Sprintf("%s by %v %s/%s", tc.step, tc.groupBy, tc.p.Busy, tc.p.Idle)
		t.Run(name, func(t *testing.T) {
			req := &meterv1.GetCostRequest{Start: timestamppb.New(h0), End: timestamppb.New(h0.Add(3 * time.Hour)), Step: tc.step,
				GroupBy: tc.groupBy, BusyPolicy: string(tc.p.Busy), IdlePolicy: string(tc.p.Idle), PageSize: 1000}
			got, err := costC.GetCost(withKey(testKeys["finance"]), req)
			if err != nil {
				t.Fatal(err)
			}
			v := url.Values{"start": {h0.Format(time.RFC3339)}, "end": {h0.Add(3 * time.Hour).Format(time.RFC3339)},
				"step": {tc.step}, "busy_policy": {string(tc.p.Busy)}, "idle_policy": {string(tc.p.Idle)}, "page_size": {"1000"}}
			for _, g := range tc.groupBy {
				v.Add("group_by", g)
			}
			code, body := s.rest(t, "GET", "/v1/cost?"+v.Encode(), testKeys["finance"], nil)
			var viaREST meterv1.GetCostResponse
			if code != 200 || protojson.Unmarshal(body, &viaREST) != nil {
				t.Fatalf("REST cost: %d %s", code, body)
			}
			if diff := cmp.Diff(got, &viaREST, protocmp.Transform()); diff != "" {
				t.Errorf("gRPC and REST differ (-grpc +rest):\n%s", diff)
			}

			// The brute force, grouped and stepped.
			bySeries := map[string][]line{}
			groups := map[string]map[string]string{}
			for _, l := range brute(tc.p, tc.groupBy) {
				k := fmt.Sprint(l.group)
				groups[k] = l.group
				bySeries[k] = append(bySeries[k], l)
			}
			type series struct {
				Group   map[string]string
				Points  []point
				Summary point
			}
			var want []series
			for k, ls := range bySeries {
				sr := series{Group: groups[k]}
				sum, some := toPoint(h0, ls)
				if !some {
					continue
				}
				sr.Summary = sum
				if tc.step == "hour" {
					for h := range 3 {
						var in []line
						for _, l := range ls {
							if l.h == h {
								in = append(in, l)
							}
						}
						if p, ok := toPoint(h0.Add(time.Duration(h)*time.Hour), in); ok {
							sr.Points = append(sr.Points, p)
						}
					}
				} else {
					sr.Points = []point{sum}
				}
				want = append(want, sr)
			}
			var gotSeries []series
			for _, sr := range got.GetSeries() {
				g := sr.GetGroup()
				if g == nil {
					g = map[string]string{}
				}
				out := series{Group: g, Summary: servedPoint(sr.GetSummary())}
				for _, p := range sr.GetPoints() {
					out.Points = append(out.Points, servedPoint(p))
				}
				gotSeries = append(gotSeries, out)
			}
			sortSeries := func(ss []series) {
				slices.SortFunc(ss, func(a, b series) int { return strings.Compare(fmt.Sprint(a.Group), fmt.Sprint(b.Group)) })
			}
			sortSeries(want)
			sortSeries(gotSeries)
			// A group-less query has one series with an empty group.
			for i := range want {
				if len(want[i].Group) == 0 {
					want[i].Group = map[string]string{}
				}
			}
			if diff := cmp.Diff(want, gotSeries); diff != "" {
				t.Errorf("GetCost differs from the brute force (-want +got):\n%s", diff)
			}
		})
	}

	// The engine changed within hour 1: that hour's dA lines are
	// "sglang+vllm", its hours before and after one engine each.
	got, err := costC.GetCost(withKey(testKeys["finance"]), &meterv1.GetCostRequest{Start: timestamppb.New(h0),
		End: timestamppb.New(h0.Add(3 * time.Hour)), Step: "hour", GroupBy: []string{"deployment", "engine"}})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, sr := range got.GetSeries() {
		if sr.GetGroup()["deployment"] == "dA" {
			seen[sr.GetGroup()["engine"]] = len(sr.GetPoints())
		}
	}
	if want := map[string]int{"vllm": 1, "sglang+vllm": 1, "sglang": 1}; !cmp.Equal(seen, want) {
		t.Errorf("dA's engines (hours each): %v, want %v", seen, want)
	}

	// A tenant key sees neither GPU time nor cost per request (the
	// provider's, as cost is).
	own, err := costC.GetCost(withKey(testKeys["tenant"]), &meterv1.GetCostRequest{Start: timestamppb.New(h0),
		End: timestamppb.New(h0.Add(3 * time.Hour)), GroupBy: []string{"engine"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, sr := range own.GetSeries() {
		if p := sr.GetSummary(); p.GetGpuSeconds() != "" || p.GetGpuHours() != 0 || p.GetCostPerRequest() != "" {
			t.Errorf("tenant key: %v shows GPU time %q/%v or cost per request %q", sr.GetGroup(), p.GetGpuSeconds(), p.GetGpuHours(), p.GetCostPerRequest())
		}
	}
}
