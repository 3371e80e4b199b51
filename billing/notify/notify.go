// Package notify sends closed statements out of tokenmeter, so that an ERP
// or a payment system (Stripe, ...) can take over collection: an event per
// stored statement revision (Event: "statement.closed", and
// "statement.reissued" for a reissue) as a record on a Kafka topic
// (KafkaSink) and, optionally, as a signed POST to a webhook
// (WebhookSink).
//
// Delivery is at least once, per sink. The closed statements are the
// outbox: a sink's delivery state (Store: which statement hashes it has
// delivered, in ClickHouse) survives restarts, and a delivery pass sends
// every statement closed since the sink's first start that it has not
// delivered, oldest first. A close tells the Notifier at once (Closed,
// which never blocks); a pass also runs every Rescan, and after a failure
// again after a backoff that doubles up to MaxBackoff, for ever, so a
// statement whose event could not be sent is sent later, by this meterd or
// another after a restart. The statement's hash is each event's ID, the
// idempotency key by which consumers drop the copies that at-least-once
// delivery may bring; an event's bytes depend only on what is stored, so
// copies are identical.
//
// It does not close, compute or store statements (package closing) nor
// issue invoices; it reads them.
package notify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"tokenmeter/billing"
)

// Store is the delivery state and what events are made of;
// *chstore.Store implements it.
type Store interface {
	// ServerNow is the clock that stamps statements' closes.
	ServerNow(ctx context.Context) (time.Time, error)
	// DeliveryStart returns sink's first start, recording now the first
	// time.
	DeliveryStart(ctx context.Context, sink string) (time.Time, error)
	// UndeliveredStatements lists up to limit statement revisions closed
	// at or after from that sink has not delivered, oldest close first.
	UndeliveredStatements(ctx context.Context, sink string, from time.Time, limit int) ([]billing.StoredStatement, error)
	// MarkDelivered records sink's delivery of sts.
	MarkDelivered(ctx context.Context, sink string, sts []billing.StoredStatement, at time.Time) error
	// Invoices returns the invoices and credit notes of period's
	// statements (of tenant only, when not empty).
	Invoices(ctx context.Context, period, tenant string) ([]billing.StoredInvoice, error)
}

// Sink delivers events somewhere.
type Sink interface {
	// Name identifies the sink's delivery state ("kafka:<topic>").
	Name() string
	// Send delivers out in order and returns how many, from the first,
	// were delivered; an error when not all were.
	Send(ctx context.Context, out []Outgoing) (int, error)
}

// Outgoing is one event to send: the statement, its event and the
// event's JSON.
type Outgoing struct {
	Statement billing.StoredStatement
	Event     Event
	Body      []byte
}

// Defaults of Config.
const (
	DefaultSettle     = 5 * time.Minute
	DefaultRescan     = time.Minute
	DefaultMinBackoff = time.Second
	DefaultMaxBackoff = 5 * time.Minute
	// StartMargin: a new sink sends the statements closed up to this long
	// before its first start too (closes in flight when it started).
	StartMargin = 10 * time.Minute
	// passLimit bounds the statements one pass reads and sends.
	passLimit = 500
)

// Config tunes a Notifier.
type Config struct {
	// Settle is how long after its close a statement no close of this
	// process told about (Closed) is left to the meterd closing it (and
	// issuing its invoice) before a pass sends it: a close on another
	// replica, or one interrupted by a restart (DefaultSettle when zero;
	// negative: none).
	Settle time.Duration
	// Rescan is how often a sink looks for statements to send without
	// being told of a close (DefaultRescan when zero).
	Rescan time.Duration
	// MinBackoff and MaxBackoff bound the wait before a sink retries a
	// failed pass: MinBackoff, doubling up to MaxBackoff (defaults
	// DefaultMinBackoff and DefaultMaxBackoff).
	MinBackoff, MaxBackoff time.Duration
}

