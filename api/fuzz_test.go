package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"tokenmeter/query"
	"tokenmeter/rollup"

	"github.com/prometheus/client_golang/prometheus"

	"tokenmeter/api"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/ident"
)

// queryStore stands behind the real read side (query.Service) of a real
// api.Server for FuzzQueryParams: it builds each read's SQL as chstore.Store
// does and answers a few rows per read, so that paging and series building run; it
// keeps the last query that reached it.
type queryStore struct {
	mu   sync.Mutex
	last *reached
}

// reached is what a query that got through the API's checks asked for.
type reached struct {
	tenant  string
	groupBy []string
	allowed []string
	start   time.Time
	end     time.Time
	args    []any
}

func (s *queryStore) keep(r reached) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = &r
}

func (s *queryStore) take() *reached {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.last
	s.last = nil
	return r
}

// groups returns three groups over fields, for three series.
func groups(fields []string) []map[string]string {
	var out []map[string]string
	for i := range 3 {
		g := map[string]string{}
		for _, f := range fields {
			g[f] = fmt.Sprintf("g%d", i)
		}
		out = append(out, g)
	}
	return out
}

// sql keeps what a read asks of ClickHouse: the SQL arguments chstore
// would bind.
func (s *queryStore) sql(t *reached, read any) error {
	_, args, err := chstore.ReadSQL(read)
	if err != nil {
		return err
	}
	t.args = args
	s.keep(*t)
	return nil
}

func (s *queryStore) Watermark(context.Context, string) (time.Time, bool, error) {
	return time.Time{}, false, nil
}

func (s *queryStore) DirtyHours(context.Context, time.Time, time.Time) ([]time.Time, error) {
	return nil, nil
}

func (s *queryStore) HourVersions(context.Context, time.Time, time.Time) ([]rollup.HourVersion, error) {
	return nil, nil
}

func (s *queryStore) DayVersions(context.Context, time.Time, time.Time) ([]rollup.DayVersion, error) {
	return nil, nil
}

func (s *queryStore) HoursWithoutPeaks(context.Context, time.Time, time.Time) ([]time.Time, error) {
	return nil, nil
}

func (s *queryStore) UsageRows(_ context.Context, r query.UsageRead) ([]query.UsageRow, error) {
	q := r.Query
	if err := s.sql(&reached{tenant: q.TenantID, groupBy: q.GroupBy, allowed: query.UsageGroupFields, start: q.Start, end: q.End}, r); err != nil {
		return nil, err
	}
	return []query.UsageRow{{Start: q.Start, TenantID: "acme", Model: "m", Requests: 1}}, nil
}

func (s *queryStore) RollupRows(_ context.Context, r query.RollupRead, row func(*query.RollupRow) error) error {
	q := r.Query
	if err := s.sql(&reached{tenant: q.TenantID, groupBy: q.GroupBy, allowed: rollup.RollupGroupFields, start: q.Start, end: q.End}, r); err != nil {
		return err
	}
	for _, g := range groups(q.GroupBy) {
		if err := row(&query.RollupRow{Start: q.Start, Group: g, Requests: 2, Errors: 1, OutputTokens: 7,
			ErrorsBy: map[string]uint64{"timeout": 1}, Latency: map[string]query.Dist{}}); err != nil {
			return err
		}
	}
	return nil
}

func (s *queryStore) TrafficRows(_ context.Context, r query.TrafficRead) ([]query.TrafficRow, []string, error) {
	q := r.Query
	if err := s.sql(&reached{tenant: q.TenantID, groupBy: q.GroupBy, allowed: rollup.RollupGroupFields, start: q.Start, end: q.End}, r); err != nil {
		return nil, nil, err
	}
	var (
		rows []query.TrafficRow
		ids  []string
	)
	for i, g := range groups(q.GroupBy) {
		rows = append(rows, query.TrafficRow{Start: q.Start, Group: g, Requests: 2, Errors: 1, OutputTokens: 7,
			ErrorsBy: map[string]uint64{"timeout": 1}, PeakMinuteRequests: 2, PeakMinuteOutputTokens: 7})
		ids = append(ids, fmt.Sprint(i))
	}
	return rows, ids, nil
}

