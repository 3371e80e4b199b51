package api_test

import (
	"fmt"
	"math/rand/v2"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/ingest"
	"tokenmeter/ingest/sink"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/testkit/billingtest"
	"tokenmeter/internal/testkit/servingtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// TestUsageServingDimsExact: GetUsage grouped by model_version, engine and
// tensor_parallelism against a brute force over generated events (dA
// changes engine and TP at 01:30, dB serves acme a canary version), gRPC
// equal to REST, and with the same labels as GetCost's lines: per hour,
// deployment, engine and TP, usage's requests are the cost lines'
// (attributed and unattributed).
func TestUsageServingDimsExact(t *testing.T) {
	s := newStack(t, false)
	ctx := t.Context()
	h0 := now.Truncate(time.Hour).Add(-4 * time.Hour)
	rng := rand.New(rand.NewPCG(33, 12))
	tenants := []string{"acme", "globex", "initech"}

	var events chstore.EventBatch
	var all []*meterv1.InferenceEvent
	for i := range 600 {
		h, m := i/200, rng.IntN(60)
		dep := []string{"dA", "dA", "dB", "dC"}[rng.IntN(4)]
		tenant := tenants[rng.IntN(len(tenants))]
		model, version, engine, tp := dimsServing(dep, h, m, tenant)
		e := &meterv1.InferenceEvent{
			EventId: fmt.Sprintf("udims-%d", i), TenantId: tenant, Model: model, ModelVersion: version, Deployment: dep,
			Engine: engine, TensorParallelism: tp,
			CompletedAt:  timestamppb.New(h0.Add(time.Duration(h)*time.Hour + time.Duration(m)*time.Minute + time.Duration(rng.IntN(60))*time.Second)),
			PromptTokens: proto.Int64(int64(rng.IntN(2000))), CachedPromptTokens: proto.Int64(int64(rng.IntN(100))),
			OutputTokens: proto.Int64(int64(rng.IntN(500))), E2EMs: proto.Float64(float64(100 + rng.IntN(5000))),
		}
		if i%13 == 0 {
			e.Status = meterv1.Status_STATUS_OOM
		}
		all = append(all, e)
		events.Append(e, ingest.ITL(e), time.Now(), sink.Source{})
	}
	for _, e := range all[:40] { // a redelivery, counted once
		events.Append(e, ingest.ITL(e), time.Now(), sink.Source{})
	}
	if err := s.store.InsertEvents(ctx, &events); err != nil {
		t.Fatal(err)
	}
	billingtest.RollUp(t, s.store)

	label := servingtest.Label
	type hdm struct {
		h          int64
		dep, model string
	}
	engines, tps := map[hdm][]string{}, map[hdm][]string{}
	for _, e := range all {
		k := hdm{e.GetCompletedAt().AsTime().Unix() / 3600, e.GetDeployment(), e.GetModel()}
		engines[k] = append(engines[k], e.GetEngine())
		tps[k] = append(tps[k], strconv.Itoa(int(e.GetTensorParallelism())))
	}
	groupBy := []string{"deployment", "model_version", "engine", "tensor_parallelism"}
	want := map[string]*meterv1.UsageBucket{}
	var order []string
	for _, e := range all {
		at := e.GetCompletedAt().AsTime()
		k := hdm{at.Unix() / 3600, e.GetDeployment(), e.GetModel()}
		b := &meterv1.UsageBucket{Start: timestamppb.New(at.Truncate(time.Hour)), Deployment: e.GetDeployment(),
			ModelVersion: e.GetModelVersion(), Engine: label(engines[k]), TensorParallelism: label(tps[k])}
		key := fmt.Sprint(b.GetStart().AsTime().Unix(), b.GetDeployment(), b.GetModelVersion(), b.GetEngine(), b.GetTensorParallelism())
		if want[key] == nil {
			want[key] = b
			order = append(order, key)
		}
		b = want[key]
		b.Requests++
		if e.GetStatus() != meterv1.Status_STATUS_UNSPECIFIED {
			b.Errors++
		}
		b.PromptTokens += e.GetPromptTokens()
		b.CachedPromptTokens += e.GetCachedPromptTokens()
		b.OutputTokens += e.GetOutputTokens()
	}
	slices.SortFunc(order, func(a, b string) int {
		x, y := want[a], want[b]
		return x.GetStart().AsTime().Compare(y.GetStart().AsTime())*8 +
			strings.Compare(x.GetDeployment(), y.GetDeployment())*4 + strings.Compare(x.GetModelVersion(), y.GetModelVersion())*2 +
			strings.Compare(x.GetEngine()+"\x00"+x.GetTensorParallelism(), y.GetEngine()+"\x00"+y.GetTensorParallelism())
	})
	wantResp := &meterv1.GetUsageResponse{}
	for _, k := range order {
		wantResp.Buckets = append(wantResp.Buckets, want[k])
	}

	req := &meterv1.GetUsageRequest{Start: timestamppb.New(h0), End: timestamppb.New(h0.Add(3 * time.Hour)), Granularity: "hour", GroupBy: groupBy}
	got, err := meterv1.NewUsageServiceClient(s.gconn).GetUsage(withKey(testKeys["finance"]), req)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(wantResp, got, protocmp.Transform()); diff != "" {
		t.Errorf("gRPC usage (-brute force +got):\n%s", diff)
	}
	q := url.Values{"start": {h0.Format(time.RFC3339)}, "end": {h0.Add(3 * time.Hour).Format(time.RFC3339)},
		"granularity": {"hour"}, "group_by": {strings.Join(groupBy, ",")}}
	code, body := s.rest(t, "GET", "/v1/usage?"+q.Encode(), testKeys["finance"], nil)
	if code != 200 {
		t.Fatalf("REST usage: %d %s", code, body)
	}
	var rest meterv1.GetUsageResponse
	if err := protojson.Unmarshal(body, &rest); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(got, &rest, protocmp.Transform()); diff != "" {
		t.Errorf("REST differs from gRPC (-gRPC +REST):\n%s", diff)
	}

	// The same labels as GetCost's: per hour, deployment, engine and TP,
	// the requests of usage are those of the cost lines.
	costGroup := []string{"deployment", "engine", "tensor_parallelism"}
	cost, err := meterv1.NewCostServiceClient(s.gconn).GetCost(withKey(testKeys["finance"]), &meterv1.GetCostRequest{Start: req.GetStart(),
		End: req.GetEnd(), Step: "hour", GroupBy: costGroup})
	if err != nil {
		t.Fatal(err)
	}
	fromCost, fromUsage := map[string]uint64{}, map[string]uint64{}
	for _, sr := range cost.GetSeries() {
		for _, p := range sr.GetPoints() {
			if n := p.GetRequests() + p.GetUnattributedRequests(); n > 0 {
				fromCost[fmt.Sprint(p.GetStart().AsTime().Unix(), sr.GetGroup()["deployment"], sr.GetGroup()["engine"], sr.GetGroup()["tensor_parallelism"])] += n
			}
		}
	}
	byLabels, err := meterv1.NewUsageServiceClient(s.gconn).GetUsage(withKey(testKeys["finance"]), &meterv1.GetUsageRequest{
		Start: req.GetStart(), End: req.GetEnd(), Granularity: "hour", GroupBy: costGroup})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range byLabels.GetBuckets() {
		fromUsage[fmt.Sprint(b.GetStart().AsTime().Unix(), b.GetDeployment(), b.GetEngine(), b.GetTensorParallelism())] += uint64(b.GetRequests())
	}
	if diff := cmp.Diff(fromCost, fromUsage); diff != "" {
		t.Errorf("requests per hour, deployment, engine and TP (-GetCost +GetUsage):\n%s", diff)
	}
	if fromUsage[fmt.Sprint(h0.Add(time.Hour).Unix(), "dA", "sglang+vllm", "2+4")] == 0 {
		t.Errorf("no usage of dA's 01:00 hour labelled sglang+vllm, TP 2+4: %v", fromUsage)
	}
}
