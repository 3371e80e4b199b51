package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// TestDevEventIDCountedOnce publishes events of September to a real
// meterd --dev, kills it with SIGKILL, restarts it, and publishes the same
// ids again: equal copies, copies completed two hours later, copies
// completed in October, and copies with other tokens. Usage of September,
// of October and of both, cost, and the statements of both months count
// each event once, as its first copy; October's statement has no
// adjustment. Before the event id index, the copies in another hour were
// stored and counted in their own hour and month, and October's statement
// billed them as an adjustment.
func TestDevEventIDCountedOnce(t *testing.T) {
	m := startDev(t)
	sep := time.Date(2026, 9, 10, 12, 0, 0, 0, time.UTC)
	oct := time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)
	const n = 40
	event := func(i int) *meterv1.InferenceEvent {
		return &meterv1.InferenceEvent{
			EventId: fmt.Sprintf("e-%d", i), TenantId: []string{"acme", "globex"}[i%2], Model: "m", Deployment: "d",
			CompletedAt:  timestamppb.New(sep.Add(time.Duration(i) * time.Minute)),
			PromptTokens: proto.Int64(int64(100 + i)), OutputTokens: proto.Int64(10),
			TtftMs: proto.Float64(5), E2EMs: proto.Float64(50),
		}
	}
	publish := func(events []*meterv1.InferenceEvent) {
		t.Helper()
		body, _ := protojson.Marshal(&meterv1.PublishEventsRequest{Events: events})
		code, out, err := m.do("POST", "/v1/events", m.key(t, "ingest"), body)
		if err != nil || code != http.StatusOK || !bytes.Contains(out, []byte(fmt.Sprintf(`"accepted":"%d"`, len(events)))) {
			t.Fatalf("publish: %d %s %v", code, out, err)
		}
	}
	var first []*meterv1.InferenceEvent
	var acmeInput int64
	for i := range n {
		first = append(first, event(i))
		if i%2 == 0 {
			acmeInput += int64(100 + i)
		}
	}
	publish(first)
	m.waitUsage(t, sep, oct, n)

	// Crash, restart, and the copies.
	m.cmd.Process.Kill()
	m.cmd.Wait()
	m.start(t)
	var copies []*meterv1.InferenceEvent
	for i := range n {
		c := event(i)
		switch i % 4 {
		case 1:
			c.CompletedAt = timestamppb.New(sep.Add(time.Duration(i)*time.Minute + 2*time.Hour))
		case 2:
			c.CompletedAt = timestamppb.New(oct.Add(time.Duration(i) * time.Hour))
		case 3:
			c.OutputTokens = proto.Int64(999)
		}
		copies = append(copies, c)
	}
	publish(copies)
	// Markers published after the copies, keyed like them onto every
	// partition: once they are counted, the copies before them have been
	// through the consumer.
	var markers []*meterv1.InferenceEvent
	for i := range 24 {
		markers = append(markers, &meterv1.InferenceEvent{EventId: fmt.Sprintf("marker-%d", i), TenantId: "initech", Model: "m", Deployment: "d",
			CompletedAt: timestamppb.New(oct.Add(24*time.Hour + time.Duration(i)*time.Second)), PromptTokens: proto.Int64(1), OutputTokens: proto.Int64(1),
			TtftMs: proto.Float64(5), E2EMs: proto.Float64(50)})
	}
	publish(markers)
	m.waitUsage(t, oct, oct.AddDate(0, 1, 0), len(markers))
	m.waitUsage(t, sep, oct.AddDate(0, 1, 0), n+len(markers))

	usage := func(from, to time.Time, tenant string) string {
		t.Helper()
		q := fmt.Sprintf("/v1/usage?start=%s&end=%s&tenant_id=%s", from.Format(time.RFC3339), to.Format(time.RFC3339), tenant)
		code, body, err := m.do("GET", q, m.key(t, "finance"), nil)
		if err != nil || code != http.StatusOK {
			t.Fatalf("usage: %d %s %v", code, body, err)
		}
		var u struct {
			Rows []struct {
				Requests string `json:"requests"`
				Prompt   string `json:"prompt_tokens"`
				Output   string `json:"output_tokens"`
			} `json:"buckets"`
		}
		if err := json.Unmarshal(body, &u); err != nil {
			t.Fatal(err)
		}
		if len(u.Rows) == 0 {
			return "none"
		}
		return fmt.Sprintf("%s requests, %s prompt, %s output", u.Rows[0].Requests, u.Rows[0].Prompt, u.Rows[0].Output)
	}
	wantAcme := fmt.Sprintf("%d requests, %d prompt, %d output", n/2, acmeInput, 10*n/2)
	for _, c := range []struct {
		name     string
		from, to time.Time
		want     string
	}{
		{"september", sep.AddDate(0, 0, -9), oct, wantAcme},
		{"october", oct, oct.AddDate(0, 1, 0), "none"},
		{"both", sep.AddDate(0, 0, -9), oct.AddDate(0, 1, 0), wantAcme},
	} {
		if got := usage(c.from, c.to, "acme"); got != c.want {
			t.Errorf("acme's usage of %s: %s, want %s", c.name, got, c.want)
		}
	}

	// Cost over the rollups counts the same requests (no GPU samples: as
	// unattributed requests).
	var cost []byte
	wantReq := fmt.Sprintf(`"unattributed_requests":"%d"`, n/2)
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		q := fmt.Sprintf("/v1/cost?start=%s&end=%s&tenant_id=acme", sep.AddDate(0, 0, -9).Format(time.RFC3339), oct.AddDate(0, 1, 0).Format(time.RFC3339))
		code, body, _ := m.do("GET", q, m.key(t, "finance"), nil)
		cost = body
		if code == http.StatusOK && bytes.Contains(body, []byte(wantReq)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cost %s, want %s", cost, wantReq)
		}
	}

	// The statements: September bills each event once, October nothing.
	closePeriod := func(period string) {
		t.Helper()
		var code int
		var body []byte
		for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
			code, body, _ = m.do("POST", "/v1/billing/periods/"+period+":close", m.key(t, "admin"), []byte(`{"tenant_ids": ["acme", "globex"], "flag_unpriced": true}`)) // the dev meterd has no price for m
			if code != http.StatusConflict {
				break
			}
		}
		if code != http.StatusOK {
			t.Fatalf("close %s: %d %s\nlog:\n%s", period, code, body, m.log)
		}
	}
	type statement struct {
		Statement struct {
			Lines []struct {
				Kind     string `json:"kind"`
				Requests string `json:"requests"`
				Input    string `json:"input_tokens"`
				Output   string `json:"output_tokens"`
			} `json:"lines"`
		} `json:"statement"`
	}
	read := func(period string) statement {
		t.Helper()
		code, body, err := m.do("GET", "/v1/billing/statements/"+period+"?tenant_id=acme", m.key(t, "tenant-acme"), nil)
		if err != nil || code != http.StatusOK {
			t.Fatalf("statement %s: %d %s %v", period, code, body, err)
		}
		var st statement
		if err := json.Unmarshal(body, &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	closePeriod("2026-09")
	closePeriod("2026-10")
	sepSt, octSt := read("2026-09"), read("2026-10")
	if l := sepSt.Statement.Lines; len(l) != 1 || l[0].Requests != fmt.Sprint(n/2) || l[0].Input != fmt.Sprint(acmeInput) || l[0].Output != fmt.Sprint(10*n/2) {
		t.Errorf("acme's September: %+v, want one line of %d requests, %d input and %d output tokens", l, n/2, acmeInput, 10*n/2)
	}
	if l := octSt.Statement.Lines; len(l) != 0 {
		t.Errorf("acme's October: %+v, want no line (the copies are not billed)", l)
	}
}
