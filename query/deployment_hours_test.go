package query_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
	"tokenmeter/rollup"
)

// levelRecorder is the store, recording the levels rollup reads use.
type levelRecorder struct {
	*chstore.Store
	levels []query.Level
}

func (r *levelRecorder) RollupRows(ctx context.Context, read query.RollupRead, row func(*query.RollupRow) error) error {
	r.levels = append(r.levels, read.Level)
	return r.Store.RollupRows(ctx, read, row)
}

// olderCode writes an hour's rollups as code from before the deployment
// level did: every table but rollup_deployment_hour.
type olderCode struct{ *chstore.Store }

func (o olderCode) InsertRollupRecords(ctx context.Context, table string, rows []rollup.RollupRecord, slo uint32, version uint64) error {
	if table == "rollup_deployment_hour" {
		return nil
	}
	return o.Store.InsertRollupRecords(ctx, table, rows, slo, version)
}

// TestDeploymentHours: the counters per hour, model and deployment read
// from the deployment level equal those of the hour rows, and an hour whose
// newest computation has no deployment rows (older code) is read from the
// hour rows, with its new events.
func TestDeploymentHours(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	ctx := context.Background()
	end, spec := rollUpSpreadEvents(t, s, 3000)
	for h := day; h.Before(day.Add(2 * time.Hour)); h = h.Add(time.Hour) {
		if err := rollupHour(t, s, h, spec, uint64(h.Unix())+1); err != nil {
			t.Fatal(err)
		}
	}
	fromHours := func() []query.RollupRow {
		t.Helper()
		rows, err := reads(s).Rollups(ctx, query.RollupQuery{Start: day, End: end, Step: "hour",
			GroupBy: []string{"model", "deployment"}, Columns: query.CounterColumns})
		if err != nil {
			t.Fatal(err)
		}
		return rows
	}
	opts := cmpopts.EquateEmpty()
	rec := &levelRecorder{Store: s}
	got, err := query.New(rec, query.Config{}).DeploymentHours(ctx, day, end)
	if err != nil {
		t.Fatal(err)
	}
	want := fromHours()
	if len(want) < 8 {
		t.Fatalf("%d hour rows", len(want))
	}
	if diff := cmp.Diff(want, got, opts); diff != "" {
		t.Errorf("deployment level differs from the hour rows (-want +got):\n%s", diff)
	}
	if !slices.Equal(rec.levels, []query.Level{query.LevelDeploymentHour}) {
		t.Errorf("levels read %v, want only the deployment level", rec.levels)
	}

	// The rows of hour 0 written twice at the same version (two replicas
	// ran the backfill at once) count once.
	var dup []rollup.RollupRecord
	for _, r := range want {
		if r.Start.Equal(day) {
			rec := rollup.RollupRecord{Bucket: r.Start, Dims: [6]string{1: r.Group["model"], 3: r.Group["deployment"]},
				Requests: r.Requests, Errors: r.Errors, Prompt: r.PromptTokens, Cached: r.CachedTokens, Output: r.OutputTokens,
				Good: r.GoodRequests, GoodOutput: r.GoodOutputTokens}
			for c, class := range rollup.StatusClasses {
				rec.ErrorsBy[c] = r.ErrorsBy[class]
			}
			dup = append(dup, rec)
		}
	}
	vers, err := s.LevelVersions(ctx, query.LevelDeploymentHour, day, day.Add(time.Hour))
	if err != nil || len(dup) == 0 {
		t.Fatal(err, len(dup))
	}
	if err := s.InsertRollupRecords(ctx, "rollup_deployment_hour", dup, spec.Version, vers[day]); err != nil {
		t.Fatal(err)
	}
	got, err = reads(s).DeploymentHours(ctx, day, end)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got, opts); diff != "" {
		t.Errorf("rows written twice at one version (-want +got):\n%s", diff)
	}

	// Hour 1 gets new events and is recomputed by older code.
	stale := day.Add(time.Hour)
	var more []*meterv1.InferenceEvent
	for i := range 50 {
		e := event(100_000 + i)
		e.CompletedAt = timestamppb.New(stale.Add(time.Duration(i) * time.Second))
		more = append(more, e)
	}
	chstoretest.Insert(t, s, more)
	if _, err := rollup.RollupHour(ctx, olderCode{s}, stale, spec, uint64(stale.Unix())+2); err != nil {
		t.Fatal(err)
	}
	rec.levels = nil
	got, err = query.New(rec, query.Config{}).DeploymentHours(ctx, day, end)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(fromHours(), got, opts); diff != "" {
		t.Errorf("with a stale hour: differs from the hour rows (-want +got):\n%s", diff)
	}
	if !slices.Equal(rec.levels, []query.Level{query.LevelDeploymentHour, query.LevelHour}) {
		t.Errorf("levels read %v, want the deployment level, then the hour rows of the stale hour", rec.levels)
	}
	if _, err := reads(s).DeploymentHours(ctx, day, day.Add(90*time.Minute)); err == nil {
		t.Error("a range not on whole hours: no error")
	}
}
