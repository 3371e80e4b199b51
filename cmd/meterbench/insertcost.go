package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"tokenmeter/ingest"
	"tokenmeter/ingest/sink"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/logsetup"
	"tokenmeter/internal/workload"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// insertVariant is a change to the migrated schema whose cost on insert
// `meterbench insertcost` measures against the schema as migrated.
type insertVariant struct {
	name string
	// sql runs after the migrations, in the variant's database.
	sql []string
	// noLookup skips the event id lookup meterd makes before each batch.
	noLookup bool
	// batch overrides --batch-size.
	batch int
}

// insertVariants are the measured changes: each takes away one thing that
// ClickHouse does for every inserted event, so that its cost is the
// difference from "migrated".
func insertVariants(batch int) []insertVariant {
	return []insertVariant{
		{name: "migrated"},
		{name: "without dirty_hours_mv", sql: []string{"DROP TABLE dirty_hours_mv"}},
		{name: "without MATERIALIZED group_hash, ttft_estimated", sql: []string{
			"ALTER TABLE inference_events DROP COLUMN group_hash",
			"ALTER TABLE inference_events DROP COLUMN ttft_estimated"}},
		{name: "without the event id lookup", noLookup: true},
		{name: "event_ids ENGINE = Null (no index rows, no lookup reads)", sql: []string{
			"DROP TABLE event_ids",
			"CREATE TABLE event_ids (key_hash UInt64, tenant_id String, event_id String, completed_at_ms Int64, fingerprint UInt64, ingested_at DateTime, source_partition Int32, source_offset Int64) ENGINE = Null"}},
		{name: "inference_events ENGINE = Null (views still run)", sql: []string{
			"RENAME TABLE inference_events TO inference_events_mt",
			"CREATE TABLE inference_events AS inference_events_mt ENGINE = Null",
			"DROP TABLE dirty_hours_mv",
			"CREATE MATERIALIZED VIEW dirty_hours_mv TO dirty_hours AS SELECT DISTINCT toDateTime(intDiv(toUInt32(completed_at), 3600) * 3600) AS hour, now() AS ingested_at FROM inference_events"}},
		{name: fmt.Sprintf("migrated, batch %d", batch/4), batch: batch / 4},
		{name: fmt.Sprintf("migrated, batch %d", batch*5/2), batch: batch * 5 / 2},
		{name: fmt.Sprintf("migrated, batch %d", batch*5), batch: batch * 5},
	}
}

// runInsertCost is `meterbench insertcost`: the CPU ClickHouse spends per
// event on meterd's inserts (the event id lookup, the INSERT into
// inference_events with its views, the INSERT into event_ids) and on the
// merges that follow them, for the schema as migrated and for variants
// that each leave one thing out. Variants alternate within each round, so
// that the machine's drift falls on all of them alike.
func runInsertCost(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("meterbench insertcost", flag.ContinueOnError)
	fs.SetOutput(stderr)
	events := fs.Int("events", 500_000, "events inserted per variant")
	batch := fs.Int("batch-size", 20_000, "rows per INSERT (meterd --batch-size)")
	rounds := fs.Int("rounds", 3, "rounds over the variants")
	match := fs.String("match", "", "only the variants whose name contains this")
	settle := fs.Duration("settle", 60*time.Second, "longest wait for the merges after a variant's inserts")
	if err := fs.Parse(args); err != nil {
		return err
	}
	logger := logsetup.Warnings(stderr)
	bch, err := startClickHouse(ctx, logger, "", "bench_ic", clickhouse.Options{})
	if err != nil {
		return err
	}
	defer bch.close()
	g, err := workload.New(workload.Config{Seed: 42, Start: time.Now().Add(-24 * time.Hour), Duration: 24 * time.Hour, Events: *events, Tenants: 100})
	if err != nil {
		return err
	}
	evs := make([]*meterv1.InferenceEvent, *events)
	for i := range evs {
		evs[i] = &meterv1.InferenceEvent{}
		g.Fill(evs[i], i)
	}
	var variants []insertVariant
	for _, v := range insertVariants(*batch) {
		if strings.Contains(v.name, *match) {
			if v.batch == 0 {
				v.batch = *batch
			}
			variants = append(variants, v)
		}
	}
	type figures struct{ insert, merge []float64 } // µs per event, per round
	res := make([]figures, len(variants))
	fmt.Fprintf(stdout, "ClickHouse CPU per event on insert, %d events per variant (100 tenants, 24 h), %d rounds alternated\n", *events, *rounds)
	for round := range *rounds {
		for i, v := range variants {
			db := "ic_" + strconv.Itoa(round) + "_" + strconv.Itoa(i)
			ins, mrg, err := insertCost(ctx, bch, db, v, evs, *settle)
			if err != nil {
				return fmt.Errorf("%s: %w", v.name, err)
			}
			per := func(d time.Duration) float64 { return d.Seconds() * 1e6 / float64(len(evs)) }
			res[i].insert = append(res[i].insert, per(ins))
			res[i].merge = append(res[i].merge, per(mrg))
			fmt.Fprintf(stderr, "meterbench: round %d %-60s inserts %.2f µs, merges %.2f µs per event\n", round+1, v.name, per(ins), per(mrg))
		}
	}
	median := func(xs []float64) float64 {
		s := slices.Clone(xs)
		slices.Sort(s)
		return s[len(s)/2]
	}
	base := median(res[0].insert) + median(res[0].merge)
	fmt.Fprintf(stdout, "%-62s %9s %9s %9s %8s\n", "variant (median of rounds)", "inserts", "merges", "total", "/ first")
	for i, v := range variants {
		ins, mrg := median(res[i].insert), median(res[i].merge)
		fmt.Fprintf(stdout, "%-62s %6.2f µs %6.2f µs %6.2f µs %7.2fx\n", v.name, ins, mrg, ins+mrg, (ins+mrg)/base)
	}
	return nil
}

