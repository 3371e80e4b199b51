package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"tokenmeter/internal/workload"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// replayConfig is the configuration of "replay".
type replayConfig struct {
	connConfig
	Synthetic    int
	Fleet        string
	Azure        string
	Rate         float64
	Batch        int
	Concurrency  int
	Seed         int64
	Tenants      int
	Tenant       string
	Duration     time.Duration
	ShiftToNow   bool
	Retries      int
	Wait         time.Duration
	WaitKey      string
	ValidateOnly bool
}

// maxBatch is meterd's default --max-batch-events.
const maxBatch = 10_000

// Validate reports every problem at once.
func (c replayConfig) Validate() error {
	errs := c.connConfig.validate()
	switch {
	case c.Synthetic < 0:
		errs = append(errs, fmt.Errorf("--synthetic %d: must be positive", c.Synthetic))
	case c.Synthetic > 0 && c.Azure != "":
		errs = append(errs, errors.New("give --synthetic N or --azure FILE, not both"))
	case c.Synthetic == 0 && c.Azure == "":
		errs = append(errs, errors.New("nothing to replay: give --synthetic N or --azure FILE"))
	}
	if c.Rate < 0 {
		errs = append(errs, fmt.Errorf("--rate %g: must be 0 (as fast as possible) or positive", c.Rate))
	}
	if c.Batch < 1 || c.Batch > maxBatch {
		errs = append(errs, fmt.Errorf("--batch %d: must be in [1, %d]", c.Batch, maxBatch))
	}
	if c.Concurrency < 1 || c.Concurrency > 256 {
		errs = append(errs, fmt.Errorf("--concurrency %d: must be in [1, 256]", c.Concurrency))
	}
	if _, _, _, ok := workload.FleetNamed(c.Fleet); !ok {
		errs = append(errs, fmt.Errorf("--fleet %q: want one of %s", c.Fleet, strings.Join(workload.Fleets, ", ")))
	}
	if c.Tenants < 1 {
		errs = append(errs, fmt.Errorf("--tenants %d: must be positive", c.Tenants))
	}
	if c.Tenant != "" && c.Azure == "" {
		errs = append(errs, errors.New("--tenant applies to --azure only; synthetic traffic spreads over --tenants"))
	}
	if c.Duration <= 0 {
		errs = append(errs, fmt.Errorf("--duration %s: must be positive", c.Duration))
	}
	if c.Retries < 0 {
		errs = append(errs, fmt.Errorf("--retries %d: must not be negative", c.Retries))
	}
	if c.Wait < 0 {
		errs = append(errs, fmt.Errorf("--wait %s: must not be negative", c.Wait))
	}
	return errors.Join(errs...)
}

func parseReplay(args []string, getenv func(string) string, stderr io.Writer) (replayConfig, error) {
	var c replayConfig
	fs := newFlagSet("replay", "--synthetic N | --azure FILE [flags]",
		"Sends inference events through POST /v1/events in batches: synthetic traffic\n"+
			"(tenants, models, day/night cycle, errors) over the --duration before now, or\n"+
			"the requests of an Azure LLM inference trace (TIMESTAMP,ContextTokens,GeneratedTokens).\n"+
			"Unavailable servers and network errors are retried with backoff: events are\n"+
			"deduplicated by event_id, so resending is safe. Stops on 400, 401, 403 and 413.", stderr)
	c.connConfig.register(fs)
	fs.IntVar(&c.Synthetic, "synthetic", 0, "replay this many synthetic events")
	fs.StringVar(&c.Fleet, "fleet", "default", "the synthetic fleet: default (five models, a level day/night cycle) or demo (the weeks of `make run`: growing 5% a week, one deployment saturating, one idle)")
	fs.StringVar(&c.Azure, "azure", "", "replay this Azure LLM inference trace (CSV)")
	fs.Float64Var(&c.Rate, "rate", 0, "events per second, 0 = as fast as possible (batches shrink to one second's worth)")
	fs.IntVar(&c.Batch, "batch", 500, "events per request")
	fs.IntVar(&c.Concurrency, "concurrency", 4, "requests in flight")
	fs.Int64Var(&c.Seed, "seed", 1, "seed of the synthetic traffic and the made-up parts of a trace")
	fs.IntVar(&c.Tenants, "tenants", workload.DefaultTenants, "number of tenants, with Zipf-skewed shares")
	fs.StringVar(&c.Tenant, "tenant", "", "with --azure: bill every request to this tenant instead of spreading over --tenants")
	fs.DurationVar(&c.Duration, "duration", 24*time.Hour, "time span of the synthetic traffic, ending now")
	fs.BoolVar(&c.ShiftToNow, "shift-to-now", true, "with --azure: move the trace in time so that it ends now")
	fs.IntVar(&c.Retries, "retries", 10, "retries of one batch after 5xx-unavailable or network errors")
	fs.DurationVar(&c.Wait, "wait", 0, "after replaying, wait up to this long until the accepted events are ingested and rolled up (0: do not wait); "+
		"it counts the span's requests before and after, so resent event ids (stored already) or other traffic in those hours make it wait to the end")
	fs.StringVar(&c.WaitKey, "wait-key", "", "API key that may read usage and traffic, for --wait (default: --key)")
	fs.BoolVar(&c.ValidateOnly, "validate", false, "check the flags and exit")
	if err := parseFlags(fs, args); err != nil {
		return c, err
	}
	c.connConfig.resolve(getenv)
	if c.Rate > 0 && float64(c.Batch) > c.Rate {
		c.Batch = max(1, int(c.Rate)) // bursts of at most one second
	}
	return c, c.Validate()
}