// Notifier delivers the events of closed statements to its sinks, each
// sink on its own (a webhook that is down does not hold the topic back).
type Notifier struct {
	cfg     Config
	store   Store
	logger  *slog.Logger
	workers []*worker

	delivered   *prometheus.CounterVec
	failures    *prometheus.CounterVec
	undelivered *prometheus.GaugeVec
}

// New returns a Notifier sending to sinks (at least one), registering its
// metrics on reg. Run delivers.
func New(cfg Config, store Store, sinks []Sink, reg prometheus.Registerer, logger *slog.Logger) (*Notifier, error) {
	if len(sinks) == 0 {
		return nil, errors.New("billing events: no sink")
	}
	switch {
	case cfg.Settle == 0:
		cfg.Settle = DefaultSettle
	case cfg.Settle < 0:
		cfg.Settle = 0
	}
	if cfg.Rescan <= 0 {
		cfg.Rescan = DefaultRescan
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = DefaultMinBackoff
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	cfg.MaxBackoff = max(cfg.MaxBackoff, cfg.MinBackoff)
	n := &Notifier{cfg: cfg, store: store, logger: logger,
		delivered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meter_billing_events_delivered_total", Help: "Statement events delivered, by sink (a redelivery counts again).",
		}, []string{"sink"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meter_billing_events_failures_total", Help: "Failed delivery passes, by sink: a send or its record failed, and is retried after a backoff.",
		}, []string{"sink"}),
		undelivered: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meter_billing_events_undelivered", Help: "Statements the sink's last delivery pass found undelivered (at most 500), by sink.",
		}, []string{"sink"}),
	}
	for _, c := range []prometheus.Collector{n.delivered, n.failures, n.undelivered} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register billing events metrics: %w", err)
		}
	}
	names := map[string]bool{}
	for _, s := range sinks {
		if names[s.Name()] {
			return nil, fmt.Errorf("billing events: sink %s given twice", s.Name())
		}
		names[s.Name()] = true
		n.workers = append(n.workers, &worker{n: n, sink: s, wake: make(chan struct{}, 1), told: map[string]bool{}})
	}
	return n, nil
}

// Closed tells the sinks of statements a close stored (or found stored):
// those not yet delivered are sent at once, without waiting for Settle.
// It never blocks; delivery does not depend on it (a pass finds every
// undelivered statement), it only makes it prompt.
func (n *Notifier) Closed(sts []billing.StoredStatement) {
	for _, w := range n.workers {
		w.mu.Lock()
		for _, st := range sts {
			w.told[key(st)] = true
		}
		w.mu.Unlock()
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// Run delivers until ctx ends.
func (n *Notifier) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, w := range n.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.run(ctx)
		}()
	}
	wg.Wait()
	return nil
}

// Deliver makes one delivery pass on every sink now, and on to the end of
// what there is to send, returning the sinks' errors: at shutdown, or for
// an admin or a test that must know what was sent. It may run beside Run.
func (n *Notifier) Deliver(ctx context.Context) error {
	var errs []error
	for _, w := range n.workers {
		for {
			more, err := w.pass(ctx)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", w.sink.Name(), err))
			}
			if !more {
				break
			}
		}
	}
	return errors.Join(errs...)
}

// key names a statement revision in a worker's told set.
func key(st billing.StoredStatement) string { return st.Tenant + "/" + st.Period + "/" + st.Hash }

// worker delivers to one sink.
type worker struct {
	n      *Notifier
	sink   Sink
	wake   chan struct{}
	passMu sync.Mutex // one pass at a time (Run's, Deliver's)
	from   time.Time  // statements closed before it are not this sink's; under passMu
	mu     sync.Mutex
	told   map[string]bool // statements Closed told of, until delivered
}

