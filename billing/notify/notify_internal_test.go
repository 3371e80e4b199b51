package notify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"tokenmeter/billing"
)

// TestNextBackoff: a failing sink waits the minimum, then twice as long
// after each failure, never more than the cap.
func TestNextBackoff(t *testing.T) {
	lo, hi := time.Second, 5*time.Minute
	var got []time.Duration
	b := time.Duration(0)
	for range 12 {
		b = nextBackoff(b, lo, hi)
		got = append(got, b)
	}
	want := []time.Duration{1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300}
	for i := range want {
		if got[i] != want[i]*time.Second {
			t.Fatalf("backoffs %v, want %v seconds", got, want)
		}
	}
}

// raceStore is a Store whose list of undelivered statements is set by the
// test, with a hook run while it is read.
type raceStore struct {
	now     time.Time
	pending []billing.StoredStatement
	onList  func()
}

func (s *raceStore) ServerNow(context.Context) (time.Time, error) { return s.now, nil }
func (s *raceStore) DeliveryStart(context.Context, string) (time.Time, error) {
	return s.now.Add(-time.Hour), nil
}
func (s *raceStore) UndeliveredStatements(_ context.Context, _ string, _ time.Time, after *billing.StoredStatement, _ int) ([]billing.StoredStatement, error) {
	if after != nil {
		return nil, nil // one page
	}
	if s.onList != nil {
		s.onList()
	}
	return slices.Clone(s.pending), nil
}
func (s *raceStore) MarkDelivered(_ context.Context, _ string, sts []billing.StoredStatement, _ time.Time) error {
	s.pending = slices.DeleteFunc(s.pending, func(p billing.StoredStatement) bool {
		return slices.ContainsFunc(sts, func(d billing.StoredStatement) bool { return d.Hash == p.Hash })
	})
	return nil
}
func (s *raceStore) MarkDeadLettered(context.Context, string, billing.StoredStatement, int, string, time.Time) error {
	return nil
}

// Invoices is an invoice for every statement listed: an event waits for
// its statement's invoice.
func (s *raceStore) Invoices(context.Context, string, string) ([]billing.StoredInvoice, error) {
	var out []billing.StoredInvoice
	for i, st := range s.pending {
		inv := billing.Invoice{Kind: billing.KindInvoice, Number: fmt.Sprint(i + 1), Seq: uint64(i + 1), Tenant: st.Tenant, Period: st.Period,
			Revision: st.Revision, StatementHash: st.Hash, Currency: "USD"}
		doc, err := inv.Encode()
		if err != nil {
			return nil, err
		}
		out = append(out, doc)
	}
	return out, nil
}

// sentSink records what it is sent.
type sentSink struct{ sent []string }

func (s *sentSink) Name() string { return "test" }
func (s *sentSink) Send(_ context.Context, out []Outgoing) []error {
	for _, o := range out {
		s.sent = append(s.sent, o.Event.Tenant)
	}
	return make([]error, len(out))
}

