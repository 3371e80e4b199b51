package main

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestReportSummary checks the ingest summary: each run's CPU per event
// for meterd, ClickHouse and the broker, and both targets with their
// verdicts.
func TestReportSummary(t *testing.T) {
	const n = 1_000_000
	proto := pipeResult{rate: 200_000, meterdCPU: 3 * time.Second, chCPU: 4 * time.Second, benchCPU: time.Second}
	json := pipeResult{rate: 150_000, meterdCPU: 5 * time.Second, chCPU: 4 * time.Second, benchCPU: 2 * time.Second}
	engine := pipeResult{rate: 90_000, chCPU: 12 * time.Second, benchCPU: 2 * time.Second}
	var b strings.Builder
	(&report{w: &b}).summary(n, proto, json, &engine)
	got := b.String()
	for _, want := range []string{
		"meterd, protobuf records                200000      3.0         4.0     1.0     8.0",
		"meterd, JSON records                    150000      5.0         4.0     2.0    11.0",
		"ClickHouse Kafka engine, JSON            90000        -        12.0     2.0    14.0",
		"meterd JSON / Kafka engine        1.67x   (>= 1.5x: met; protobuf / Kafka engine 2.22x)",
		"meterd protobuf                 200000 events/s   (>= 250000: NOT met; 0.80x of it)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %q:\n%s", want, got)
		}
	}

	b.Reset()
	(&report{w: &b}).summary(n, proto, json, nil)
	if got := b.String(); !strings.Contains(got, "not measured (>= 1.5x)") || strings.Contains(got, "Kafka engine, JSON ") {
		t.Errorf("summary without the Kafka engine run:\n%s", got)
	}
}

// TestCPULineCounters: ClickHouse's counters print as n/a when a read of
// system.events failed (not as a wrapped difference), and the INSERT line
// says which statements it counts.
func TestCPULineCounters(t *testing.T) {
	const n = 1_000
	var failed pipeResult
	failed.countersSince(t.Context(), nil, chCounters{}, errors.New("connection refused"))
	ok := pipeResult{counters: chCounters{inserts: 4, insertedRows: 2_000, mergedRows: 500}}
	var b strings.Builder
	r := &report{w: &b}
	r.cpuLine(failed, n)
	r.cpuLine(ok, n)
	got := b.String()
	for _, want := range []string{
		"ClickHouse counters: n/a (connection refused)",
		"ClickHouse: 4 INSERT statements into all tables (events, event_ids, and each prepared batch's empty INSERT), 500 inserted rows per statement on average; merges wrote 0.50 rows per event",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("cpuLine lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "18446744073") {
		t.Errorf("cpuLine printed a wrapped counter:\n%s", got)
	}
}
