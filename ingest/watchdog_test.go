package ingest

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"tokenmeter/internal/testkit/chtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// TestWedgedReaderRejoins: a consumer whose reader holds the partitions
// and delivers nothing while they have records to consume (a live replica
// that consumes nothing) is found by its watchdog: it reports itself
// unready, saying which partitions, re-joins the group with a new reader,
// and consumes every record, each counted once; then it is ready again.
func TestWedgedReaderRejoins(t *testing.T) {
	addr, db := chtest.NewDB(t)
	e := newEnv(t, addr, db)
	events := make([]*meterv1.InferenceEvent, 300)
	for i := range events {
		events[i] = testEvent(i)
	}
	e.produce(t, protoMessages(t, events)...)

	reg := prometheus.NewRegistry()
	c, err := NewConsumer(ConsumerConfig{
		Brokers: []string{e.broker.Addr()}, BatchSize: 50, BatchTimeout: 100 * time.Millisecond,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
		StallTimeout: 2 * time.Second,
	}, e.store, reg, e.logger, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	wedged := c.reader.clientID
	c.wedge = func(clientID string) bool { return clientID == wedged }
	run(t, c)

	var stalled error
	for deadline := time.Now().Add(60 * time.Second); stalled == nil; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the wedged consumer never reported a stall")
		}
		stalled = c.Stalled()
	}
	if !strings.Contains(stalled.Error(), "held by this replica") {
		t.Errorf("stall error %q does not say the partitions are this replica's", stalled)
	}
	t.Logf("readiness while wedged: %v", stalled)

	waitTotals(t, e.store, expect(events), 90*time.Second)
	stable(t, e.store, expect(events))
	for deadline := time.Now().Add(60 * time.Second); c.Stalled() != nil; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("still unready after catching up: %v", c.Stalled())
		}
	}
	if n := testutil.ToFloat64(c.wd.metrics.rejoins); n < 1 {
		t.Errorf("meter_ingest_consumer_rejoins_total = %v, want at least 1", n)
	}
	if n := testutil.ToFloat64(c.wd.metrics.stalls.WithLabelValues(heldBySelf)); n < 1 {
		t.Errorf("meter_ingest_partition_stalls_total{held_by=%q} = %v, want at least 1", heldBySelf, n)
	}
}
