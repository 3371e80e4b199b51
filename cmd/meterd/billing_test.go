package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/billing/notify"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

func TestBillingFlags(t *testing.T) {
	dev := []string{"--dev", "--data-dir", "d"}
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr []string
	}{
		{"zones", []string{"--billing-zones", "acme=Asia/Kolkata, beta=+05:30,gamma=UTC", "--billing-grace", "36h", "--billing-by-deployment"}, nil, nil},
		{"zones from the environment", nil, map[string]string{"METER_BILLING_ZONES": "acme=-08:00"}, nil},
		{"bad zones", []string{"--billing-zones", "acme,beta=Mars/Base,gamma=+15:00,acme=UTC,bad\u200btenant=UTC"}, nil,
			[]string{`"acme": want tenant=zone`, `tenant "beta"`, "Mars/Base", `tenant "gamma"`, "±14:00", "tenant_id"}},
		{"duplicate tenant", []string{"--billing-zones", "acme=UTC,acme=+01:00"}, nil, []string{`tenant "acme" is given twice`}},
		{"grace", []string{"--billing-grace", "0s"}, nil, []string{"--billing-grace 0s: must be positive"}},
		{"events", []string{"--billing-events-topic", "meter.billing.v1", "--billing-webhook-url", "https://erp.example.com/hooks?token=x"},
			map[string]string{"METER_BILLING_WEBHOOK_SECRET": "whsec"}, nil},
		{"webhook without a secret", []string{"--billing-webhook-url", "https://erp.example.com/hooks"}, nil, []string{"needs a signing secret"}},
		{"bad webhook", []string{"--billing-webhook-url", "erp.example.com/hooks", "--billing-webhook-timeout", "0s", "--billing-events-max-backoff", "10ms"},
			map[string]string{"METER_BILLING_WEBHOOK_SECRET": "whsec"},
			[]string{"want an absolute http or https URL", "--billing-webhook-timeout 0s", "--billing-events-max-backoff 10ms"}},
		{"events without the api role", []string{"--role", "ingest,rollup", "--billing-events-topic", "t"}, nil, []string{"the api role's"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkParse(t, append(tt.args, dev...), tt.env, tt.wantErr)
		})
	}
	cfg, err := parseConfig([]string{"--dev", "--data-dir", "d", "--billing-zones", "acme=Asia/Kolkata,beta=+05:30"}, func(string) string { return "" }, nil)
	if err != nil {
		t.Fatal(err)
	}
	zones, err := cfg.billingZones()
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	for tenant, want := range map[string]int{"acme": 19800, "beta": 19800} {
		if _, off := at.In(zones[tenant]).Zone(); off != want {
			t.Errorf("%s's offset %d s, want %d", tenant, off, want)
		}
	}
	if cfg.BillingGrace != 24*time.Hour {
		t.Errorf("default grace %s, want 24h", cfg.BillingGrace)
	}
}

// TestDevServesBilling checks that meterd's api role serves the billing
// service: a malformed period is the service's 400, and the usage-and-cost
// export of the last hours streams a CSV file.
func TestDevServesBilling(t *testing.T) {
	m := startDev(t)
	fin := m.key(t, "finance")
	code, body, err := m.do("GET", "/v1/billing/statements/2026-13?tenant_id=acme", fin, nil)
	if err != nil || code != 400 || !strings.Contains(string(body), "2026-13") {
		t.Errorf("statement of 2026-13: %d %s %v, want 400 naming the period", code, body, err)
	}
	end := time.Now().UTC().Truncate(time.Hour)
	q := url.Values{"start": {end.Add(-2 * time.Hour).Format(time.RFC3339)}, "end": {end.Format(time.RFC3339)}, "format": {"csv"}}
	code, body, err = m.do("GET", "/v1/billing/usage-cost/export?"+q.Encode(), fin, nil)
	if err != nil || code != 200 || !strings.HasPrefix(string(body), "charge_period_start,") {
		t.Errorf("usage-cost export: %d %q %v, want a CSV file", code, body, err)
	}
}

