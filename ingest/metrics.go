package ingest

import (
	"github.com/prometheus/client_golang/prometheus"
)

// consumerMetrics are the consumer's Prometheus series.
type consumerMetrics struct {
	consumed       prometheus.Counter
	inserted       prometheus.Counter
	rejected       *prometheus.CounterVec
	dlq            prometheus.Counter
	deadLetters    *prometheus.CounterVec
	batchSize      prometheus.Histogram
	insertDuration prometheus.Histogram
	insertErrors   prometheus.Counter
	commitErrors   prometheus.Counter
	lag            prometheus.Gauge
	duplicates     prometheus.Counter
}

func newConsumerMetrics(reg prometheus.Registerer) (*consumerMetrics, error) {
	m := &consumerMetrics{
		consumed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meter_ingest_events_consumed_total", Help: "Event records fetched from Kafka.",
		}),
		inserted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meter_ingest_events_inserted_total", Help: "Event rows inserted into ClickHouse (redeliveries included).",
		}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meter_ingest_events_rejected_total", Help: "Event records rejected, by reason code.",
		}, []string{"reason"}),
		dlq: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meter_ingest_dlq_records_total", Help: "Records written to the dead-letter topic (bounded copies and minimal records).",
		}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meter_ingest_dead_letters_total",
			Help: "Rejected records made durable, by outcome: dlq (bounded copy in the DLQ topic), dlq_minimal (the topic refused that copy; a record without payload), table (the topic refused both or stayed unreachable; a row of ClickHouse table dead_letters).",
		}, []string{"outcome"}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "meter_ingest_batch_size_events", Help: "Records per flushed batch.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 10),
		}),
		insertDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "meter_ingest_insert_duration_seconds", Help: "Duration of successful ClickHouse batch inserts.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
		insertErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meter_ingest_insert_errors_total", Help: "Failed ClickHouse insert attempts (each is retried).",
		}),
		commitErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meter_ingest_commit_errors_total", Help: "Failed offset commits (the batch will be redelivered and deduplicated).",
		}),
		lag: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meter_ingest_consumer_lag_messages", Help: "Messages between the consumer's position and the partition end, as last reported by the reader.",
		}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meter_ingest_duplicates_dropped_total",
			Help: "Event records equal to the stored copy of their event (or to an earlier record of the batch): retries and redeliveries, not stored again. Copies that differ are rejected with reason duplicate_conflict.",
		}),
	}
	for _, c := range []prometheus.Collector{m.consumed, m.inserted, m.rejected, m.dlq, m.deadLetters, m.batchSize, m.insertDuration, m.insertErrors, m.commitErrors, m.lag, m.duplicates} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, r := range []string{ReasonMissingField, ReasonInvalidValue, ReasonOutOfRange, ReasonDecode, ReasonOversized, ReasonDuplicateConflict} {
		m.rejected.WithLabelValues(r)
	}
	for _, o := range []string{OutcomeDLQ, OutcomeDLQMinimal, OutcomeTable} {
		m.deadLetters.WithLabelValues(o)
	}
	return m, nil
}
