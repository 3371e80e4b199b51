package notify_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"tokenmeter/billing"
	"tokenmeter/billing/notify"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	"tokenmeter/internal/testkit/chtest"
)

// hookServer is a webhook that answers each event by its tenant: the
// code answer says (200 when it says nothing), counting the requests per
// tenant.
type hookServer struct {
	mu       sync.Mutex
	requests map[string]int
	answer   func(tenant string) int
}

func newHookServer(t *testing.T, answer func(tenant string) int) (*hookServer, *httptest.Server) {
	h := &hookServer{requests: map[string]int{}, answer: answer}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var ev notify.Event
		if err := json.Unmarshal(body, &ev); err != nil {
			w.WriteHeader(http.StatusUnprocessableEntity)
			return
		}
		h.mu.Lock()
		h.requests[ev.Tenant]++
		answer := h.answer
		h.mu.Unlock()
		w.WriteHeader(answer(ev.Tenant))
	}))
	t.Cleanup(srv.Close)
	return h, srv
}

// count is how many requests tenant's events got.
func (h *hookServer) count(tenant string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.requests[tenant]
}

// logRecords is a slog handler that keeps the records' messages and
// attributes.
type logRecords struct {
	mu   sync.Mutex
	recs []map[string]string
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecords) WithGroup(string) slog.Handler            { return l }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	m := map[string]string{"msg": r.Message, "level": r.Level.String()}
	r.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value.String()
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, m)
	return nil
}

// deadLetterLogs are the records that give an event up.
func (l *logRecords) deadLetterLogs() []map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]string
	for _, r := range l.recs {
		if strings.Contains(r["msg"], "dead letter") {
			out = append(out, r)
		}
	}
	return out
}

