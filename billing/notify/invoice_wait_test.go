package notify_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"tokenmeter/billing"
	"tokenmeter/billing/closing"
	"tokenmeter/billing/notify"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/testkit/billingtest"
	"tokenmeter/query"
)

// invoicesDown is a store whose invoice inserts fail while down.
type invoicesDown struct {
	*chstore.Store
	down bool
}

var errInvoicesDown = errors.New("invoices down")

func (s *invoicesDown) SaveInvoices(ctx context.Context, docs []billing.StoredInvoice) error {
	if s.down {
		return errInvoicesDown
	}
	return s.Store.SaveInvoices(ctx, docs)
}

// eventSink keeps the events it is sent.
type eventSink struct{ events []notify.Event }

func (s *eventSink) Name() string { return "memory" }
func (s *eventSink) Send(_ context.Context, out []notify.Outgoing) []error {
	for _, o := range out {
		s.events = append(s.events, o.Event)
	}
	return make([]error, len(out))
}

// TestEventWaitsForItsInvoice: a close stores its statements and fails to
// issue their invoices. The statements' events do not go out without
// their invoices (an event's ID is its statement's hash, so consumers
// would drop a later copy that has it): without an issuer they wait, as
// failed sends, never dead letters; a notifier with the service as
// issuer issues the invoices first and sends each event once, with its
// invoice.
func TestEventWaitsForItsInvoice(t *testing.T) {
	chs, _ := billingtest.New(t)
	store := &invoicesDown{Store: chs, down: true}
	book, err := billing.ParsePriceBook([]byte(billingtest.Book))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := closing.NewService(closing.Deps{Reads: query.New(chs, query.Config{}), Store: store,
		Prices: func(context.Context) (*billing.PriceBook, error) { return book, nil }}, closing.Config{})
	if err != nil {
		t.Fatal(err)
	}
	stored, err := svc.Close(t.Context(), closing.CloseRequest{Period: billingtest.Period})
	if !errors.Is(err, errInvoicesDown) || len(stored) == 0 {
		t.Fatalf("close with invoices down: %d statements, %v; want them stored and errInvoicesDown", len(stored), err)
	}
	sink := &eventSink{}
	n, err := notify.New(notify.Config{Settle: -1, DeadLetterAttempts: 1, MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond},
		chs, []notify.Sink{sink}, prometheus.NewRegistry(), quiet)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := n.Deliver(t.Context()); !errors.Is(err, notify.ErrInvoiceNotIssued) {
			t.Fatalf("a pass with the invoices not issued: %v, want ErrInvoiceNotIssued", err)
		}
	}
	if len(sink.events) != 0 {
		t.Fatalf("%d events sent without their invoice", len(sink.events))
	}
	// The issuer is down too: still nothing sent.
	n.IssueWith(svc.IssueInvoices)
	if err := n.Deliver(t.Context()); !errors.Is(err, notify.ErrInvoiceNotIssued) || !errors.Is(err, errInvoicesDown) {
		t.Fatalf("a pass with the issuer failing: %v, want ErrInvoiceNotIssued and errInvoicesDown", err)
	}
	if len(sink.events) != 0 {
		t.Fatalf("%d events sent without their invoice", len(sink.events))
	}
	store.down = false
	if err := n.Deliver(t.Context()); err != nil {
		t.Fatal(err)
	}
	if len(sink.events) != len(stored) {
		t.Fatalf("%d events sent, want %d (not dead letters)", len(sink.events), len(stored))
	}
	for _, ev := range sink.events {
		if ev.Invoice == nil || ev.Invoice.Number == "" {
			t.Errorf("event of %s sent without its invoice", ev.Tenant)
			continue
		}
		v, err := svc.Invoice(t.Context(), ev.Tenant, ev.Period)
		if err != nil || v.Invoice.Number != ev.Invoice.Number {
			t.Errorf("%s's invoice %q (%v), the event's %q", ev.Tenant, v.Invoice.Number, err, ev.Invoice.Number)
		}
	}
	if err := n.Deliver(t.Context()); err != nil || len(sink.events) != len(stored) {
		t.Errorf("a pass after: %v, %d events; want nothing more", err, len(sink.events))
	}
}