// source yields the events to replay.
type source interface {
	// span is the earliest and latest completed_at of the events.
	span() (first, last time.Time)
	// next overwrites ev with the next event; io.EOF after the last.
	next(ev *meterv1.InferenceEvent) error
	// total is the number of events, for progress.
	total() int
	// describe names the source for the summary.
	describe() string
	close() error
}

type syntheticSource struct {
	g           *workload.Generator
	i           int
	first, last time.Time
}

func (s *syntheticSource) next(ev *meterv1.InferenceEvent) error {
	if s.i >= s.g.Len() {
		return io.EOF
	}
	s.g.Fill(ev, s.i)
	s.i++
	return nil
}
func (s *syntheticSource) span() (time.Time, time.Time) { return s.first, s.last }
func (s *syntheticSource) total() int                   { return s.g.Len() }
func (s *syntheticSource) describe() string             { return "synthetic events" }
func (s *syntheticSource) close() error                 { return nil }

type azureSource struct {
	f           *os.File
	r           *workload.AzureReader
	n           int
	name        string
	first, last time.Time
}

func (s *azureSource) next(ev *meterv1.InferenceEvent) error { return s.r.Read(ev) }
func (s *azureSource) span() (time.Time, time.Time)          { return s.first, s.last }
func (s *azureSource) total() int                            { return s.n }
func (s *azureSource) describe() string                      { return "events of " + s.name }
func (s *azureSource) close() error                          { return s.f.Close() }

// openSource prepares the events of cfg; now ends the synthetic span and,
// with --shift-to-now, the trace.
func openSource(cfg replayConfig, now time.Time) (source, error) {
	if cfg.Azure == "" {
		models, growth, errorRate, _ := workload.FleetNamed(cfg.Fleet)
		g, err := workload.New(workload.Config{
			Seed: cfg.Seed, Start: now.Add(-cfg.Duration), Duration: cfg.Duration,
			Events: cfg.Synthetic, Tenants: cfg.Tenants, Models: models, WeeklyGrowth: growth, ErrorRate: errorRate,
		})
		if err != nil {
			return nil, err
		}
		return &syntheticSource{g: g, first: now.Add(-cfg.Duration), last: now}, nil
	}
	f, err := os.Open(cfg.Azure)
	if err != nil {
		return nil, err
	}
	acfg := workload.AzureConfig{Seed: cfg.Seed, Tenant: cfg.Tenant, Tenants: cfg.Tenants}
	// A first pass checks every row before anything is sent, counts the
	// events and finds the shift that ends the trace now.
	span, err := workload.AzureSpan(f, acfg)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", cfg.Azure, err)
	}
	if cfg.ShiftToNow && span.Events > 0 {
		acfg.Shift = now.Sub(span.Last)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	r, err := workload.NewAzureReader(f, acfg)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", cfg.Azure, err)
	}
	return &azureSource{f: f, r: r, n: span.Events, name: cfg.Azure, first: span.First.Add(acfg.Shift), last: span.Last.Add(acfg.Shift)}, nil
}

