// Package notify sends closed statements out of tokenmeter, so that an ERP
// or a payment system (Stripe, ...) can take over collection: an event per
// stored statement revision (Event: "statement.closed", and
// "statement.reissued" for a reissue) as a record on a Kafka topic
// (KafkaSink) and, optionally, as a signed POST to a webhook
// (WebhookSink).
//
// Delivery is at least once, per sink. The closed statements are the
// outbox: a sink's delivery state (Store: which statement hashes it has
// delivered, in ClickHouse) survives restarts, and a delivery pass tries
// every statement closed since the sink's first start that it has not
// delivered, oldest first, each on its own: no event holds back another.
// A close tells the Notifier at once (Closed, which never blocks); a pass
// also runs every Rescan. An event whose send failed is tried again after
// a backoff of its own that doubles up to MaxBackoff, for ever, so it is
// sent later, by this meterd or another after a restart; a sink that
// takes nothing (down) backs off as a whole. An event that fails for good
// (it cannot be made from what is stored, or the sink refuses it: a
// PermanentError) DeadLetterAttempts times in a row is a dead letter:
// recorded, counted and logged once, and not tried again until a restart
// or Redeliver. The statement's hash is each event's ID, the idempotency
// key by which consumers drop the copies that at-least-once delivery may
// bring; an event's bytes depend only on what is stored, so copies are
// identical.
//
// An event carries its statement's invoice (and, for a reissue, the credit
// note): a statement whose invoice is not issued yet (a close that stored
// it and failed to issue, or stopped between the two) is not sent. The
// Notifier asks the issuer (IssueWith: closing.Service.IssueInvoices,
// under the close lock) to issue it, and otherwise waits for it, as for a
// failed send (its backoff, never a dead letter): its event goes out once,
// with the invoice, since the event's ID (the statement's hash) makes
// consumers drop any later copy.
//
// It does not close, compute or store statements (package closing) nor
// number invoices itself; it reads them.
package notify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
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
	// at or after from that sink has not delivered, oldest close first
	// (by close, tenant, period, revision): with after, those that follow
	// it in that order.
	UndeliveredStatements(ctx context.Context, sink string, from time.Time, after *billing.StoredStatement, limit int) ([]billing.StoredStatement, error)
	// MarkDelivered records sink's delivery of sts.
	MarkDelivered(ctx context.Context, sink string, sts []billing.StoredStatement, at time.Time) error
	// MarkDeadLettered records that sink gave up on st's event after
	// attempts failures, the last for reason; st stays undelivered.
	MarkDeadLettered(ctx context.Context, sink string, st billing.StoredStatement, attempts int, reason string, at time.Time) error
	// Invoices returns the invoices and credit notes of period's
	// statements (of tenant only, when not empty).
	Invoices(ctx context.Context, period, tenant string) ([]billing.StoredInvoice, error)
}

// Sink delivers events somewhere.
type Sink interface {
	// Name identifies the sink's delivery state ("kafka:<topic>").
	Name() string
	// Send tries to deliver each of out and returns, in out's order, an
	// error per event: nil when it was delivered. An error is a
	// PermanentError when sending that event again would fail the same
	// way, an UnavailableError when the sink could take no event (down,
	// or asking to slow down), and ErrNotTried for an event the sink did
	// not try after such a failure.
	Send(ctx context.Context, out []Outgoing) []error
}

// ErrNotTried is a Sink's answer for an event it did not try to send, as
// an earlier one of the same Send found it unavailable: it costs the event
// no attempt.
var ErrNotTried = errors.New("not tried: the sink was unavailable")

// PermanentError is a failure that sending the same event again would
// repeat: the event cannot be made from what is stored, or the sink
// refused it (a webhook's 4xx other than 408 and 429). DeadLetterAttempts
// of them in a row make the event a dead letter.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// UnavailableError is a failure of the sink rather than of the event (no
// answer, a webhook's 429 or 502 to 504): a pass tries no more events.
type UnavailableError struct{ Err error }

