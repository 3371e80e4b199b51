package chstore_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"tokenmeter/billing"
	"tokenmeter/internal/adapter/chstore/chstoretest"
)

// TestStatementDeliveries checks the delivery state of billing/notify on
// the ClickHouse the tests run: a sink's start is recorded once, the
// statements it has not delivered are listed from a close time on, oldest
// first and bounded, by pages after a cursor, each period's statement in force only (a second row
// of a racing close is neither listed nor delivered by a delivery of its
// hash), a delivery counts for its sink alone, and a reissue is a
// statement to deliver of its own.
func TestStatementDeliveries(t *testing.T) {
	ctx := t.Context()
	s := chstoretest.OpenMigrated(t)
	start, err := s.DeliveryStart(ctx, "kafka:t")
	if err != nil {
		t.Fatal(err)
	}
	again, err := s.DeliveryStart(ctx, "kafka:t")
	if err != nil || !again.Equal(start) {
		t.Fatalf("second start %v (%v), want the first, %v", again, err, start)
	}
	base := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	save := func(tenant string, closedAt time.Time) billing.StoredStatement {
		t.Helper()
		p, err := billing.ParsePeriod("2026-11", time.UTC)
		if err != nil {
			t.Fatal(err)
		}
		st := billing.Statement{Tenant: tenant, Period: p.Key, Zone: "UTC", PeriodStart: p.Start, PeriodEnd: p.End, Currency: "USD"}
		st.Hash, _ = st.ContentHash()
		stored, err := s.SaveStatement(ctx, st, closedAt)
		if err != nil {
			t.Fatal(err)
		}
		return stored
	}
	save("before", base.Add(-time.Hour))
	c := save("c", base.Add(2*time.Second))
	a := save("a", base.Add(time.Second))
	b := save("b", base.Add(time.Second))
	// A racing close's second row of a's period: never the one in force.
	if err := s.Exec(ctx, fmt.Sprintf(`INSERT INTO statements (tenant_id, period, zone, period_start, period_end, hash, content, closed_at)
SELECT 'a', '2026-11', 'UTC', toDateTime(%d), toDateTime(%d), 'other', '{}', toDateTime(%d)`,
		time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).Unix(), time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).Unix(),
		base.Add(5*time.Second).Unix())); err != nil {
		t.Fatal(err)
	}
	list := func(sink string, limit int) []string {
		t.Helper()
		sts, err := s.UndeliveredStatements(ctx, sink, base, nil, limit)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, st := range sts {
			out = append(out, st.Tenant+"/"+st.Hash[:6])
			if st.Tenant == "a" && (string(st.Content) != string(a.Content) || !st.ClosedAt.Equal(a.ClosedAt)) {
				t.Errorf("a's statement listed as %s closed %v, want the stored one", st.Content, st.ClosedAt)
			}
		}
		return out
	}
	want := func(got []string, sts ...billing.StoredStatement) {
		t.Helper()
		var w []string
		for _, st := range sts {
			w = append(w, st.Tenant+"/"+st.Hash[:6])
		}
		if fmt.Sprint(got) != fmt.Sprint(w) {
			t.Errorf("undelivered %v, want %v", got, w)
		}
	}
	want(list("kafka:t", 10), a, b, c)
	want(list("kafka:t", 2), a, b)
	// Pages: after a statement, those that follow it in close order (a
	// and b closed in the same second: by tenant).
	page := func(after billing.StoredStatement, limit int) []string {
		t.Helper()
		sts, err := s.UndeliveredStatements(ctx, "kafka:t", base, &after, limit)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, st := range sts {
			out = append(out, st.Tenant+"/"+st.Hash[:6])
		}
		return out
	}
	want(page(a, 1), b)
	want(page(b, 10), c)
	want(page(c, 10))
	if err := s.MarkDelivered(ctx, "kafka:t", []billing.StoredStatement{b, {Tenant: "a", Period: "2026-11", Hash: "other"}}, base); err != nil {
		t.Fatal(err)
	}
	want(list("kafka:t", 10), a, c)
	want(list("webhook:w", 10), a, b, c)
	if err := s.MarkDelivered(ctx, "kafka:t", []billing.StoredStatement{a, c}, base); err != nil {
		t.Fatal(err)
	}
	want(list("kafka:t", 10))
	// A reissue of b's period is a statement of its own to deliver.
	var rev billing.Statement
	if err := json.Unmarshal(b.Content, &rev); err != nil {
		t.Fatal(err)
	}
	rev.Hash, rev.Revision, rev.Replaces, rev.VoidReason = "", 1, b.Hash, "test"
	rev.Hash, _ = rev.ContentHash()
	b1, err := s.SaveRevision(ctx, rev, base.Add(time.Hour))
	if err != nil || b1.Revision != 1 {
		t.Fatalf("reissue: %+v, %v", b1, err)
	}
	want(list("kafka:t", 10), b1)
	sts, err := s.UndeliveredStatements(ctx, "kafka:t", base, nil, 10)
	if err != nil || len(sts) != 1 || sts[0].Revision != 1 || string(sts[0].Content) != string(b1.Content) {
		t.Errorf("reissue listed as %+v (%v), want revision 1 as stored", sts, err)
	}
}

// TestStatementDeadLetters: a dead letter is listed for its sink alone
// with what was recorded, leaves the statement undelivered (a restart
// tries it again), and is no longer listed once the statement is
// delivered.
func TestStatementDeadLetters(t *testing.T) {
	ctx := t.Context()
	s := chstoretest.OpenMigrated(t)
	p, err := billing.ParsePeriod("2026-11", time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	base := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	st := billing.Statement{Tenant: "acme", Period: p.Key, Zone: "UTC", PeriodStart: p.Start, PeriodEnd: p.End, Currency: "USD"}
	st.Hash, _ = st.ContentHash()
	stored, err := s.SaveStatement(ctx, st, base)
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("é", 600) // 1,200 bytes: cut to at most 1,000, valid UTF-8
	if err := s.MarkDeadLettered(ctx, "webhook:w", stored, 5, "answered 400 Bad Request "+long, base.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	dead, err := s.StatementDeadLetters(ctx, "webhook:w")
	if err != nil || len(dead) != 1 {
		t.Fatalf("dead letters %+v, %v; want one", dead, err)
	}
	d := dead[0]
	if d.Sink != "webhook:w" || d.Tenant != "acme" || d.Period != "2026-11" || d.Hash != stored.Hash || d.Revision != 0 || d.Attempts != 5 ||
		!strings.HasPrefix(d.Reason, "answered 400") || len(d.Reason) > 1000 || !utf8.ValidString(d.Reason) || !d.At.Equal(base.Add(time.Minute)) {
		t.Errorf("dead letter %+v", d)
	}
	if other, err := s.StatementDeadLetters(ctx, "kafka:t"); err != nil || len(other) != 0 {
		t.Errorf("another sink's dead letters: %v, %v", other, err)
	}
	if left, err := s.UndeliveredStatements(ctx, "webhook:w", base, nil, 10); err != nil || len(left) != 1 {
		t.Errorf("undelivered after the dead letter: %v, %v; want the statement", left, err)
	}
	if err := s.MarkDelivered(ctx, "webhook:w", []billing.StoredStatement{stored}, base.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if dead, err := s.StatementDeadLetters(ctx, "webhook:w"); err != nil || len(dead) != 0 {
		t.Errorf("dead letters after the delivery: %v, %v; want none", dead, err)
	}
}