// TestDevClosesPeriod closes a month on the real meterd --dev: the close
// checks the ingest consumer groups' lag on the embedded broker and takes
// the Kafka lock; late events of the closed month leave its statement
// byte-identical and become adjustment lines of the next close.
//
// With --billing-events-topic (from the environment, as the binary reads
// it), each close's statements are records on the topic of the embedded
// broker, keyed tenant/period, the statement's hash as idempotency key.
func TestDevClosesPeriod(t *testing.T) {
	t.Setenv("METER_BILLING_EVENTS_TOPIC", notify.DefaultTopic)
	m := startDev(t)
	sep := time.Date(2026, 9, 10, 12, 0, 0, 0, time.UTC)
	publish := func(prefix string, n int) {
		t.Helper()
		var req meterv1.PublishEventsRequest
		for i := range n {
			req.Events = append(req.Events, &meterv1.InferenceEvent{
				EventId: fmt.Sprintf("%s-%d", prefix, i), TenantId: []string{"acme", "globex"}[i%2], Model: "m", Deployment: "d",
				CompletedAt:  timestamppb.New(sep.Add(time.Duration(i) * time.Minute)),
				PromptTokens: proto.Int64(int64(100 + i)), OutputTokens: proto.Int64(10),
				TtftMs: proto.Float64(5), E2EMs: proto.Float64(50),
			})
		}
		body, _ := protojson.Marshal(&req)
		if code, out, err := m.do("POST", "/v1/events", m.key(t, "ingest"), body); err != nil || code != 200 {
			t.Fatalf("publish: %d %s %v", code, out, err)
		}
	}
	closePeriod := func(period string) []byte {
		t.Helper()
		var code int
		var body []byte
		var err error
		// 409 while the rollup job has not costed the inserts yet.
		for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
			code, body, err = m.do("POST", "/v1/billing/periods/"+period+":close", m.key(t, "admin"), []byte(`{"tenant_ids": ["acme", "globex"], "flag_unpriced": true}`))
			if err == nil && code != http.StatusConflict {
				break
			}
		}
		if err != nil || code != 200 {
			t.Fatalf("close %s: %d %s %v\nlog:\n%s", period, code, body, err, m.log)
		}
		return body
	}
	statement := func(period string) []byte {
		t.Helper()
		code, body, err := m.do("GET", "/v1/billing/statements/"+period+"?tenant_id=acme", m.key(t, "tenant-acme"), nil)
		if err != nil || code != 200 {
			t.Fatalf("statement %s: %d %s %v", period, code, body, err)
		}
		return body
	}

	publish("e", 40)
	m.waitUsage(t, sep, sep.Add(time.Hour), 40)
	if code, body, _ := m.do("POST", "/v1/billing/periods/2026-09:close", m.key(t, "finance"), nil); code != http.StatusForbidden {
		t.Errorf("finance closes: %d %s, want 403", code, body)
	}
	closed := closePeriod("2026-09")
	first := statement("2026-09")
	var st struct {
		Statement struct {
			Hash   string `json:"hash"`
			Closed bool   `json:"closed"`
			Lines  []struct {
				Kind     string `json:"kind"`
				Requests string `json:"requests"`
				Input    string `json:"input_tokens"`
			} `json:"lines"`
		} `json:"statement"`
	}
	if err := json.Unmarshal(first, &st); err != nil {
		t.Fatal(err)
	}
	if !st.Statement.Closed || st.Statement.Hash == "" || !bytes.Contains(closed, []byte(st.Statement.Hash)) ||
		len(st.Statement.Lines) != 1 || st.Statement.Lines[0].Requests != "20" {
		t.Fatalf("acme's September: %s (close answered %s)", first, closed)
	}

	events := billingEvents(t, m.kafka, 2)
	if ev := events["acme/2026-09"]; ev.ID != st.Statement.Hash || ev.Type != notify.TypeClosed || ev.Invoice == nil {
		t.Errorf("acme's September event %+v, want statement.closed of %s with its invoice", ev, st.Statement.Hash)
	}
	if _, ok := events["globex/2026-09"]; !ok {
		t.Errorf("events %v: none of globex's September", events)
	}

	// Late events of September: 6 more, 3 of them acme's.
	publish("late", 6)
	m.waitUsage(t, sep, sep.Add(time.Hour), 46)
	if again := statement("2026-09"); !bytes.Equal(again, first) {
		t.Errorf("late events changed the closed statement:\n%s\n%s", first, again)
	}
	closePeriod("2026-10")
	if err := json.Unmarshal(statement("2026-10"), &st); err != nil {
		t.Fatal(err)
	}
	// The late events are e-0..e-5 again under other ids: acme's are
	// late-0, late-2, late-4 with 100, 102 and 104 input tokens.
	if len(st.Statement.Lines) != 1 || st.Statement.Lines[0].Kind != "adjustment" || st.Statement.Lines[0].Requests != "3" || st.Statement.Lines[0].Input != "306" {
		t.Errorf("acme's October: %+v, want one adjustment of 3 requests and 306 input tokens", st.Statement.Lines)
	}
}

// billingEvents reads the first n records of the billing events topic, by
// key.
func billingEvents(t *testing.T, broker string, n int) map[string]notify.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{broker}, Topic: notify.DefaultTopic, GroupID: "test-billing-events",
		StartOffset: kafka.FirstOffset, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	out := map[string]notify.Event{}
	for range n {
		msg, err := r.FetchMessage(ctx)
		if err != nil {
			t.Fatalf("billing events: %d of %d: %v", len(out), n, err)
		}
		var ev notify.Event
		if err := json.Unmarshal(msg.Value, &ev); err != nil {
			t.Fatalf("billing event %s: %v", msg.Value, err)
		}
		out[string(msg.Key)] = ev
	}
	return out
}