// run makes passes until ctx ends: at once when told of a close, every
// Rescan, and after a failure after a backoff.
func (w *worker) run(ctx context.Context) {
	backoff := time.Duration(0)
	for {
		more, err := w.pass(ctx)
		wait := w.n.cfg.Rescan
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			backoff = nextBackoff(backoff, w.n.cfg.MinBackoff, w.n.cfg.MaxBackoff)
			wait = backoff
			w.n.failures.WithLabelValues(w.sink.Name()).Inc()
			w.n.logger.Warn("billing events not delivered; retrying", "sink", w.sink.Name(), "error", err, "retry_in", wait)
		case more:
			backoff = 0
			continue
		default:
			backoff = 0
		}
		wake := w.wake
		if err != nil {
			wake = nil // a failing sink waits its backoff out
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		case <-wake:
			timer.Stop()
		}
	}
}

// nextBackoff is the wait after a failure that followed a wait of prev
// (0: none): lo, then doubling, at most hi.
func nextBackoff(prev, lo, hi time.Duration) time.Duration {
	return min(max(2*prev, lo), hi)
}

// pass sends what the sink has not delivered, up to passLimit statements;
// more is true when there may be more to send at once.
func (w *worker) pass(ctx context.Context) (more bool, _ error) {
	w.passMu.Lock()
	defer w.passMu.Unlock()
	name := w.sink.Name()
	if w.from.IsZero() {
		start, err := w.n.store.DeliveryStart(ctx, name)
		if err != nil {
			return false, err
		}
		w.from = start.Add(-StartMargin)
	}
	// What Closed told of before the list is read: of those, the ones not
	// listed are delivered already (one told of later may be stored after
	// the read).
	w.mu.Lock()
	toldBefore := make([]string, 0, len(w.told))
	for k := range w.told {
		toldBefore = append(toldBefore, k)
	}
	w.mu.Unlock()
	now, err := w.n.store.ServerNow(ctx)
	if err != nil {
		return false, err
	}
	pending, err := w.n.store.UndeliveredStatements(ctx, name, w.from, passLimit)
	if err != nil {
		return false, err
	}
	w.n.undelivered.WithLabelValues(name).Set(float64(len(pending)))
	settled := now.Add(-w.n.cfg.Settle)
	w.mu.Lock()
	var send []billing.StoredStatement
	listed := map[string]bool{}
	for _, st := range pending {
		listed[key(st)] = true
		if w.told[key(st)] || !st.ClosedAt.After(settled) {
			send = append(send, st)
		}
	}
	if len(pending) < passLimit {
		// Told of and not pending: delivered already (a close again of a
		// closed period).
		for _, k := range toldBefore {
			if !listed[k] {
				delete(w.told, k)
			}
		}
	}
	w.mu.Unlock()
	if len(send) == 0 {
		return false, nil
	}
	out, err := w.outgoing(ctx, send)
	if err != nil {
		return false, err
	}
	sent, sendErr := w.sink.Send(ctx, out)
	if sent > 0 {
		if err := w.n.store.MarkDelivered(ctx, name, send[:sent], now); err != nil {
			return false, errors.Join(sendErr, err)
		}
		w.n.delivered.WithLabelValues(name).Add(float64(sent))
		w.mu.Lock()
		for _, st := range send[:sent] {
			delete(w.told, key(st))
		}
		w.mu.Unlock()
	}
	return len(pending) == passLimit && sendErr == nil, sendErr
}

// outgoing makes the events of sts, with their invoice documents (one read
// per period).
func (w *worker) outgoing(ctx context.Context, sts []billing.StoredStatement) ([]Outgoing, error) {
	docs := map[string][]billing.StoredInvoice{}
	out := make([]Outgoing, 0, len(sts))
	for _, st := range sts {
		d, ok := docs[st.Period]
		if !ok {
			var err error
			if d, err = w.n.store.Invoices(ctx, st.Period, ""); err != nil {
				return nil, err
			}
			docs[st.Period] = d
		}
		ev, err := NewEvent(st, d)
		if err != nil {
			return nil, err
		}
		body, err := json.Marshal(ev)
		if err != nil {
			return nil, fmt.Errorf("encode billing event: %w", err)
		}
		out = append(out, Outgoing{Statement: st, Event: ev, Body: body})
	}
	return out, nil
}