func (e *UnavailableError) Error() string { return e.Err.Error() }
func (e *UnavailableError) Unwrap() error { return e.Err }

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
	// DefaultDeadLetterAttempts: permanent failures in a row of one event
	// before its sink gives up on it.
	DefaultDeadLetterAttempts = 5
	// StartMargin: a new sink sends the statements closed up to this long
	// before its first start too (closes in flight when it started).
	StartMargin = 10 * time.Minute
	// passLimit bounds the statements one read of a pass lists and one
	// Send gets (a pass reads on, a page at a time).
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
	// MinBackoff and MaxBackoff bound the wait before an event whose send
	// failed is tried again, and before a sink that delivered nothing
	// because it failed retries: MinBackoff, doubling up to MaxBackoff
	// (defaults DefaultMinBackoff and DefaultMaxBackoff).
	MinBackoff, MaxBackoff time.Duration
	// DeadLetterAttempts is how many permanent failures in a row make an
	// event a dead letter (DefaultDeadLetterAttempts when zero or less).
	DeadLetterAttempts int
}

// Notifier delivers the events of closed statements to its sinks, each
// sink on its own (a webhook that is down does not hold the topic back).
type Notifier struct {
	cfg     Config
	store   Store
	logger  *slog.Logger
	workers []*worker

	delivered    *prometheus.CounterVec
	failures     *prometheus.CounterVec
	deadLettered *prometheus.CounterVec
	undelivered  *prometheus.GaugeVec

	issue atomic.Pointer[IssueFunc]
}

// IssueFunc issues the invoices that stored statements lack;
// closing.Service.IssueInvoices is one.
type IssueFunc func(ctx context.Context, sts []billing.StoredStatement) error

// IssueWith makes n issue, with issue, the invoice of a statement it is to
// send that has none; without it such a statement waits until a close, a
// void or an admin's read issues its invoice.
func (n *Notifier) IssueWith(issue IssueFunc) { n.issue.Store(&issue) }

// ErrInvoiceNotIssued is the failure of an event whose statement's
// invoice is not issued yet: tried again after its backoff, never a dead
// letter.
var ErrInvoiceNotIssued = errors.New("the statement's invoice is not issued yet")

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
	if cfg.DeadLetterAttempts <= 0 {
		cfg.DeadLetterAttempts = DefaultDeadLetterAttempts
	}
	n := &Notifier{cfg: cfg, store: store, logger: logger,
		delivered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meter_billing_events_delivered_total", Help: "Statement events delivered, by sink (a redelivery counts again).",
		}, []string{"sink"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meter_billing_events_failures_total", Help: "Failed sends of a statement event (each retried after its backoff, or given up on as a dead letter), and delivery passes that failed to read or record the delivery state, by sink.",
		}, []string{"sink"}),
		deadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meter_billing_events_dead_lettered_total", Help: "Statement events a sink gave up on (not made from what is stored, or refused for good), by sink: not tried again until a restart or a redeliver.",
		}, []string{"sink"}),
		undelivered: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meter_billing_events_undelivered", Help: "Statements the sink's last delivery pass found undelivered (dead letters and events waiting for their retry included), by sink.",
		}, []string{"sink"}),
	}
	for _, c := range []prometheus.Collector{n.delivered, n.failures, n.deadLettered, n.undelivered} {
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
		n.workers = append(n.workers, &worker{n: n, sink: s, wake: make(chan struct{}, 1), told: map[string]bool{}, failed: map[string]*failing{}})
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
		w.poke()
	}
}

// Redeliver makes every sink try the events it gave up on (dead letters)
// again at once, with a new count of attempts: those of tenant's period
// only when tenant and period are not empty. It returns how many it
// revived (counting each sink's). An operator runs it once the cause is
// fixed (the receiver, or the stored statement); a restart does the same.
func (n *Notifier) Redeliver(tenant, period string) int {
	revived := 0
	for _, w := range n.workers {
		w.mu.Lock()
		for k, f := range w.failed {
			if f.dead && (tenant == "" || f.st.Tenant == tenant) && (period == "" || f.st.Period == period) {
				delete(w.failed, k)
				revived++
			}
		}
		w.mu.Unlock()
		w.poke()
	}
	return revived
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

// Deliver makes one delivery pass on every sink now, through every
// statement there is to send, and returns the sinks' errors (an event's
// failure included): at shutdown, or for an admin or a test that must know
// what was sent. It tries the events waiting for their retry too, but not
// the dead letters. It may run beside Run.
func (n *Notifier) Deliver(ctx context.Context) error {
	var errs []error
	for _, w := range n.workers {
		if r := w.pass(ctx, true); r.err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", w.sink.Name(), r.err))
		}
	}
	return errors.Join(errs...)
}

// key names a statement revision in a worker's told and failed sets.
func key(st billing.StoredStatement) string { return st.Tenant + "/" + st.Period + "/" + st.Hash }