func runReplay(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := parseReplay(args, getenv, stderr)
	if err != nil {
		return err
	}
	if validatedOnly(stdout, cfg.ValidateOnly) {
		return nil
	}
	src, err := openSource(cfg, time.Now())
	if err != nil {
		return err
	}
	defer src.close()
	rp := &replayer{
		client:      newClient(cfg.connConfig, cfg.Concurrency),
		batch:       cfg.Batch,
		concurrency: cfg.Concurrency,
		rate:        cfg.Rate,
		retries:     cfg.Retries,
		backoff:     100 * time.Millisecond,
		maxBackoff:  10 * time.Second,
		stderr:      stderr,
		tty:         isTerminal(stderr),
	}
	var cv *coverage
	var before uint64
	if cfg.Wait > 0 {
		// The span's requests before the replay: earlier runs may have
		// sent events into the same hours.
		wc := cfg.connConfig
		if cfg.WaitKey != "" {
			wc.Key = cfg.WaitKey
		}
		first, last := src.span()
		cv = newCoverage(newClient(wc, 1), first, last)
		if before, _, err = cv.requests(ctx); err != nil {
			return fmt.Errorf("--wait: read the usage before replaying: %w", err)
		}
	}
	st, err := rp.run(ctx, src)
	st.print(stdout, src.describe(), cfg.baseURL())
	if err != nil || cv == nil {
		return err
	}
	return cv.wait(ctx, before+uint64(st.accepted.Load()), cfg.Wait, stdout)
}

// replayer sends the events of a source in batches from several workers.
type replayer struct {
	client      *client
	batch       int
	concurrency int
	rate        float64 // events per second; 0: unpaced
	retries     int
	backoff     time.Duration // first retry delay, doubled up to maxBackoff
	maxBackoff  time.Duration
	stderr      io.Writer
	tty         bool
}

// batch is a reusable set of messages; the producer fills it, a worker
// encodes it and hands it back.
type batch struct {
	events []*meterv1.InferenceEvent
	n      int
}

func (rp *replayer) run(ctx context.Context, src source) (*stats, error) {
	st := newStats(src.total())
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	free := make(chan *batch, rp.concurrency+1)
	for range cap(free) {
		b := &batch{events: make([]*meterv1.InferenceEvent, rp.batch)}
		for i := range b.events {
			b.events[i] = new(meterv1.InferenceEvent)
		}
		free <- b
	}
	work := make(chan *batch)

	var wg sync.WaitGroup
	for range rp.concurrency {
		wg.Go(func() {
			for b := range work {
				body, err := protojson.Marshal(&meterv1.PublishEventsRequest{Events: b.events[:b.n]})
				n := b.n
				free <- b
				if err != nil {
					cancel(fmt.Errorf("encode batch: %w", err))
					continue
				}
				if err := rp.send(ctx, body, n, st); err != nil {
					cancel(err)
				}
			}
		})
	}

	progressDone := make(chan struct{})
	progressStopped := make(chan struct{})
	go func() {
		defer close(progressStopped)
		newProgress(rp.stderr, rp.tty, st).run(progressDone)
	}()

	// The producer: fill a free batch, wait for its turn under --rate, hand
	// it to a worker.
	produced := 0
produce:
	for {
		var b *batch
		select {
		case b = <-free:
		case <-ctx.Done():
			break produce
		}
		b.n = 0
		for b.n < len(b.events) {
			err := src.next(b.events[b.n])
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				cancel(err)
				break produce
			}
			b.n++
		}
		if b.n == 0 {
			break
		}
		produced += b.n
		if rp.rate > 0 {
			// A batch leaves once the time its events are owed has passed,
			// so that n events take n/rate seconds.
			due := st.start.Add(time.Duration(float64(produced) / rp.rate * float64(time.Second)))
			if !sleep(ctx, time.Until(due)) {
				break
			}
		}
		select {
		case work <- b:
		case <-ctx.Done():
			break produce
		}
	}
	close(work)
	wg.Wait()
	close(progressDone)
	<-progressStopped
	st.elapsed = time.Since(st.start)

	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return st, err
	}
	if err := ctx.Err(); err != nil {
		return st, fmt.Errorf("interrupted: %w", err)
	}
	return st, nil
}

