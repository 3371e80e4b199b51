package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// countsAPI answers usage and traffic totals that grow by one step per
// call, up to raw and rolled.
type countsAPI struct {
	mu                       sync.Mutex
	raw, rolled              uint64 // where the counts end
	rawNow, rolledNow, step  uint64
	usageQuery, trafficQuery string
}

func (c *countsAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch r.URL.Path {
	case "/v1/usage":
		c.usageQuery = r.URL.RawQuery
		c.rawNow = min(c.raw, c.rawNow+c.step)
		fmt.Fprintf(w, `{"buckets":[{"requests":"%d"}]}`, c.rawNow)
	case "/v1/traffic":
		c.trafficQuery = r.URL.RawQuery
		c.rolledNow = min(c.rolled, c.rolledNow+c.step, c.rawNow)
		fmt.Fprintf(w, `{"series":[{"summary":{"requests":"%d"}}]}`, c.rolledNow)
	default:
		http.NotFound(w, r)
	}
}

func TestCoverageWait(t *testing.T) {
	first := time.Date(2026, 11, 23, 10, 30, 0, 0, time.UTC)
	last := time.Date(2026, 11, 24, 10, 15, 0, 0, time.UTC)
	for _, tt := range []struct {
		name        string
		api         *countsAPI
		want        uint64
		wantErr     string
		wantSuccess bool
	}{
		{"catches up", &countsAPI{raw: 120, rolled: 120, step: 40}, 120, "", true},
		{"consumer behind", &countsAPI{raw: 80, rolled: 80, step: 1000}, 120, "the consumer is behind", false},
		{"rollups behind", &countsAPI{raw: 120, rolled: 100, step: 1000}, 120, "the rollup job is behind", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := tt.api
			srv := httptest.NewServer(api)
			defer srv.Close()
			cv := newCoverage(newClient(connConfig{Addr: srv.URL, Key: "k", Timeout: time.Second}, 1), first, last)
			cv.poll = 10 * time.Millisecond
			timeout := 2 * time.Second // the failing cases see their final counts at their first poll
			if tt.wantSuccess {
				timeout = 10 * time.Second
			}
			err := cv.wait(context.Background(), tt.want, timeout, io.Discard)
			if tt.wantSuccess != (err == nil) || err != nil && !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("got %v, want success %v or an error naming %q", err, tt.wantSuccess, tt.wantErr)
			}
			want := "end=2026-11-24T11%3A00%3A00Z&granularity=total&start=2026-11-23T10%3A00%3A00Z"
			// A poll may still be in flight after a failing wait returned.
			api.mu.Lock()
			got := api.usageQuery
			api.mu.Unlock()
			if got != want {
				t.Errorf("usage query %s, want %s (whole hours around the span)", got, want)
			}
		})
	}
}
