package notify_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"tokenmeter/billing/notify"
	"tokenmeter/internal/adapter/chstore/chstoretest"
)

// renamed is a sink under another name: a delivery state of its own.
type renamed struct {
	notify.Sink
	name string
}

func (r renamed) Name() string { return r.name }

// BenchmarkDeliver1000 measures one delivery of the events of 1,000
// statements closed at once (a month-end close of 1,000 tenants): read
// from ClickHouse, made into events and sent, to the dev broker (one
// request per pass of 500) and to a local webhook (a POST each).
func BenchmarkDeliver1000(b *testing.B) {
	store := chstoretest.OpenMigrated(b)
	now, err := store.ServerNow(b.Context())
	if err != nil {
		b.Fatal(err)
	}
	for i := range 1000 {
		saveStatement(b, store, fmt.Sprintf("t%04d", i), now)
	}
	broker, err := startBrokerTB(b)
	if err != nil {
		b.Fatal(err)
	}
	kafkaSink, err := notify.NewKafkaSink(notify.KafkaConfig{Brokers: []string{broker}, Topic: topic})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { kafkaSink.Close() })
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	b.Cleanup(srv.Close)
	webhook, err := notify.NewWebhookSink(notify.WebhookConfig{URL: srv.URL, Secret: []byte("s")})
	if err != nil {
		b.Fatal(err)
	}
	for _, sink := range []notify.Sink{kafkaSink, webhook} {
		kind, _, _ := strings.Cut(sink.Name(), ":")
		b.Run(kind, func(b *testing.B) {
			for i := range b.N {
				s := renamed{sink, fmt.Sprintf("%s-%d-%d", sink.Name(), time.Now().UnixNano(), i)}
				n, err := notify.New(notify.Config{Settle: -1}, store, []notify.Sink{s}, prometheus.NewRegistry(), quiet)
				if err != nil {
					b.Fatal(err)
				}
				if err := n.Deliver(b.Context()); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "µs/statement")
		})
	}
}
