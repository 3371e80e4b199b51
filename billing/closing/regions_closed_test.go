package closing_test

import (
	"context"
	"maps"
	"sync"
	"testing"
	"time"

	"tokenmeter/billing"
	"tokenmeter/billing/closing"
	"tokenmeter/billing/export"
	"tokenmeter/internal/adapter/chstore"
)

// regionStore is the ClickHouse store with the deployments' regions set by
// the test (as GPU samples would name them, until their retention).
type regionStore struct {
	*chstore.Store
	mu      sync.Mutex
	regions map[string][]string
}

func (s *regionStore) DeploymentRegions(context.Context, time.Time, time.Time) (map[string][]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.regions), nil
}

func (s *regionStore) set(m map[string][]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.regions = m
}

// TestClosedRegionsKept closes September through ClickHouse while d1 is in
// us-east-1 and d2 in us-west-2, then lets the regions change (d1 moved to
// eu-west-1, d2's samples past retention): the closed statement's export
// rows (FOCUS RegionId, RegionName) keep the regions of its close, and its
// bytes and hash do not change.
func TestClosedRegionsKept(t *testing.T) {
	f := newServiceFixture(t)
	ctx := t.Context()
	store := &regionStore{Store: f.store, regions: map[string][]string{"d1": {"us-east-1"}, "d2": {"us-west-2"}}}
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	svc, err := closing.NewService(closing.Deps{Reads: f.reads, Store: store,
		Prices: func(ctx context.Context) (*billing.PriceBook, error) { return billing.BookInForce(ctx, f.store) }},
		closing.Config{Zones: map[string]*time.Location{"beta": f.zone}, ByDeployment: true, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Close(ctx, closing.CloseRequest{Period: "2026-09", Tenants: []string{"acme"}}); err != nil {
		t.Fatal(err)
	}
	regionsOf := func() (map[string]string, billing.Statement, []byte) {
		t.Helper()
		v, err := svc.Statement(ctx, "acme", "2026-09", true)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := svc.StatementRows(ctx, v)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, r := range rows {
			if r.Kind == export.RowLine {
				if was, ok := out[r.Line.Deployment]; ok && was != r.Region {
					t.Fatalf("%s: regions %q and %q", r.Line.Deployment, was, r.Region)
				}
				out[r.Line.Deployment] = r.Region
			}
		}
		return out, v.Statement, v.Content
	}
	before, st, content := regionsOf()
	if before["d1"] != "us-east-1" || before["d2"] != "us-west-2" {
		t.Fatalf("regions at the close %v, want d1 us-east-1, d2 us-west-2", before)
	}
	store.set(map[string][]string{"d1": {"eu-west-1"}})
	mu.Lock()
	now = now.Add(10 * time.Minute) // past the regions' cache
	mu.Unlock()
	after, st2, content2 := regionsOf()
	if !maps.Equal(before, after) {
		t.Errorf("regions of the closed September changed: %v at the close, %v now", before, after)
	}
	if st2.Hash != st.Hash || string(content2) != string(content) {
		t.Errorf("the closed statement changed: hash %s, then %s", st.Hash, st2.Hash)
	}
}
