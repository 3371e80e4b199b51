package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"tokenmeter/ingest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

const testKey = "tm_test"

// fakeAPI stands in for meterd's REST API: it checks requests the way the
// gateway does (strict protobuf JSON, bearer key) and records them.
type fakeAPI struct {
	t *testing.T

	mu       sync.Mutex
	requests int                       // POST /v1/events calls
	events   []*meterv1.InferenceEvent // every event received, resends included
	// failFirst answers the first failFirst publish calls with 503.
	failFirst int
	// dropFirst closes the connection of the first dropFirst publish calls
	// without an answer.
	dropFirst int
	// status, when set, answers every publish call with it and message.
	status  int
	message string
	// usage is the JSON answer of GET /v1/usage; usageQuery records the query.
	usage      string
	usageQuery map[string][]string
}

func newFakeAPI(t *testing.T, f *fakeAPI) *httptest.Server {
	f.t = t
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return srv
}

func writeGatewayError(w http.ResponseWriter, status, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"code":%d,"message":%q,"details":[]}`, code, msg)
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	publish := r.Method == http.MethodPost && r.URL.Path == "/v1/events"
	n := 0
	if publish {
		f.mu.Lock()
		f.requests++
		n = f.requests
		f.mu.Unlock()
	}
	if r.Header.Get("Authorization") != "Bearer "+testKey {
		writeGatewayError(w, http.StatusUnauthorized, 16, "unknown API key")
		return
	}
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/v1/usage":
		f.mu.Lock()
		f.usageQuery = r.URL.Query()
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, f.usage)
	case publish:
		f.publish(w, r, n)
	default:
		writeGatewayError(w, http.StatusNotFound, 5, "Not Found")
	}
}

// rejectLimit is the prompt size above which the fake rejects an event, so
// that context-length failures of the synthetic traffic are rejected.
const rejectLimit = 100_000

// publish answers the n-th publish call.
func (f *fakeAPI) publish(w http.ResponseWriter, r *http.Request, n int) {
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		writeGatewayError(w, http.StatusBadRequest, 3, "content type "+ct)
		return
	}
	if n <= f.dropFirst {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			f.t.Errorf("hijack: %v", err)
			return
		}
		conn.Close()
		return
	}
	if n <= f.failFirst {
		writeGatewayError(w, http.StatusServiceUnavailable, 14, "event log unavailable: nothing of this batch was accepted; retry later")
		return
	}
	if f.status != 0 {
		writeGatewayError(w, f.status, 0, f.message)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		f.t.Errorf("read body: %v", err)
		return
	}
	var req meterv1.PublishEventsRequest
	if err := protojson.Unmarshal(body, &req); err != nil { // strict, like the gateway
		writeGatewayError(w, http.StatusBadRequest, 3, err.Error())
		return
	}
	resp := &meterv1.PublishEventsResponse{}
	for i, ev := range req.GetEvents() {
		if ev.GetPromptTokens() > rejectLimit {
			resp.Rejected = append(resp.Rejected, &meterv1.RejectedEvent{
				Index: int32(i), EventId: ev.GetEventId(),
				Reason: fmt.Sprintf("prompt_tokens (%d) exceeds the limit of %d", ev.GetPromptTokens(), rejectLimit),
			})
			continue
		}
		resp.Accepted++
	}
	f.mu.Lock()
	f.events = append(f.events, req.GetEvents()...)
	f.mu.Unlock()
	out, err := protojson.Marshal(resp)
	if err != nil {
		f.t.Errorf("marshal answer: %v", err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(out)
}

// got returns the publish calls and the events received so far.
func (f *fakeAPI) got() (requests int, events []*meterv1.InferenceEvent) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests, slices.Clone(f.events)
}

// runArgs runs meterctl with an empty environment plus env.
func runArgs(t *testing.T, env map[string]string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err = run(context.Background(), args, func(k string) string { return env[k] }, &out, &errOut)
	return out.String(), errOut.String(), err
}

// summaryValue returns the number after label in a replay summary.
func summaryValue(t *testing.T, out, label string) int {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		var v int
		if f := strings.Fields(line); len(f) >= 2 && f[0] == label {
			if _, err := fmt.Sscan(f[1], &v); err == nil {
				return v
			}
		}
	}
	t.Fatalf("no %q line in the summary:\n%s", label, out)
	return 0
}

func TestReplaySynthetic(t *testing.T) {
	f := &fakeAPI{}
	srv := newFakeAPI(t, f)
	const n = 5000
	// Address and key from the environment.
	env := map[string]string{"METER_ADDR": srv.URL, "METER_API_KEY": testKey}
	out, _, err := runArgs(t, env, "replay", "--synthetic", fmt.Sprint(n), "--batch", "300", "--concurrency", "3", "--seed", "9")
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	requests, events := f.got()
	if len(events) != n {
		t.Fatalf("server got %d events, want %d", len(events), n)
	}
	if want := (n + 299) / 300; requests != want {
		t.Errorf("%d requests, want %d batches", requests, want)
	}
	ids := map[string]bool{}
	wantRejected := 0
	now := time.Now()
	for _, ev := range events {
		if ids[ev.GetEventId()] {
			t.Fatalf("event %s sent twice", ev.GetEventId())
		}
		ids[ev.GetEventId()] = true
		if ev.GetPromptTokens() > rejectLimit {
			wantRejected++
		}
		if err := ingest.DefaultLimits().Validate(ev, now); err != nil {
			t.Errorf("event %s would be rejected by ingest: %v", ev.GetEventId(), err)
		}
		if at := ev.GetCompletedAt().AsTime(); at.Before(now.Add(-25*time.Hour)) || at.After(now) {
			t.Errorf("event %s completed at %s, want within the last 24h", ev.GetEventId(), at)
		}
	}
	if wantRejected == 0 {
		t.Fatal("no event above the fake's prompt limit: the test checks nothing about rejections")
	}
	if got := summaryValue(t, out, "sent"); got != n {
		t.Errorf("summary: sent %d, want %d\n%s", got, n, out)
	}
	if got := summaryValue(t, out, "accepted"); got != n-wantRejected {
		t.Errorf("summary: accepted %d, want %d\n%s", got, n-wantRejected, out)
	}
	if got := summaryValue(t, out, "rejected"); got != wantRejected {
		t.Errorf("summary: rejected %d, want %d\n%s", got, wantRejected, out)
	}
	// Rejections are grouped by reason, numbers aside: one group here.
	if c := strings.Count(out, "exceeds the limit of"); c != 1 {
		t.Errorf("summary shows %d reason lines, want 1 group:\n%s", c, out)
	}
}

func TestReplayRetries(t *testing.T) {
	tests := []struct {
		name string
		f    *fakeAPI
	}{
		{"503 twice", &fakeAPI{failFirst: 2}},
		{"connection dropped", &fakeAPI{dropFirst: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newFakeAPI(t, tt.f)
			out, stderr, err := runArgs(t, nil, "replay", "--addr", srv.URL, "--key", testKey,
				"--synthetic", "500", "--batch", "200", "--concurrency", "1")
			if err != nil {
				t.Fatalf("replay: %v", err)
			}
			retries := tt.f.failFirst + tt.f.dropFirst
			requests, events := tt.f.got()
			if want := 3 + retries; requests != want {
				t.Errorf("%d requests, want 3 batches + %d retries", requests, retries)
			}
			ids := map[string]bool{}
			for _, ev := range events {
				ids[ev.GetEventId()] = true
			}
			if len(ids) != 500 || len(events) != 500 {
				t.Errorf("server recorded %d events, %d distinct; want 500", len(events), len(ids))
			}
			if got := summaryValue(t, out, "retries"); got != retries {
				t.Errorf("summary: retries %d, want %d\n%s", got, retries, out)
			}
			if !strings.Contains(stderr, "retry 1/10") {
				t.Errorf("stderr does not report the retry:\n%s", stderr)
			}
		})
	}
}

func TestReplayStops(t *testing.T) {
	tests := []struct {
		name         string
		key          string
		f            *fakeAPI
		args         []string
		wantStatus   int
		wantRequests int
	}{
		{"401 unknown key", "tm_wrong", &fakeAPI{}, nil, http.StatusUnauthorized, 1},
		{"403 wrong role", testKey, &fakeAPI{status: http.StatusForbidden, message: "key may not publish"}, nil, http.StatusForbidden, 1},
		{"400 bad request", testKey, &fakeAPI{status: http.StatusBadRequest, message: "too many events"}, nil, http.StatusBadRequest, 1},
		{"413 too large", testKey, &fakeAPI{status: http.StatusRequestEntityTooLarge}, nil, http.StatusRequestEntityTooLarge, 1},
		{"503 beyond retries", testKey, &fakeAPI{failFirst: 100}, []string{"--retries", "2"}, http.StatusServiceUnavailable, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newFakeAPI(t, tt.f)
			args := append([]string{"replay", "--addr", srv.URL, "--key", tt.key,
				"--synthetic", "1000", "--batch", "100", "--concurrency", "1"}, tt.args...)
			out, _, err := runArgs(t, nil, args...)
			var ae *apiError
			if !errors.As(err, &ae) || ae.Status != tt.wantStatus {
				t.Fatalf("error %v, want an API error with status %d", err, tt.wantStatus)
			}
			if tt.f.status != 0 && ae.Message != tt.f.message {
				t.Errorf("error message %q, want the server's %q", ae.Message, tt.f.message)
			}
			if requests, _ := tt.f.got(); requests != tt.wantRequests {
				t.Errorf("%d requests, want %d: it must stop", requests, tt.wantRequests)
			}
			if got := summaryValue(t, out, "sent"); got != 0 {
				t.Errorf("summary: sent %d, want 0", got)
			}
		})
	}
	t.Run("401 message", func(t *testing.T) {
		srv := newFakeAPI(t, &fakeAPI{})
		_, _, err := runArgs(t, nil, "replay", "--addr", srv.URL, "--key", "tm_wrong", "--synthetic", "10")
		var ae *apiError
		if !errors.As(err, &ae) || ae.Message != "unknown API key" || ae.Code != 16 {
			t.Errorf("error %#v, want the gateway's code 16 and message", err)
		}
	})
}

func TestReplayAzure(t *testing.T) {
	trace := "TIMESTAMP,ContextTokens,GeneratedTokens\n" +
		"2023-11-16 18:15:46.6805900,374,44\n" +
		"2023-11-16 18:15:50.9951690,396,109\n" +
		"2023-11-16 18:15:51.2537980,879,55\n"
	path := filepath.Join(t.TempDir(), "trace.csv")
	if err := os.WriteFile(path, []byte(trace), 0o600); err != nil {
		t.Fatal(err)
	}
	f := &fakeAPI{}
	srv := newFakeAPI(t, f)
	before := time.Now()
	_, _, err := runArgs(t, nil, "replay", "--addr", srv.URL, "--key", testKey, "--azure", path, "--tenant", "acme")
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	_, events := f.got()
	if len(events) != 3 {
		t.Fatalf("server got %d events, want 3", len(events))
	}
	var last time.Time
	for _, ev := range events {
		if ev.GetTenantId() != "acme" {
			t.Errorf("tenant %q, want acme", ev.GetTenantId())
		}
		if at := ev.GetCompletedAt().AsTime(); at.After(last) {
			last = at
		}
	}
	if last.Before(before) || last.After(time.Now()) {
		t.Errorf("trace ends at %s, want it shifted to now (%s)", last, before)
	}

	bad := filepath.Join(t.TempDir(), "bad.csv")
	if err := os.WriteFile(bad, []byte(trace+"2023-11-16 18:15:52,x,1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	before3, _ := f.got()
	if _, _, err := runArgs(t, nil, "replay", "--addr", srv.URL, "--key", testKey, "--azure", bad); err == nil {
		t.Error("a malformed trace replayed without error")
	}
	if requests, _ := f.got(); requests != before3 {
		t.Errorf("%d requests for a malformed trace, want none: rows are checked first", requests-before3)
	}
}

func TestReplayRate(t *testing.T) {
	f := &fakeAPI{}
	srv := newFakeAPI(t, f)
	start := time.Now()
	_, _, err := runArgs(t, nil, "replay", "--addr", srv.URL, "--key", testKey,
		"--synthetic", "300", "--rate", "1000", "--batch", "100")
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	// Three batches of 100 at 1000 events/s: the last leaves at 300ms.
	if d := time.Since(start); d < 290*time.Millisecond {
		t.Errorf("300 events at 1000/s took %s, want at least 300ms", d)
	}
	if _, events := f.got(); len(events) != 300 {
		t.Errorf("server got %d events, want 300", len(events))
	}
}

func TestReplayConfig(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr bool
	}{
		{"ok", []string{"--synthetic", "10", "--key", "k"}, false},
		{"nothing to replay", []string{"--key", "k"}, true},
		{"both sources", []string{"--synthetic", "10", "--azure", "x.csv", "--key", "k"}, true},
		{"no key", []string{"--synthetic", "10"}, true},
		{"negative rate", []string{"--synthetic", "10", "--key", "k", "--rate", "-1"}, true},
		{"huge batch", []string{"--synthetic", "10", "--key", "k", "--batch", "20000"}, true},
		{"no concurrency", []string{"--synthetic", "10", "--key", "k", "--concurrency", "0"}, true},
		{"tenant without azure", []string{"--synthetic", "10", "--key", "k", "--tenant", "acme"}, true},
		{"bad addr", []string{"--synthetic", "10", "--key", "k", "--addr", "ftp://x"}, true},
		{"stray argument", []string{"--synthetic", "10", "--key", "k", "extra"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, _, err := runArgs(t, nil, append([]string{"replay", "--validate"}, tt.args...)...)
			if (err != nil) != tt.wantErr {
				t.Errorf("error %v, want error: %v", err, tt.wantErr)
			}
			if err == nil && !strings.Contains(out, "configuration ok") {
				t.Errorf("--validate printed %q", out)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{nil, {"help"}} {
		out, _, err := runArgs(t, nil, args...)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		for _, cmd := range []string{"replay", "usage", "keys new"} {
			if !strings.Contains(out, cmd) {
				t.Errorf("%v: help does not list %q:\n%s", args, cmd, out)
			}
		}
	}
	for cmd, flagName := range map[string]string{"replay": "-synthetic", "usage": "-group-by", "keys": "-role"} {
		_, stderr, err := runArgs(t, nil, "help", cmd)
		if err != nil {
			t.Errorf("help %s: %v", cmd, err)
		}
		if !strings.Contains(stderr, flagName) {
			t.Errorf("help %s does not show %s:\n%s", cmd, flagName, stderr)
		}
	}
	if _, _, err := runArgs(t, nil, "frobnicate"); err == nil {
		t.Error("an unknown command ran without error")
	}
}
