package chstore_test

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"tokenmeter/billing"
	"tokenmeter/internal/adapter/chstore/chstoretest"
)

// TestStatementsAreWrittenOnce checks that a stored statement never
// changes: closes racing with different statements all get the first one
// stored, and every re-read gives the same bytes.
func TestStatementsAreWrittenOnce(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	p, err := billing.ParsePeriod("2026-11", time.FixedZone("+05:30", 5*3600+1800))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.Statement(t.Context(), "acme", p.Key); err != nil || ok {
		t.Fatalf("statement of an open period: ok %v, err %v", ok, err)
	}
	closedAt := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	var (
		wg  sync.WaitGroup
		got = make([]billing.StoredStatement, 4)
	)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := billing.Statement{Tenant: "acme", Period: p.Key, Zone: p.Zone.String(), PeriodStart: p.Start.UTC(), PeriodEnd: p.End.UTC(),
				Currency: "USD", Charge: billing.Money(i), Total: 0}
			st.Hash, _ = st.ContentHash()
			var err error
			if got[i], err = s.SaveStatement(t.Context(), st, closedAt.Add(time.Duration(i)*time.Second)); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	first, ok, err := s.Statement(t.Context(), "acme", p.Key)
	if err != nil || !ok {
		t.Fatalf("after the closes: ok %v, err %v", ok, err)
	}
	for i, g := range got {
		if g.Hash != first.Hash || !bytes.Equal(g.Content, first.Content) {
			t.Errorf("close %d got statement %s, the store holds %s", i, g.Hash, first.Hash)
		}
	}
	again, _, _ := s.Statement(t.Context(), "acme", p.Key)
	if !bytes.Equal(again.Content, first.Content) || again.Hash != first.Hash || !again.ClosedAt.Equal(first.ClosedAt) {
		t.Error("a re-read differs from the first read")
	}
	if !bytes.Contains(first.Content, []byte(`"period":"2026-11"`)) || !bytes.Contains(first.Content, []byte(`"zone":"+05:30"`)) {
		t.Errorf("content %s", first.Content)
	}
}