func (s *queryStore) RawLatencyRows(_ context.Context, q query.RollupQuery, row func(query.RawLatencyRow) error) error {
	if err := s.sql(&reached{tenant: q.TenantID, groupBy: q.GroupBy, allowed: rollup.RollupGroupFields, start: q.Start, end: q.End}, q); err != nil {
		return err
	}
	for _, g := range groups(q.GroupBy) {
		if err := row(query.RawLatencyRow{Start: q.Start, Group: g, Values: map[string][]float64{"ttft": {1, 2, 3}, "e2e": {5}}}); err != nil {
			return err
		}
	}
	return nil
}

func (s *queryStore) CostRows(_ context.Context, q query.CostQuery) ([]query.CostRow, error) {
	if err := s.sql(&reached{tenant: q.TenantID, groupBy: q.GroupBy, allowed: query.CostGroupFields, start: q.Start, end: q.End}, q); err != nil {
		return nil, err
	}
	var rows []query.CostRow
	for _, g := range groups(q.GroupBy) {
		rows = append(rows, query.CostRow{Start: q.Start, Group: g, CostNanos: 5, Requests: 1, OutputTokens: 3})
	}
	return rows, nil
}

func (s *queryStore) GPUUsageRows(_ context.Context, q query.GPUUsageQuery, _ query.GPUTokens) ([]query.GPUUsageRow, error) {
	if err := s.sql(&reached{groupBy: q.GroupBy, allowed: query.GPUGroupFields, start: q.Start, end: q.End}, q); err != nil {
		return nil, err
	}
	var rows []query.GPUUsageRow
	for _, g := range groups(q.GroupBy) {
		rows = append(rows, query.GPUUsageRow{Start: q.Start, Group: g, GPUSeconds: 3600, InstanceSeconds: 3600})
	}
	return rows, nil
}

func (s *queryStore) EngineRows(_ context.Context, q query.EngineQuery) ([]query.EngineRow, error) {
	if err := s.sql(&reached{groupBy: q.GroupBy, allowed: query.EngineGroupFields, start: q.Start, end: q.End}, q); err != nil {
		return nil, err
	}
	var rows []query.EngineRow
	for _, g := range groups(q.GroupBy) {
		r := query.EngineRow{Start: q.Start, Group: g, Replicas: 1}
		r.Samples, r.SampledSeconds, r.WaitingValues, r.WaitingCounts = 1, 10, []uint32{3}, []uint64{1}
		rows = append(rows, r)
	}
	return rows, nil
}

func (s *queryStore) CurrentPriceBook(context.Context) (string, string, time.Time, bool, error) {
	return "", "", time.Time{}, false, nil
}

func (s *queryStore) PutPriceBook(context.Context, string, string, string, time.Time) error {
	return nil
}