// worker delivers to one sink.
type worker struct {
	n      *Notifier
	sink   Sink
	wake   chan struct{}
	passMu sync.Mutex // one pass at a time (Run's, Deliver's)
	from   time.Time  // statements closed before it are not this sink's; under passMu
	mu     sync.Mutex
	told   map[string]bool     // statements Closed told of, until delivered
	failed map[string]*failing // events whose last send failed, until delivered
}

// failing is the state of an event whose last send failed.
type failing struct {
	st        billing.StoredStatement // without its content
	failures  int                     // in a row
	permanent int                     // permanent failures in a row
	backoff   time.Duration
	retryAt   time.Time // by this process's clock
	reason    string    // the last failure
	dead      bool      // given up on: not tried until a restart or Redeliver
	recorded  bool      // the dead letter is stored
}

// poke wakes the worker's run without blocking.
func (w *worker) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// run makes passes until ctx ends: at once when told of a close, every
// Rescan, when an event's retry is due, again at once after a pass that
// stopped early (the sink failed after it delivered events), and after a
// pass that delivered nothing because the sink or the store failed after
// a backoff.
func (w *worker) run(ctx context.Context) {
	backoff := time.Duration(0)
	for {
		r := w.pass(ctx, false)
		wait := w.n.cfg.Rescan
		switch {
		case ctx.Err() != nil:
			return
		case r.stalled():
			backoff = nextBackoff(backoff, w.n.cfg.MinBackoff, w.n.cfg.MaxBackoff)
			wait = backoff
			w.n.logger.Warn("billing events not delivered; retrying", "sink", w.sink.Name(), "error", r.err, "retry_in", wait)
		case r.stopped && r.delivered > 0:
			backoff = 0
			continue
		default:
			backoff = 0
			if r.err != nil {
				w.n.logger.Warn("billing events not delivered; each retried after its backoff", "sink", w.sink.Name(), "error", r.err)
			}
		}
		if !r.retryAt.IsZero() && !r.stalled() {
			wait = min(wait, max(time.Until(r.retryAt), 0))
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		case <-w.wake:
			// A close: its events are new, tried first, so a sink that
			// is down costs one attempt.
			timer.Stop()
		}
	}
}

// nextBackoff is the wait after a failure that followed a wait of prev
// (0: none): lo, then doubling, at most hi.
func nextBackoff(prev, lo, hi time.Duration) time.Duration {
	return min(max(2*prev, lo), hi)
}

// passResult is what a pass did.
type passResult struct {
	delivered int
	// transient counts the events whose send failed, not for good.
	transient int
	// storeFailed: the pass could not read or record the delivery state
	// (err says why).
	storeFailed bool
	// stopped: the pass did not go through every statement (the sink was
	// unavailable, or the store failed).
	stopped bool
	// retryAt is the earliest retry of an event waiting for one.
	retryAt time.Time
	err     error
}

// stalled is a pass that delivered nothing because the sink or the store
// failed: the sink backs off as a whole.
func (r passResult) stalled() bool {
	return r.storeFailed || (r.delivered == 0 && r.transient > 0)
}

