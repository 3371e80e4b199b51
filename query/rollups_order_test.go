package query_test

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"tokenmeter/query"
	"tokenmeter/rollup"
)

// shuffledRollups hands over its rows in a new order on each read, as
// ClickHouse may; its other reads are not used.
type shuffledRollups struct {
	query.Source
	rows []query.RollupRow
	rng  *rand.Rand
}

func (s *shuffledRollups) RollupRows(_ context.Context, _ query.RollupRead, row func(*query.RollupRow) error) error {
	for _, i := range s.rng.Perm(len(s.rows)) {
		r := s.rows[i]
		if err := row(&r); err != nil {
			return err
		}
	}
	return nil
}

// TestRollupsMergedHereDoNotDependOnRowOrder: the rows a tenant's read
// merges in this process give the same latency sums (floats) whatever the
// order the store hands them over in.
func TestRollupsMergedHereDoNotDependOnRowOrder(t *testing.T) {
	hour := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	rng := rand.New(rand.NewPCG(4, 2))
	src := &shuffledRollups{rng: rng}
	for range 300 { // one step and group: rows of models and deployments
		r := query.RollupRow{Start: hour, Group: map[string]string{}, Requests: 1, ErrorsBy: map[string]uint64{},
			Latency: map[string]query.Dist{}}
		for _, m := range rollup.LatencyMetrics {
			r.Latency[m] = query.Dist{Count: 1, Sum: rng.Float64() * math.Pow(10, float64(rng.IntN(16)-6))}
		}
		src.rows = append(src.rows, r)
	}
	svc := query.New(src, query.Config{})
	q := query.RollupQuery{TenantID: "acme", Start: hour, End: hour.Add(time.Hour), Step: "hour"}
	if !q.MergesHere() {
		t.Fatalf("%+v is merged by the store: the test is wrong", q)
	}
	first, err := svc.Rollups(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	if len(first) != 1 || first[0].Requests != 300 {
		t.Fatalf("got %+v, want one row of 300 requests", first)
	}
	for i := range 20 {
		again, err := svc.Rollups(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		// Exact: the same read must give the same bits.
		if diff := cmp.Diff(first, again); diff != "" {
			t.Fatalf("read %d differs from the first (-first +again):\n%s", i+2, diff)
		}
	}
}