// requestTarget percent-encodes the bytes of a fuzzed query that cannot
// appear in an HTTP request line (controls, space, non-ASCII) and '#', and
// leaves the rest, invalid escapes included, for the server to parse.
func requestTarget(query string) string {
	var b strings.Builder
	for i := 0; i < len(query); i++ {
		if c := query[i]; c <= ' ' || c >= 0x7f || c == '#' {
			fmt.Fprintf(&b, "%%%02X", c)
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}

// fuzzPaths are the GET endpoints whose query parameters FuzzQueryParams
// fuzzes, chosen by a byte of the input; fuzzRoles the keys it calls with.
var (
	fuzzPaths = []string{"/v1/usage", "/v1/latency", "/v1/goodput", "/v1/traffic", "/v1/cost", "/v1/gpu-usage", "/v1/engine-stats"}
	fuzzRoles = []string{"admin", "finance", "tenant"}
)

// FuzzQueryParams sends fuzzed query strings through the real REST path (the
// grpc-gateway's query-parameter parsing, auth, the API's selector and
// parameter checks, chstore's query normalization and SQL builders) over
// loopback, with queryStore in place of ClickHouse. No request may fail with
// a 5xx or a broken connection; a query that is answered 200 reached the
// store with a valid tenant identifier (the key's own for a tenant key),
// passed as an SQL argument, group-by fields the endpoint allows, and
// start before end.
func FuzzQueryParams(f *testing.F) {
	ctx, cancel := context.WithCancel(context.Background())
	store := &queryStore{}
	reads := query.New(store, query.Config{})
	var kf api.KeysFile
	for _, role := range fuzzRoles {
		e := api.KeyEntry{Name: role, SHA256: api.HashKey("key-" + role), Role: api.Role(role)}
		if role == "tenant" {
			e.TenantID = "acme"
		}
		kf.Keys = append(kf.Keys, e)
	}
	keys, err := api.NewKeys(kf)
	if err != nil {
		f.Fatal(err)
	}
	srv, err := api.New(ctx, api.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"},
		&api.Services{Keys: keys, Usage: reads, Rollups: reads, Cost: reads, Engine: reads, Prices: store},
		func(context.Context) error { return nil }, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		f.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	f.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			f.Error(err)
		}
	})
	client := &http.Client{Timeout: 10 * time.Second}

	const day = "start=2026-11-22T00:00:00Z&end=2026-11-23T00:00:00Z"
	const sel = "selector.start=2026-11-22T00:00:00Z&selector.end=2026-11-22T06:00:00Z"
	f.Add(uint8(0), uint8(0), day+"&granularity=hour&group_by=tenant_id&group_by=model&tenant_id=acme")
	f.Add(uint8(1), uint8(1), sel+"&selector.step=hour&selector.group_by=tenant_id,model&exact=true&selector.page_size=2&selector.page_token=1")
	f.Add(uint8(2), uint8(2), sel+"&selector.group_by=slo_class")
	f.Add(uint8(3), uint8(0), sel+"&selector.step=minute&selector.tenant_id=acme&selector.group_by=deployment")
	f.Add(uint8(4), uint8(1), day+"&step=day&group_by=tenant_id&busy_policy=tokens&idle_policy=shared_even&page_size=1")
	f.Add(uint8(5), uint8(0), day+"&step=hour&group_by=deployment,gpu_type&page_size=1000")
	f.Add(uint8(6), uint8(1), day+"&step=hour&group_by=deployment,replica&page_size=2")
	f.Fuzz(func(t *testing.T, path, role uint8, query string) {
		r := fuzzRoles[int(role)%len(fuzzRoles)]
		req, err := http.NewRequest(http.MethodGet, "http://"+srv.HTTPAddr()+fuzzPaths[int(path)%len(fuzzPaths)], nil)
		if err != nil {
			t.Fatal(err)
		}
		req.URL.RawQuery = requestTarget(query)
		req.Header.Set("Authorization", "Bearer key-"+r)
		store.take()
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", req.URL, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("GET %s: read body: %v", req.URL, err)
		}
		if resp.StatusCode >= 500 {
			t.Fatalf("GET %s as %s: %d %s", req.URL, r, resp.StatusCode, body)
		}
		if !json.Valid(body) {
			t.Fatalf("GET %s as %s: %d with a body that is not JSON: %q", req.URL, r, resp.StatusCode, body)
		}
		if resp.StatusCode != http.StatusOK {
			return
		}
		q := store.take()
		if q == nil {
			t.Fatalf("GET %s as %s: 200 without a store query", req.URL, r)
		}
		if err := ident.Check("tenant_id", q.tenant); err != nil {
			t.Fatalf("GET %s as %s: store queried for %v", req.URL, r, err)
		}
		if r == "tenant" && q.tenant != "acme" {
			t.Fatalf("GET %s with acme's key: store queried for tenant %q", req.URL, q.tenant)
		}
		if q.tenant != "" && !slices.Contains(q.args, any(q.tenant)) {
			t.Fatalf("GET %s: tenant %q is not an SQL argument: %v", req.URL, q.tenant, q.args)
		}
		for _, g := range q.groupBy {
			if !slices.Contains(q.allowed, g) {
				t.Fatalf("GET %s: store queried with group_by %q", req.URL, g)
			}
		}
		if !q.start.Before(q.end) {
			t.Fatalf("GET %s: store queried for [%s, %s)", req.URL, q.start, q.end)
		}
	})
}