// send publishes one encoded batch of n events, retrying what may succeed
// later, and records the answer.
func (rp *replayer) send(ctx context.Context, body []byte, n int, st *stats) error {
	backoff := rp.backoff
	for attempt := 1; ; attempt++ {
		data, err := rp.client.do(ctx, http.MethodPost, "/v1/events", nil, body)
		if err == nil {
			var resp meterv1.PublishEventsResponse
			if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(data, &resp); err != nil {
				return fmt.Errorf("POST /v1/events: decode answer: %w", err)
			}
			st.record(n, &resp)
			return nil
		}
		if !retryable(err) || attempt > rp.retries || ctx.Err() != nil {
			if retryable(err) {
				return fmt.Errorf("giving up after %d attempts: %w", attempt, err)
			}
			return err
		}
		wait := backoff/2 + rand.N(backoff/2+1) // jitter spreads the workers' retries
		var ae *apiError
		if errors.As(err, &ae) && ae.RetryAfter > wait {
			wait = ae.RetryAfter
		}
		backoff = min(2*backoff, rp.maxBackoff)
		st.retries.Add(1)
		if !rp.tty {
			fmt.Fprintf(rp.stderr, "meterctl: %v; retry %d/%d in %s\n", err, attempt, rp.retries, wait.Round(time.Millisecond))
		}
		if !sleep(ctx, wait) {
			return fmt.Errorf("%w (while retrying after: %v)", context.Cause(ctx), err)
		}
	}
}

// sleep waits for d or until ctx ends; it reports whether d elapsed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// stats counts what a replay did; safe for concurrent use.
type stats struct {
	start    time.Time
	elapsed  time.Duration
	total    int
	sent     atomic.Int64 // events in answered requests
	accepted atomic.Int64
	rejected atomic.Int64
	batches  atomic.Int64
	retries  atomic.Int64

	mu      sync.Mutex
	reasons map[string]*reasonGroup
}

// reasonGroup is every rejection whose reason reads the same once numbers
// are blanked out, with the first one as an example.
type reasonGroup struct {
	count   int
	example string
	eventID string
}

func newStats(total int) *stats {
	return &stats{start: time.Now(), total: total, reasons: map[string]*reasonGroup{}}
}

var numberRE = regexp.MustCompile(`-?\d+(\.\d+)?(e[-+]?\d+)?`)

func (s *stats) record(n int, resp *meterv1.PublishEventsResponse) {
	s.sent.Add(int64(n))
	s.batches.Add(1)
	s.accepted.Add(resp.GetAccepted())
	s.rejected.Add(int64(len(resp.GetRejected())))
	if len(resp.GetRejected()) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range resp.GetRejected() {
		key := numberRE.ReplaceAllString(r.GetReason(), "N")
		g := s.reasons[key]
		if g == nil {
			g = &reasonGroup{example: r.GetReason(), eventID: r.GetEventId()}
			s.reasons[key] = g
		}
		g.count++
	}
}

// maxReasons is how many groups of rejection reasons the summary shows.
const maxReasons = 5

// print writes the summary.
func (s *stats) print(w io.Writer, what, addr string) {
	sent := s.sent.Load()
	fmt.Fprintf(w, "replayed %d of %d %s to %s\n", sent, s.total, what, addr)
	fmt.Fprintf(w, "  sent      %d events in %s\n", sent, plural(s.batches.Load(), "request"))
	fmt.Fprintf(w, "  accepted  %d\n", s.accepted.Load())
	fmt.Fprintf(w, "  rejected  %d\n", s.rejected.Load())
	s.mu.Lock()
	groups := make([]*reasonGroup, 0, len(s.reasons))
	for _, g := range s.reasons {
		groups = append(groups, g)
	}
	s.mu.Unlock()
	slices.SortFunc(groups, func(a, b *reasonGroup) int {
		if a.count != b.count {
			return b.count - a.count
		}
		return cmp.Compare(a.example, b.example)
	})
	for i, g := range groups {
		if i == maxReasons {
			fmt.Fprintf(w, "    … and %d more kinds of reason\n", len(groups)-maxReasons)
			break
		}
		fmt.Fprintf(w, "    %6d× %s (e.g. event %s)\n", g.count, g.example, g.eventID)
	}
	if r := s.retries.Load(); r > 0 {
		fmt.Fprintf(w, "  retries   %d\n", r)
	}
	fmt.Fprintf(w, "  elapsed   %s\n", s.elapsed.Round(time.Millisecond))
	if secs := s.elapsed.Seconds(); secs > 0 && sent > 0 {
		fmt.Fprintf(w, "  rate      %.0f events/s\n", float64(sent)/secs)
	}
}

// plural returns "1 request", "2 requests".
func plural(n int64, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