// pass goes through the statements the sink has not delivered, a page of
// passLimit at a time, and sends each page's events that are due: told of
// by a close or settled, not dead letters, and (unless force) not waiting
// for a retry. Within a page, events that never failed go first, so that
// events that keep failing delay no other. A pass stops at a sink's
// UnavailableError (it tries no more) or a store error.
func (w *worker) pass(ctx context.Context, force bool) (r passResult) {
	w.passMu.Lock()
	defer w.passMu.Unlock()
	name := w.sink.Name()
	storeErr := func(err error) passResult {
		w.n.failures.WithLabelValues(name).Inc()
		r.storeFailed, r.stopped, r.err = true, true, err
		return r
	}
	if w.from.IsZero() {
		start, err := w.n.store.DeliveryStart(ctx, name)
		if err != nil {
			return storeErr(err)
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
		return storeErr(err)
	}
	if err := w.recordDeadLetters(ctx, now); err != nil {
		return storeErr(err)
	}
	settled := now.Add(-w.n.cfg.Settle)
	var (
		after     *billing.StoredStatement
		listed    = map[string]bool{}
		total     int
		firstErr  error
		failed    int
		permanent int
	)
	for {
		page, err := w.n.store.UndeliveredStatements(ctx, name, w.from, after, passLimit)
		if err != nil {
			return storeErr(err)
		}
		total += len(page)
		local := time.Now()
		w.mu.Lock()
		var send []billing.StoredStatement
		for _, st := range page {
			k := key(st)
			listed[k] = true
			if !w.told[k] && st.ClosedAt.After(settled) {
				continue // left to the close that stored it
			}
			if f := w.failed[k]; f != nil && (f.dead || (!force && local.Before(f.retryAt))) {
				continue
			}
			send = append(send, st)
		}
		// Never failed first, then by failures in a row; else in close
		// order.
		slices.SortStableFunc(send, func(a, b billing.StoredStatement) int {
			return w.failuresOf(a) - w.failuresOf(b)
		})
		w.mu.Unlock()
		if len(send) > 0 {
			res := w.sendPage(ctx, send, now)
			r.delivered += res.delivered
			r.transient += res.transient
			failed += res.transient + res.permanent
			permanent += res.permanent
			if firstErr == nil {
				firstErr = res.firstErr
			}
			if res.storeErr != nil {
				return storeErr(errors.Join(res.storeErr, firstErr))
			}
			if res.unavailable {
				r.stopped = true
				break
			}
		}
		if len(page) < passLimit {
			break
		}
		after = &page[len(page)-1]
	}
	w.n.undelivered.WithLabelValues(name).Set(float64(total))
	w.mu.Lock()
	if !r.stopped {
		// Through every statement: those told of or failed that are not
		// listed were delivered (a close again of a closed period, or
		// another replica's delivery).
		for _, k := range toldBefore {
			if !listed[k] {
				delete(w.told, k)
			}
		}
		for k := range w.failed {
			if !listed[k] {
				delete(w.failed, k)
			}
		}
	}
	for _, f := range w.failed {
		if !f.dead && (r.retryAt.IsZero() || f.retryAt.Before(r.retryAt)) {
			r.retryAt = f.retryAt
		}
	}
	w.mu.Unlock()
	if failed > 0 {
		r.err = fmt.Errorf("%d billing events not delivered (%d refused for good); the first: %w", failed, permanent, firstErr)
	}
	return r
}

// failuresOf is how many times in a row st's event failed; under mu.
func (w *worker) failuresOf(st billing.StoredStatement) int {
	if f := w.failed[key(st)]; f != nil {
		return f.failures
	}
	return 0
}

// pageResult is what sending a page did.
type pageResult struct {
	delivered, transient, permanent int
	unavailable                     bool
	firstErr, storeErr              error
}

// sendPage makes the events of sts and sends them, recording the
// deliveries and each failure.
func (w *worker) sendPage(ctx context.Context, sts []billing.StoredStatement, now time.Time) (res pageResult) {
	name := w.sink.Name()
	out, built, err := w.outgoing(ctx, sts)
	if err != nil {
		res.storeErr = err
		return res
	}
	errs := make([]error, len(sts))
	copy(errs, built)
	var sendOut []Outgoing
	var sendIdx []int
	for i := range sts {
		if errs[i] == nil {
			sendOut = append(sendOut, out[i])
			sendIdx = append(sendIdx, i)
		}
	}
	if len(sendOut) > 0 {
		sent := w.sink.Send(ctx, sendOut)
		for j, i := range sendIdx {
			if j < len(sent) {
				errs[i] = sent[j]
			} else {
				errs[i] = &UnavailableError{fmt.Errorf("sink %s answered %d of %d events", name, len(sent), len(sendOut))}
			}
		}
	}
	var delivered []billing.StoredStatement
	for i, st := range sts {
		if errs[i] == nil {
			delivered = append(delivered, st)
		}
	}
	if len(delivered) > 0 {
		if err := w.n.store.MarkDelivered(ctx, name, delivered, now); err != nil {
			// Sent and not recorded: sent again (at least once).
			res.storeErr = err
			return res
		}
		w.n.delivered.WithLabelValues(name).Add(float64(len(delivered)))
		res.delivered = len(delivered)
	}
	local := time.Now()
	w.mu.Lock()
	var dead []*failing
	for i, st := range sts {
		err, k := errs[i], key(st)
		switch {
		case err == nil:
			delete(w.told, k)
			delete(w.failed, k)
			continue
		case errors.Is(err, ErrNotTried):
			continue
		}
		if res.firstErr == nil {
			res.firstErr = err
		}
		w.n.failures.WithLabelValues(name).Inc()
		f := w.failed[k]
		if f == nil {
			st.Content = nil
			f = &failing{st: st}
			w.failed[k] = f
		}
		f.failures++
		f.reason = err.Error()
		f.backoff = nextBackoff(f.backoff, w.n.cfg.MinBackoff, w.n.cfg.MaxBackoff)
		f.retryAt = local.Add(f.backoff)
		var perm *PermanentError
		var unavail *UnavailableError
		switch {
		case errors.As(err, &perm):
			res.permanent++
			f.permanent++
			if f.permanent >= w.n.cfg.DeadLetterAttempts {
				f.dead = true
				dead = append(dead, f)
			}
		case errors.As(err, &unavail):
			res.transient++
			res.unavailable = true
			f.permanent = 0
		default:
			res.transient++
			f.permanent = 0
		}
	}
	w.mu.Unlock()
	for _, f := range dead {
		w.n.deadLettered.WithLabelValues(name).Inc()
		w.n.logger.Error("billing event given up on (dead letter) until a restart or a redeliver", "sink", name,
			"tenant", f.st.Tenant, "period", f.st.Period, "revision", f.st.Revision, "hash", f.st.Hash, "attempts", f.permanent, "error", f.reason)
	}
	if len(dead) > 0 {
		if err := w.recordDeadLetters(ctx, now); err != nil {
			res.storeErr = err
		}
	}
	return res
}

// recordDeadLetters stores the dead letters not stored yet (a failed
// store is tried again by the next pass).
func (w *worker) recordDeadLetters(ctx context.Context, now time.Time) error {
	w.mu.Lock()
	var todo []*failing
	for _, f := range w.failed {
		if f.dead && !f.recorded {
			todo = append(todo, f)
		}
	}
	w.mu.Unlock()
	for _, f := range todo {
		w.mu.Lock()
		st, attempts, reason := f.st, f.permanent, f.reason
		w.mu.Unlock()
		if err := w.n.store.MarkDeadLettered(ctx, w.sink.Name(), st, attempts, reason, now); err != nil {
			return err
		}
		w.mu.Lock()
		f.recorded = true
		w.mu.Unlock()
	}
	return nil
}

// outgoing makes the events of sts, with their invoice documents (one read
// per period): out[i] is st[i]'s, unless failed[i] says why it could not
// be made (a PermanentError, or ErrInvoiceNotIssued for a statement whose
// invoice is not issued, even by the issuer). err is a failure to read the
// invoices.
func (w *worker) outgoing(ctx context.Context, sts []billing.StoredStatement) (out []Outgoing, failed []error, err error) {
	docs := map[string][]billing.StoredInvoice{}
	events := func(only func(i int) bool) error {
		for i, st := range sts {
			if !only(i) {
				continue
			}
			d, ok := docs[st.Period]
			if !ok {
				if d, err = w.n.store.Invoices(ctx, st.Period, ""); err != nil {
					return err
				}
				docs[st.Period] = d
			}
			ev, err := NewEvent(st, d)
			if err != nil {
				failed[i] = &PermanentError{fmt.Errorf("make billing event: %w", err)}
				continue
			}
			if ev.Invoice == nil {
				failed[i] = fmt.Errorf("event of %s's %s (revision %d): %w", st.Tenant, st.Period, st.Revision, ErrInvoiceNotIssued)
				continue
			}
			body, err := json.Marshal(ev)
			if err != nil {
				failed[i] = &PermanentError{fmt.Errorf("encode billing event of %s for %s: %w", st.Tenant, st.Period, err)}
				continue
			}
			failed[i], out[i] = nil, Outgoing{Statement: st, Event: ev, Body: body}
		}
		return nil
	}
	out = make([]Outgoing, len(sts))
	failed = make([]error, len(sts))
	if err := events(func(int) bool { return true }); err != nil {
		return nil, nil, err
	}
	// Statements without their invoice: issued first, where an issuer is
	// set, then made again.
	var lacking []billing.StoredStatement
	for i, st := range sts {
		if errors.Is(failed[i], ErrInvoiceNotIssued) {
			lacking = append(lacking, st)
		}
	}
	issue := w.n.issue.Load()
	if issue == nil || len(lacking) == 0 {
		return out, failed, nil
	}
	if ierr := (*issue)(ctx, lacking); ierr != nil {
		for i := range sts {
			if errors.Is(failed[i], ErrInvoiceNotIssued) {
				failed[i] = fmt.Errorf("%w (issuing it: %w)", failed[i], ierr)
			}
		}
		return out, failed, nil
	}
	for _, st := range lacking {
		delete(docs, st.Period) // read again
	}
	if err := events(func(i int) bool { return errors.Is(failed[i], ErrInvoiceNotIssued) }); err != nil {
		return nil, nil, err
	}
	return out, failed, nil
}
