package query_test

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/ingest"
	"tokenmeter/ingest/sink"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	"tokenmeter/internal/testkit/billingtest"
	"tokenmeter/internal/testkit/servingtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
)

// usageFigures are the exact figures of a usage row.
type usageFigures struct{ Requests, Errors, Prompt, Cached, Output int64 }

// TestUsageServingDimsExact: GetUsage grouped by engine,
// tensor_parallelism and model_version against a brute force over
// generated events (duplicates, failures, a deployment whose engine and TP
// change at 01:30, a canary model version, unlabelled events), every read
// path: raw events, the hour rollups joined with serving_hour, rollups
// with some hours left out plus those hours' raw events (the fresh path),
// and Service.Usage; one tenant's labels are its hour's, deployment's and
// model's over every tenant, as the cost lines' (TestCostServingDimsExact).
// A late event that brings a new engine into a rolled-up hour changes that
// hour's label at once on the fresh path, and the same after the next
// rollup. It runs in cluster mode too (make test-cluster).
func TestUsageServingDimsExact(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	ctx := t.Context()
	h0 := day.Add(5 * time.Hour)
	rng := rand.New(rand.NewPCG(33, 9))

	type event struct {
		tenant, model, version, dep, engine string
		tp                                  uint32
		at                                  time.Time
		failed                              bool
		prompt, cached, output              int64
	}
	var all []event // distinct events (duplicates are inserted, not listed)
	insert := func(evs []event, dupEvery int) {
		t.Helper()
		var b chstore.EventBatch
		for i, ev := range evs {
			status := meterv1.Status_STATUS_OK
			if ev.failed {
				status = meterv1.Status_STATUS_TIMEOUT
			}
			e := &meterv1.InferenceEvent{EventId: fmt.Sprintf("e%d", len(all)+i), TenantId: ev.tenant, Model: ev.model,
				ModelVersion: ev.version, Deployment: ev.dep, Engine: ev.engine, TensorParallelism: ev.tp,
				CompletedAt: timestamppb.New(ev.at), Status: status,
				PromptTokens: proto.Int64(ev.prompt), CachedPromptTokens: proto.Int64(ev.cached), OutputTokens: proto.Int64(ev.output),
				E2EMs: proto.Float64(float64(100 + rng.IntN(5000))),
			}
			b.Append(e, ingest.ITL(e), time.Now(), sink.Source{Offset: int64(i)})
			if dupEvery > 0 && i%dupEvery == 0 {
				b.Append(e, ingest.ITL(e), time.Now(), sink.Source{Partition: 1, Offset: int64(i)})
			}
		}
		if err := s.InsertEvents(ctx, &b); err != nil {
			t.Fatal(err)
		}
		all = append(all, evs...)
	}
	var evs []event
	for range 1500 {
		h, m, sec := rng.IntN(3), rng.IntN(60), rng.IntN(60)
		ev := event{tenant: []string{"acme", "globex", "initech"}[rng.IntN(3)], model: "m", version: "v1",
			dep:    []string{"dA", "dA", "dB", "dNone"}[rng.IntN(4)],
			at:     h0.Add(time.Duration(h)*time.Hour + time.Duration(m)*time.Minute + time.Duration(sec)*time.Second + time.Duration(rng.IntN(1000))*time.Millisecond),
			failed: rng.IntN(7) == 0, prompt: int64(rng.IntN(4000)), output: int64(rng.IntN(900))}
		ev.cached = ev.prompt / int64(1+rng.IntN(4))
		switch {
		case ev.dep == "dA" && h*60+m < 90: // vllm TP 2 until 01:30, then sglang TP 4
			ev.engine, ev.tp = "vllm", 2
		case ev.dep == "dA":
			ev.engine, ev.tp = "sglang", 4
		case ev.dep == "dB":
			ev.model, ev.engine, ev.tp = "m2", "trt-llm", 1
			if ev.tenant == "acme" { // a canary
				ev.version = "v2"
			}
		}
		if ev.dep == "dA" && rng.IntN(10) == 0 { // unreported: yields to the reported ones
			ev.engine, ev.tp = "", 0
		}
		evs = append(evs, ev)
	}
	insert(evs, 9)

	// The brute force: each event's labels are the distinct non-empty
	// values its hour's, deployment's and model's events carried (every
	// tenant's), sorted (TP numerically) and joined by "+".
	label := servingtest.Label
	want := func(q query.UsageQuery) map[string]usageFigures {
		type hdm struct {
			h          int64
			dep, model string
		}
		engines, tps := map[hdm][]string{}, map[hdm][]string{}
		for _, e := range all {
			k := hdm{e.at.Unix() / 3600, e.dep, e.model}
			engines[k], tps[k] = append(engines[k], e.engine), append(tps[k], strconv.Itoa(int(e.tp)))
		}
		out := map[string]usageFigures{}
		for _, e := range all {
			if e.at.Before(q.Start) || !e.at.Before(q.End) || (q.TenantID != "" && e.tenant != q.TenantID) {
				continue
			}
			k := hdm{e.at.Unix() / 3600, e.dep, e.model}
			vals := map[string]string{"tenant_id": e.tenant, "model": e.model, "deployment": e.dep, "model_version": e.version,
				"engine": label(engines[k]), "tensor_parallelism": label(tps[k])}
			key := q.Start.UTC().Format(time.RFC3339)
			if q.Granularity == "hour" {
				key = e.at.UTC().Truncate(time.Hour).Format(time.RFC3339)
			}
			for _, f := range q.GroupBy {
				key += " " + f + "=" + vals[f]
			}
			f := out[key]
			f.Requests++
			if e.failed {
				f.Errors++
			}
			f.Prompt, f.Cached, f.Output = f.Prompt+e.prompt, f.Cached+e.cached, f.Output+e.output
			out[key] = f
		}
		return out
	}
	got := func(q query.UsageQuery, rows []query.UsageRow, into map[string]usageFigures) map[string]usageFigures {
		if into == nil {
			into = map[string]usageFigures{}
		}
		for _, r := range rows {
			vals := map[string]string{"tenant_id": r.TenantID, "model": r.Model, "deployment": r.Deployment,
				"model_version": r.ModelVersion, "engine": r.Engine, "tensor_parallelism": r.TensorParallelism}
			key := r.Start.UTC().Format(time.RFC3339)
			for _, f := range q.GroupBy {
				key += " " + f + "=" + vals[f]
			}
			f := into[key]
			f.Requests, f.Errors = f.Requests+r.Requests, f.Errors+r.Errors
			f.Prompt, f.Cached, f.Output = f.Prompt+r.PromptTokens, f.Cached+r.CachedPromptTokens, f.Output+r.OutputTokens
			into[key] = f
		}
		return into
	}
	groupings := [][]string{{"engine"}, {"tensor_parallelism"}, {"model_version"}, {"engine", "tensor_parallelism"},
		{"tenant_id", "deployment", "model_version", "engine"}, {"model", "tensor_parallelism"}}
	queries := func() []query.UsageQuery {
		var qs []query.UsageQuery
		for _, g := range groupings {
			for _, gran := range []string{"hour", "total"} {
				for _, tenant := range []string{"", "acme"} {
					qs = append(qs, query.UsageQuery{TenantID: tenant, Start: h0, End: h0.Add(3 * time.Hour), Granularity: gran, GroupBy: g})
				}
			}
		}
		// A range inside hours (raw events only): the labels are still
		// the whole hours'.
		qs = append(qs, query.UsageQuery{Start: h0.Add(30*time.Minute + 1500*time.Millisecond), End: h0.Add(100 * time.Minute), Granularity: "total",
			GroupBy: []string{"deployment", "engine", "tensor_parallelism"}})
		return qs
	}
	check := func(phase string, q query.UsageQuery, rows []query.UsageRow, err error, into map[string]usageFigures) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %+v: %v", phase, q, err)
		}
		if diff := cmp.Diff(want(q), got(q, rows, into)); diff != "" {
			t.Errorf("%s: %s by %v tenant %q (-brute force +got):\n%s", phase, q.Granularity, q.GroupBy, q.TenantID, diff)
		}
	}
	run := func(phase string, rolled bool) {
		t.Helper()
		for _, q := range queries() {
			rows, err := reads(s).Usage(ctx, q)
			check(phase+": Service.Usage", q, rows, err, nil)
			nq, err := q.Normalize()
			if err != nil {
				t.Fatal(err)
			}
			rows, err = s.UsageRows(ctx, query.UsageRead{Query: nq, Raw: true})
			check(phase+": raw events", nq, rows, err, nil)
			if !rolled || nq.Start.Truncate(time.Hour) != nq.Start {
				continue
			}
			rows, err = s.UsageRows(ctx, query.UsageRead{Query: nq, Level: query.LevelHour})
			check(phase+": rollups", nq, rows, err, nil)
			// The fresh path: hour 1 from raw events, the others rolled up.
			fresh := []time.Time{h0.Add(time.Hour)}
			rolledRows, err := s.UsageRows(ctx, query.UsageRead{Query: nq, Level: query.LevelHour, Hours: fresh})
			if err != nil {
				t.Fatal(err)
			}
			rawRows, err := s.UsageRows(ctx, query.UsageRead{Query: nq, Raw: true, Hours: fresh})
			check(phase+": rollups + raw hour", nq, rawRows, err, got(nq, rolledRows, nil))
		}
	}

	run("before the rollup", false)
	billingtest.RollUp(t, s)
	run("rolled up", true)

	// Late events: dB's 01:00 hour gains a vLLM TP 2 replica, dA's 02:00
	// hour a model of its own; on the fresh path before the next rollup,
	// then from the rollups.
	late := []event{
		{tenant: "globex", model: "m2", version: "v1", dep: "dB", engine: "vllm", tp: 2, at: h0.Add(75 * time.Minute), prompt: 10, cached: 3, output: 7},
		{tenant: "initech", model: "m3", version: "v3", dep: "dA", engine: "sglang", tp: 8, at: h0.Add(130 * time.Minute), prompt: 11, output: 5, failed: true},
	}
	insert(late, 1)
	for _, q := range queries() {
		rows, err := reads(s).Usage(ctx, q)
		check("late events, fresh path: Service.Usage", q, rows, err, nil)
	}
	billingtest.RollUp(t, s)
	run("late events rolled up", true)
}