// TestWebhookRefusalDoesNotHoldBackOthers: a webhook that answers 400 to
// the event of one statement, closed first, and 200 to the others gets the
// others in the same pass. The refused event is tried again on each pass
// until its third refusal in a row (DeadLetterAttempts) makes it a dead
// letter: recorded in statement_dead_letters with its reason, counted,
// logged once with tenant, period and hash, and not tried again by this
// Notifier; a restart (another Notifier) tries it again, and so does
// Redeliver, which delivers it once the receiver takes it.
func TestWebhookRefusalDoesNotHoldBackOthers(t *testing.T) {
	store := chstoretest.OpenMigrated(t)
	now, err := store.ServerNow(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	bad := saveStatement(t, store, "bad", now.Add(-2*time.Second))
	saveStatement(t, store, "acme", now.Add(-time.Second))
	saveStatement(t, store, "beta", now)
	var refuse sync.Map
	refuse.Store("bad", true)
	hook, srv := newHookServer(t, func(tenant string) int {
		if _, ok := refuse.Load(tenant); ok {
			return http.StatusBadRequest
		}
		return http.StatusOK
	})
	sink, err := notify.NewWebhookSink(notify.WebhookConfig{URL: srv.URL, Secret: []byte("s")})
	if err != nil {
		t.Fatal(err)
	}
	logs := &logRecords{}
	reg := prometheus.NewRegistry()
	// Deliver only (no Run): each call is one pass, trying every event
	// not given up on.
	cfg := notify.Config{Settle: -1, DeadLetterAttempts: 3}
	n, err := notify.New(cfg, store, []notify.Sink{sink}, reg, slog.New(logs))
	if err != nil {
		t.Fatal(err)
	}
	err = n.Deliver(t.Context())
	if err == nil || !strings.Contains(err.Error(), "400") {
		t.Errorf("first pass: %v, want the refusal of bad's event", err)
	}
	if hook.count("acme") != 1 || hook.count("beta") != 1 || hook.count("bad") != 1 {
		t.Fatalf("after one pass the webhook got acme %d, beta %d, bad %d events; want one each",
			hook.count("acme"), hook.count("beta"), hook.count("bad"))
	}
	if d := metric(t, reg, "meter_billing_events_delivered_total", sink.Name()); d != 2 {
		t.Errorf("delivered %v, want 2", d)
	}
	for range 2 {
		if err := n.Deliver(t.Context()); err == nil {
			t.Error("a pass delivered the refused event")
		}
	}
	if got := hook.count("bad"); got != 3 {
		t.Errorf("bad's event sent %d times, want 3 (then given up)", got)
	}
	if got := metric(t, reg, "meter_billing_events_dead_lettered_total", sink.Name()); got != 1 {
		t.Errorf("dead-lettered counter %v, want 1", got)
	}
	if err := n.Deliver(t.Context()); err != nil {
		t.Errorf("a pass after the dead letter: %v, want nothing tried", err)
	}
	if got := hook.count("bad"); got != 3 || hook.count("acme") != 1 || hook.count("beta") != 1 {
		t.Errorf("after the dead letter the webhook got bad %d, acme %d, beta %d events; want 3, 1, 1", got, hook.count("acme"), hook.count("beta"))
	}
	logged := logs.deadLetterLogs()
	if len(logged) != 1 || logged[0]["tenant"] != "bad" || logged[0]["period"] != "2026-11" || logged[0]["hash"] != bad.Hash || logged[0]["level"] != "ERROR" {
		t.Errorf("dead letter logs %v, want one error naming bad, 2026-11 and %s", logged, bad.Hash)
	}
	dead, err := store.StatementDeadLetters(t.Context(), sink.Name())
	if err != nil || len(dead) != 1 || dead[0].Tenant != "bad" || dead[0].Hash != bad.Hash || dead[0].Attempts != 3 || !strings.Contains(dead[0].Reason, "400") {
		t.Errorf("recorded dead letters %+v (%v), want bad's after 3 refusals", dead, err)
	}
	if left, err := store.UndeliveredStatements(t.Context(), sink.Name(), time.Time{}, nil, 10); err != nil || len(left) != 1 || left[0].Tenant != "bad" {
		t.Errorf("undelivered %v (%v), want bad's only", left, err)
	}

	// A restart tries it again (and gives up again).
	restarted, err := notify.New(cfg, store, []notify.Sink{sink}, prometheus.NewRegistry(), quiet)
	if err != nil {
		t.Fatal(err)
	}
	if err := restarted.Deliver(t.Context()); err == nil || hook.count("bad") != 4 {
		t.Errorf("after a restart: %v, bad's event sent %d times; want the 4th refused", err, hook.count("bad"))
	}
	// Redeliver, once the receiver takes it, delivers it.
	refuse.Delete("bad")
	if got := n.Redeliver("bad", "2026-11"); got != 1 {
		t.Errorf("redeliver revived %d dead letters, want 1", got)
	}
	if err := n.Deliver(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := hook.count("bad"); got != 5 {
		t.Errorf("bad's event sent %d times, want 5", got)
	}
	if left, err := store.UndeliveredStatements(t.Context(), sink.Name(), time.Time{}, nil, 10); err != nil || len(left) != 0 {
		t.Errorf("undelivered after the redelivery: %v, %v", left, err)
	}
	if dead, err := store.StatementDeadLetters(t.Context(), sink.Name()); err != nil || len(dead) != 0 {
		t.Errorf("dead letters after the redelivery: %+v, %v", dead, err)
	}
}

// TestWebhookFailingEventDoesNotStarveOthers: with Run's own passes and
// backoffs, an event the webhook answers 500 to for ever (or whose POST
// gets no answer in time) is retried after its backoff and never given
// up on, and does not keep the statements closed after it from being
// delivered, even when told of later.
func TestWebhookFailingEventDoesNotStarveOthers(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer int // 0: none within the timeout
	}{{"500", http.StatusInternalServerError}, {"no answer", 0}, {"503", http.StatusServiceUnavailable}} {
		t.Run(tc.name, func(t *testing.T) {
			store := chstoretest.OpenMigrated(t)
			now, err := store.ServerNow(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			stuck := saveStatement(t, store, "stuck", now.Add(-time.Second))
			first := saveStatement(t, store, "acme", now)
			release := make(chan struct{})
			hook, srv := newHookServer(t, func(tenant string) int {
				if tenant != "stuck" {
					return http.StatusOK
				}
				if tc.answer == 0 {
					<-release
				}
				return tc.answer
			})
			t.Cleanup(func() { close(release) }) // before the server closes
			sink, err := notify.NewWebhookSink(notify.WebhookConfig{URL: srv.URL, Secret: []byte("s"), Timeout: 100 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			reg := prometheus.NewRegistry()
			n, err := notify.New(notify.Config{Rescan: time.Hour, MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond, DeadLetterAttempts: 1},
				store, []notify.Sink{sink}, reg, quiet)
			if err != nil {
				t.Fatal(err)
			}
			run(t, n)
			n.Closed([]billing.StoredStatement{stuck, first})
			waitFor(t, func() bool { return hook.count("acme") == 1 && hook.count("stuck") >= 3 })
			later := saveStatement(t, store, "later", now)
			n.Closed([]billing.StoredStatement{later})
			waitFor(t, func() bool { return hook.count("later") == 1 })
			if got := metric(t, reg, "meter_billing_events_dead_lettered_total", sink.Name()); got != 0 {
				t.Errorf("dead-lettered %v, want 0: a transient failure is never given up on", got)
			}
		})
	}
}

// waitFor waits up to a minute for cond.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("not within a minute")
		}
	}
}

// TestCorruptStatementDoesNotStopOthers: a stored statement whose JSON
// does not decode, closed before the others, cannot be made into an
// event; the topic gets the others' records in the same pass, and after
// DeadLetterAttempts passes the corrupt one is a dead letter (counted,
// recorded, logged once), and later passes neither fail nor log it again.
func TestCorruptStatementDoesNotStopOthers(t *testing.T) {
	addr, db := chtest.NewDB(t)
	store, err := chstore.Open(chstore.Config{Addr: []string{addr}, Database: db}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	if _, err := store.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	now, err := store.ServerNow(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// The corrupt row, as no close writes it (cut short).
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{addr}, Auth: clickhouse.Auth{Database: db}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	p, err := billing.ParsePeriod("2026-11", time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.Exec(t.Context(), fmt.Sprintf(`INSERT INTO statements (tenant_id, period, zone, period_start, period_end, hash, content, closed_at)
SELECT 'corrupt', '2026-11', 'UTC', toDateTime(%d), toDateTime(%d), 'c0ffee', '{"tenant":"corrupt","lines":[{', toDateTime(%d)`,
		p.Start.Unix(), p.End.Unix(), now.Add(-2*time.Second).Unix())); err != nil {
		t.Fatal(err)
	}
	sts := []billing.StoredStatement{saveStatement(t, store, "acme", now.Add(-time.Second)), saveStatement(t, store, "beta", now)}
	broker := startBroker(t)
	sink, err := notify.NewKafkaSink(notify.KafkaConfig{Brokers: []string{broker}, Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close() })
	reg := prometheus.NewRegistry()
	logs := &logRecords{}
	n, err := notify.New(notify.Config{Settle: -1, DeadLetterAttempts: 2}, store, []notify.Sink{sink}, reg, slog.New(logs))
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Deliver(t.Context()); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Errorf("first pass: %v, want the corrupt statement's failure", err)
	}
	msgs := records(t, broker, 2)
	slices.SortFunc(msgs, func(a, b kafka.Message) int { return bytes.Compare(a.Key, b.Key) })
	for i, st := range sts {
		wantEvent(t, store, st, msgs[i].Value)
	}
	if got := metric(t, reg, "meter_billing_events_dead_lettered_total", sink.Name()); got != 0 {
		t.Errorf("dead-lettered after one failure: %v, want 0", got)
	}
	if err := n.Deliver(t.Context()); err == nil {
		t.Error("second pass made the corrupt statement's event")
	}
	if got := metric(t, reg, "meter_billing_events_dead_lettered_total", sink.Name()); got != 1 {
		t.Errorf("dead-lettered counter %v, want 1", got)
	}
	for range 2 {
		if err := n.Deliver(t.Context()); err != nil {
			t.Errorf("a pass after the dead letter: %v", err)
		}
	}
	if got := metric(t, reg, "meter_billing_events_dead_lettered_total", sink.Name()); got != 1 {
		t.Errorf("dead-lettered counter %v after more passes, want 1", got)
	}
	if logged := logs.deadLetterLogs(); len(logged) != 1 || logged[0]["tenant"] != "corrupt" || logged[0]["hash"] != "c0ffee" || logged[0]["period"] != "2026-11" {
		t.Errorf("dead letter logs %v, want one naming corrupt, 2026-11, c0ffee", logged)
	}
	dead, err := store.StatementDeadLetters(t.Context(), sink.Name())
	if err != nil || len(dead) != 1 || dead[0].Tenant != "corrupt" || dead[0].Attempts != 2 {
		t.Errorf("recorded dead letters %+v (%v), want corrupt's", dead, err)
	}
	if got := recordCount(t, broker); got != 2 {
		t.Errorf("topic holds %d records, want 2", got)
	}
}
