package chstore_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/ingest"
	"tokenmeter/ingest/sink"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/testkit/chtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/rollup"
)

// TestDeploymentLevelBackfill: migration 0011 fills rollup_deployment_hour
// for hours rolled up before it existed with exactly the rows the rollup
// job writes (from each hour's newest computation), and running it again
// adds nothing.
func TestDeploymentLevelBackfill(t *testing.T) {
	ctx := context.Background()
	addr, db := chtest.NewDB(t)
	s, err := chstore.Open(chstore.Config{Addr: []string{addr}, Database: db}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{addr}, Auth: clickhouse.Auth{Database: db}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	hour := time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)
	var b chstore.EventBatch
	for i := range 3000 {
		e := &meterv1.InferenceEvent{
			EventId: fmt.Sprint("e", i), TenantId: fmt.Sprint("t", i%5), Model: fmt.Sprint("m", i%2),
			Deployment: fmt.Sprint("d", i%3), GpuType: fmt.Sprint("g", i%2), SloClass: []string{"", "batch"}[i%2],
			CompletedAt:  timestamppb.New(hour.Add(time.Duration(i) * 3 * time.Second)),
			PromptTokens: proto.Int64(int64(i % 700)), OutputTokens: proto.Int64(int64(i%90 + 2)),
			TtftMs: proto.Float64(float64(20 + i*7919%3000)), E2EMs: proto.Float64(float64(4000 + i*104729%9000)),
		}
		if i%13 == 0 {
			e.Status = meterv1.Status_STATUS_TIMEOUT
		}
		b.Append(e, ingest.ITL(e), time.Now(), sink.Source{})
	}
	if err := s.InsertEvents(ctx, &b); err != nil {
		t.Fatal(err)
	}
	spec := rollup.GoodputSpec{Version: 3, DefaultClass: "interactive", Rules: []rollup.GoodputRule{{TTFTMs: 1500}}}
	for h := range 3 {
		at := hour.Add(time.Duration(h) * time.Hour)
		if _, err := rollup.RollupHour(ctx, s, at, spec, uint64(at.Unix())); err != nil {
			t.Fatal(err)
		}
	}
	// The first hour again, newer: the backfill must take this computation.
	if _, err := rollup.RollupHour(ctx, s, hour, spec, uint64(hour.Unix())+7); err != nil {
		t.Fatal(err)
	}

	// Every column as text (sums of floats rounded: ClickHouse adds in
	// another order), newest computation of each hour only; but the
	// hour-only histograms of migration 0023, which came after this
	// backfill and which rollup_hour's group rows do not all keep: hours
	// rolled up before 0023 have none (architecture "Latency breakdown and
	// token sizes").
	later := map[string]bool{}
	for _, d := range rollup.HourDists {
		later[d+"_keys"], later[d+"_counts"] = true, true
	}
	var exprs []string
	rows, err := conn.Query(ctx, "SELECT name, type FROM system.columns WHERE database = ? AND table = 'rollup_deployment_hour' ORDER BY name", db)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			t.Fatal(err)
		}
		if later[name] {
			continue
		}
		e := "toString(" + name + ")"
		if typ == "Float64" {
			e = "toString(round(" + name + ", 6))"
		}
		exprs = append(exprs, "'"+name+"=', "+e)
	}
	rows.Close()
	dump := func() []string {
		t.Helper()
		rows, err := conn.Query(ctx, "SELECT concat("+strings.Join(exprs, ", ' ', ")+") AS r FROM rollup_deployment_hour"+
			" WHERE (bucket, version) IN (SELECT bucket, max(version) FROM rollup_deployment_hour GROUP BY bucket) ORDER BY r")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var r string
			if err := rows.Scan(&r); err != nil {
				t.Fatal(err)
			}
			out = append(out, r)
		}
		return out
	}
	count := func() (n uint64) {
		t.Helper()
		if err := conn.QueryRow(ctx, "SELECT count() FROM rollup_deployment_hour").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	written := dump()
	if len(written) != 3*6 {
		t.Fatalf("%d deployment rows of the newest computations, want 18 (3 hours × 2 models × 3 deployments)", len(written))
	}
	var backfill string
	migs, _ := chstore.Migrations()
	for _, m := range migs {
		for _, st := range m.Statements {
			if m.Version == 11 && strings.HasPrefix(strings.TrimSpace(st), "INSERT") {
				backfill = st
			}
		}
	}
	if backfill == "" {
		t.Fatal("no INSERT in migration 11")
	}
	if err := conn.Exec(ctx, "TRUNCATE TABLE rollup_deployment_hour"); err != nil {
		t.Fatal(err)
	}
	if err := conn.Exec(ctx, backfill); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(written, dump()); diff != "" {
		t.Errorf("backfilled rows differ from the job's (-job +backfill):\n%s", diff)
	}
	n := count()
	if err := conn.Exec(ctx, backfill); err != nil {
		t.Fatal(err)
	}
	if again := count(); again != n || n != 18 {
		t.Errorf("%d rows after the backfill, %d after running it again; want 18 both times", n, again)
	}

	// A backfill that stopped half-way (an INSERT ... SELECT is written in
	// blocks, and an hour's rows may lie in several): every hour holds some
	// of its rows at its newest version, not all. Running it again must add
	// the missing rows, and only those.
	for _, st := range []string{
		"CREATE TABLE half AS rollup_deployment_hour",
		"INSERT INTO half SELECT * FROM rollup_deployment_hour WHERE deployment != 'd1'",
		"TRUNCATE TABLE rollup_deployment_hour",
		"INSERT INTO rollup_deployment_hour SELECT * FROM half",
		"DROP TABLE half",
	} {
		if err := conn.Exec(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	if err := conn.Exec(ctx, backfill); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(written, dump()); diff != "" {
		t.Errorf("after a backfill that stopped half-way and ran again, rows differ from the job's (-job +backfill):\n%s", diff)
	}
	if n := count(); n != 18 {
		t.Errorf("%d rows after a backfill that stopped half-way and ran again, want 18", n)
	}
}
