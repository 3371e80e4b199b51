package chstore_test

import (
	"io"
	"log/slog"
	"syscall"
	"testing"
	"time"

	"tokenmeter/ingest"
	"tokenmeter/ingest/sink"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/testkit/chtest"
	"tokenmeter/internal/workload"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// BenchmarkInsertEvents times what meterd's writer does with one batch of
// 20,000 events (the default --batch-size): append the decoded rows to a
// reused batch, then InsertEvents (inference_events, then event_ids), on
// an uncompressed connection as meterbench's pipeline runs. The events are
// meterbench's (internal/workload). cpu-µs/event is this process's CPU
// (getrusage: user + system), without the server's; compare it before and
// after a change in the same run, alternated, on a loaded machine.
//
//	go test -run '^$' -bench InsertEvents -benchtime 30x ./internal/adapter/chstore
func BenchmarkInsertEvents(b *testing.B) {
	const n = 20_000
	g, err := workload.New(workload.Config{Seed: 42, Start: time.Now().Add(-24 * time.Hour), Duration: 24 * time.Hour, Events: n, Tenants: 100})
	if err != nil {
		b.Fatal(err)
	}
	type keyed struct {
		row              sink.EventRow
		itl              sink.ITL
		key, fingerprint uint64
	}
	rows := make([]keyed, n)
	var scratch []byte
	for i := range rows {
		ev := &meterv1.InferenceEvent{}
		g.Fill(ev, i)
		r := &rows[i]
		r.row.FromProto(ev)
		r.itl = ingest.RowITL(&r.row)
		r.key, r.fingerprint = sink.EventKey(r.row.TenantID, r.row.EventID), r.row.Fingerprint(&scratch)
	}
	addr, db := chtest.NewDB(b)
	s, err := chstore.Open(chstore.Config{Addr: []string{addr}, Database: db, Compression: "none"}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	ctx := b.Context()
	if _, err := s.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	batch := s.NewEventBatch()
	write := func(base int64) {
		batch.Reset()
		now := time.Now()
		for i := range rows {
			r := &rows[i]
			batch.AppendKeyedRow(&r.row, r.itl, now, sink.Source{Offset: base + int64(i)}, r.key, r.fingerprint)
		}
		if err := s.InsertEvents(ctx, batch); err != nil {
			b.Fatal(err)
		}
	}
	write(0) // the first INSERT opens the connection
	b.ReportAllocs()
	cpu0 := processCPU()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		write(int64(i+1) * n)
	}
	b.StopTimer()
	events := float64(b.N * n)
	b.ReportMetric((processCPU()-cpu0).Seconds()*1e6/events, "cpu-µs/event")
	b.ReportMetric(events/b.Elapsed().Seconds(), "events/s")
}

// processCPU is the CPU time this process has used (user + system).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