// insertCost migrates db, applies the variant, inserts evs as meterd does
// (per batch: the event id lookup, then InsertEvents) and returns
// ClickHouse's CPU time over the inserts and over the merges that follow,
// until none runs (at most settle). The database is dropped afterwards.
func insertCost(ctx context.Context, bch *benchClickHouse, db string, v insertVariant, evs []*meterv1.InferenceEvent, settle time.Duration) (inserts, merges time.Duration, err error) {
	store, err := chstore.Open(chstore.Config{Addr: []string{bch.addr}, Database: db, Compression: "none"}, logsetup.Warnings(io.Discard))
	if err != nil {
		return 0, 0, err
	}
	defer store.Close()
	if _, err := store.Migrate(ctx); err != nil {
		return 0, 0, err
	}
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{bch.addr}, Auth: clickhouse.Auth{Database: db}})
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	defer conn.Exec(context.WithoutCancel(ctx), "DROP DATABASE IF EXISTS "+db)
	for _, q := range v.sql {
		if err := conn.Exec(ctx, q); err != nil {
			return 0, 0, fmt.Errorf("%s: %w", q, err)
		}
	}
	var batches []*chstore.EventBatch
	now := time.Now()
	for i := 0; i < len(evs); i += v.batch {
		b := &chstore.EventBatch{}
		for j, ev := range evs[i:min(i+v.batch, len(evs))] {
			b.Append(ev, ingest.ITL(ev), now, sink.Source{Partition: 0, Offset: int64(i + j)})
		}
		batches = append(batches, b)
	}
	if err := waitMerges(ctx, conn, "", settle); err != nil {
		return 0, 0, err
	}
	m := newCPUMeter(bch.pid)
	var lookups time.Duration
	for _, b := range batches {
		if !v.noLookup {
			m0 := newCPUMeter(bch.pid)
			if _, err := store.StoredEvents(ctx, b.KeyHashes()); err != nil {
				return 0, 0, err
			}
			lookups += m0.lap().cpu[1]
		}
		if err := store.InsertEvents(ctx, b); err != nil {
			return 0, 0, err
		}
	}
	inserts = m.lap().cpu[1]
	if lookups > 0 {
		fmt.Fprintf(os.Stderr, "meterbench: %s: ClickHouse CPU during the event id lookups %.2f µs per event\n", v.name, lookups.Seconds()*1e6/float64(len(evs)))
	}
	if err := waitMerges(ctx, conn, db, settle); err != nil {
		return 0, 0, err
	}
	return inserts, m.lap().cpu[1], nil
}

// waitMerges waits until no merge of db (of any database with db "") has
// run for two polls in a row, or settle has passed.
func waitMerges(ctx context.Context, conn clickhouse.Conn, db string, settle time.Duration) error {
	q := "SELECT count() FROM system.merges"
	if db != "" {
		q += " WHERE database = '" + db + "'"
	}
	quiet := 0
	for deadline := time.Now().Add(settle); time.Now().Before(deadline) && quiet < 3; {
		time.Sleep(200 * time.Millisecond)
		var n uint64
		if err := conn.QueryRow(ctx, q).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			quiet++
		} else {
			quiet = 0
		}
	}
	return nil
}
