package closing_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"tokenmeter/billing"
	"tokenmeter/billing/closing"
	"tokenmeter/billing/export"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
)

// TestCloseRefusesUnpricedUsage closes a month in which acme ran 10
// requests of a model the price book does not price: acme's close is
// refused with an error naming the model and its requests, and nothing is
// stored for it, while globex (priced usage only) closes; closing again
// with FlagUnpriced (an admin's explicit choice) closes acme with the
// requests flagged on the statement.
func TestCloseRefusesUnpricedUsage(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	at := time.Date(2026, 11, 10, 12, 0, 0, 0, time.UTC)
	events := []*meterv1.InferenceEvent{
		ev("g1", "globex", "m", at, 1_000_000, 0, 10),
		ev("a1", "acme", "m", at, 1_000_000, 0, 10),
	}
	for i := range 10 {
		events = append(events, ev(fmt.Sprintf("x%d", i), "acme", "new-model", at.Add(time.Duration(i)*time.Minute), 1000, 0, 100))
	}
	chstoretest.Insert(t, s, events)
	b, err := billing.ParsePriceBook([]byte(book))
	if err != nil {
		t.Fatal(err)
	}
	closer := closing.New(query.New(s, query.Config{}), s, nil)
	now := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	req := closing.Request{Period: "2026-11", Tenants: []closing.Tenant{{ID: "acme", Zone: time.UTC}, {ID: "globex", Zone: time.UTC}},
		Book: b, Grace: billing.DefaultGrace, Now: now, CaughtUp: now}

	got, err := closer.Close(t.Context(), req)
	if !errors.Is(err, closing.ErrUnpricedUsage) {
		t.Fatalf("close with unpriced usage: err = %v, want ErrUnpricedUsage", err)
	}
	var ue *closing.UnpricedError
	if !errors.As(err, &ue) || ue.Tenant != "acme" || len(ue.Models) != 1 || ue.Models[0] != (closing.UnpricedModel{Model: "new-model", Requests: 10}) {
		t.Fatalf("refusal %#v, want acme's new-model with 10 requests", ue)
	}
	if msg := err.Error(); !strings.Contains(msg, `"new-model": 10 requests`) || !strings.Contains(msg, "flag_unpriced") {
		t.Errorf("the refusal does not name the model, its requests and the way out: %s", msg)
	}
	if len(got) != 1 || got[0].Tenant != "globex" {
		t.Fatalf("closed %+v, want globex's statement only", got)
	}
	if _, ok, _ := s.Statement(t.Context(), "acme", "2026-11"); ok {
		t.Fatal("acme's refused statement was stored")
	}

	req.FlagUnpriced = true
	got, err = closer.Close(t.Context(), req)
	if err != nil {
		t.Fatalf("close with FlagUnpriced: %v", err)
	}
	if len(got) != 2 || got[0].Tenant != "acme" {
		t.Fatalf("closed %+v, want acme's and globex's statements", got)
	}
	var acme billing.Statement
	if err := json.Unmarshal(got[0].Content, &acme); err != nil {
		t.Fatal(err)
	}
	if acme.UnpricedRequests != 10 {
		t.Errorf("acme's statement flags %d unpriced requests, want 10", acme.UnpricedRequests)
	}
}

// TestIdleIsNoBillingAccount asks for the __idle__ pseudo-tenant's
// periods, close, statement and usage-cost: each is refused as a reserved
// tenant, so the provider's idle GPU cost never becomes a bill.
func TestIdleIsNoBillingAccount(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	b, err := billing.ParsePriceBook([]byte(book))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := closing.NewService(closing.Deps{Reads: query.New(s, query.Config{}), Store: s,
		Prices: func(context.Context) (*billing.PriceBook, error) { return b, nil }}, closing.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for name, call := range map[string]func() error{
		"periods": func() error { _, err := svc.Periods(ctx, billing.IdleTenant); return err },
		"close": func() error {
			_, err := svc.Close(ctx, closing.CloseRequest{Period: "2026-10", Tenants: []string{billing.IdleTenant}})
			return err
		},
		"statement": func() error { _, err := svc.Statement(ctx, billing.IdleTenant, "2026-10", true); return err },
		"usage-cost": func() error {
			return svc.EachUsageCost(ctx, closing.UsageCostQuery{Tenant: billing.IdleTenant, Start: time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC),
				End: time.Date(2026, 10, 2, 0, 0, 0, 0, time.UTC)}, func(*export.UsageCostRow) error { return nil })
		},
	} {
		if err := call(); !errors.Is(err, closing.ErrInvalidRequest) || !strings.Contains(err.Error(), "reserved") {
			t.Errorf("%s of %s: %v, want ErrInvalidRequest (reserved)", name, billing.IdleTenant, err)
		}
	}
}