// TestToldDuringPassIsSentAtOnce: a close that stores its statement and
// tells the Notifier while a pass reads its list (which misses it) has its
// statement sent by the next pass, without waiting for the settle delay;
// a statement closed as recently that no close told of waits.
func TestToldDuringPassIsSentAtOnce(t *testing.T) {
	now := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	statement := func(tenant string) billing.StoredStatement {
		st := billing.Statement{Tenant: tenant, Period: "2026-11", Zone: "UTC", Currency: "USD"}
		b, _ := json.Marshal(st)
		return billing.StoredStatement{Tenant: tenant, Period: "2026-11", Hash: "h-" + tenant, Content: b, ClosedAt: now}
	}
	acme, other := statement("acme"), statement("other")
	store := &raceStore{now: now}
	sink := &sentSink{}
	n, err := New(Config{}, store, []Sink{sink}, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	store.pending = []billing.StoredStatement{other} // closed elsewhere, just now
	store.onList = func() {
		store.onList = nil
		n.Closed([]billing.StoredStatement{acme}) // stored and told after the read
	}
	if err := n.Deliver(t.Context()); err != nil {
		t.Fatal(err)
	}
	store.pending = append(store.pending, acme)
	if err := n.Deliver(t.Context()); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(sink.sent) != "[acme]" {
		t.Errorf("sent %v, want [acme] (other has not settled)", sink.sent)
	}
}

// pageStore is a Store over a list of undelivered statements in close
// order, listed a page at a time after a cursor.
type pageStore struct {
	raceStore
	dead []string
}

func (s *pageStore) UndeliveredStatements(_ context.Context, _ string, _ time.Time, after *billing.StoredStatement, limit int) ([]billing.StoredStatement, error) {
	i := 0
	if after != nil {
		i = slices.IndexFunc(s.pending, func(p billing.StoredStatement) bool { return p.Hash == after.Hash }) + 1
	}
	return slices.Clone(s.pending[i:min(i+limit, len(s.pending))]), nil
}
func (s *pageStore) MarkDeadLettered(_ context.Context, _ string, st billing.StoredStatement, _ int, _ string, _ time.Time) error {
	s.dead = append(s.dead, st.Tenant)
	return nil
}

// TestFullPageOfFailuresDoesNotStarve: more statements than a page holds
// (passLimit) whose events cannot be made, closed before a good one, do
// not keep the good one from being sent: a pass reads on, page after
// page, and the failing ones become dead letters.
func TestFullPageOfFailuresDoesNotStarve(t *testing.T) {
	now := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	store := &pageStore{raceStore: raceStore{now: now}}
	for i := range passLimit + 1 {
		store.pending = append(store.pending, billing.StoredStatement{Tenant: fmt.Sprintf("t%04d", i), Period: "2026-11",
			Hash: fmt.Sprintf("h%04d", i), Content: []byte("{"), ClosedAt: now.Add(-time.Hour)})
	}
	good, _ := json.Marshal(billing.Statement{Tenant: "good", Period: "2026-11", Zone: "UTC", Currency: "USD"})
	store.pending = append(store.pending, billing.StoredStatement{Tenant: "good", Period: "2026-11", Hash: "good", Content: good, ClosedAt: now.Add(-time.Hour)})
	sink := &sentSink{}
	n, err := New(Config{DeadLetterAttempts: 1}, store, []Sink{sink}, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Deliver(t.Context()); err == nil {
		t.Error("a pass made events of corrupt statements")
	}
	if fmt.Sprint(sink.sent) != "[good]" || len(store.dead) != passLimit+1 {
		t.Errorf("sent %v and %d dead letters, want [good] and %d", sink.sent, len(store.dead), passLimit+1)
	}
	if err := n.Deliver(t.Context()); err != nil || len(sink.sent) != 1 {
		t.Errorf("a second pass: %v, sent %v; want nothing tried", err, sink.sent)
	}
}

// TestAnswerError: which webhook answers fail for good (a 4xx other than
// 408 and 429), which are the endpoint's (no more POSTs in that pass) and
// which the event's.
func TestAnswerError(t *testing.T) {
	for code, want := range map[int]string{200: "delivered", 204: "delivered", 302: "unavailable", 400: "permanent", 401: "permanent",
		404: "permanent", 408: "transient", 409: "permanent", 422: "permanent", 429: "unavailable", 500: "transient",
		501: "transient", 502: "unavailable", 503: "unavailable", 504: "unavailable"} {
		err := answerError(code, fmt.Sprint(code))
		var (
			perm    *PermanentError
			unavail *UnavailableError
			got     = "transient"
		)
		switch {
		case err == nil:
			got = "delivered"
		case errors.As(err, &perm):
			got = "permanent"
		case errors.As(err, &unavail):
			got = "unavailable"
		}
		if got != want {
			t.Errorf("answer %d: %s (%v), want %s", code, got, err, want)
		}
	}
}
