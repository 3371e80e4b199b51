package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/types/known/timestamppb"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// Target is one engine replica's metrics endpoint.
type Target struct {
	// Deployment the replica serves; required.
	Deployment string
	// URL of the engine's Prometheus endpoint, e.g. http://10.0.0.7:8000/metrics.
	URL string
	// Replica names the replica; default the URL's host:port.
	Replica string
	// Node is the host the replica runs on, if known.
	Node string
}

// ParseTargets reads the --engine-endpoints list: comma-separated
// deployment=URL entries, each optionally followed by @replica
// (llama-70b=http://10.0.0.7:8000/metrics@llama-70b-0).
func ParseTargets(list string) ([]Target, error) {
	var (
		out  []Target
		errs []error
		seen = map[string]bool{}
	)
	for _, entry := range strings.Split(list, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		dep, rest, ok := strings.Cut(entry, "=")
		if !ok || dep == "" {
			errs = append(errs, fmt.Errorf("engine endpoint %q: want deployment=http://host:port/metrics", entry))
			continue
		}
		t := Target{Deployment: dep, URL: rest}
		if i := strings.LastIndex(rest, "@"); i > strings.Index(rest, "://")+2 && !strings.Contains(rest[i:], "/") {
			t.URL, t.Replica = rest[:i], rest[i+1:]
		}
		if err := t.check(); err != nil {
			errs = append(errs, err)
			continue
		}
		t = t.withDefaults()
		if seen[t.Deployment+"\x00"+t.Replica] {
			errs = append(errs, fmt.Errorf("engine endpoint %q: replica %s of %s is listed twice", entry, t.Replica, t.Deployment))
			continue
		}
		seen[t.Deployment+"\x00"+t.Replica] = true
		out = append(out, t)
	}
	return out, errors.Join(errs...)
}

func (t Target) check() error {
	u, err := url.Parse(t.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("engine endpoint %q of %s: want http(s)://host:port/metrics", t.URL, t.Deployment)
	}
	if t.Deployment == "" {
		return fmt.Errorf("engine endpoint %q: deployment is required", t.URL)
	}
	return nil
}

func (t Target) withDefaults() Target {
	if t.Replica == "" {
		if u, err := url.Parse(t.URL); err == nil {
			t.Replica = u.Host
		}
	}
	return t
}

// ScraperConfig configures a Scraper.
type ScraperConfig struct {
	// Interval between two scrapes of a target. Default 10s.
	Interval time.Duration
	// MaxGap is the longest time between two scrapes of a target that the
	// later sample may cover. After a longer gap (the endpoint failed) the
	// sample covers Interval: gauges are not stretched over the gap.
	// Counter deltas always span the whole gap, so that no preemption or
	// prefix-cache query is lost. Default 3 * Interval.
	MaxGap time.Duration
	// Timeout bounds one scrape. Default min(Interval, 10s).
	Timeout time.Duration
	// Parallel bounds the scrapes in flight. Default 32.
	Parallel int
	// Client is the HTTP client; default a new one.
	Client *http.Client
}

func (c ScraperConfig) withDefaults() ScraperConfig {
	if c.Interval <= 0 {
		c.Interval = 10 * time.Second
	}
	if c.MaxGap <= 0 {
		c.MaxGap = 3 * c.Interval
	}
	if c.Timeout <= 0 {
		c.Timeout = min(c.Interval, 10*time.Second)
	}
	if c.Parallel <= 0 {
		c.Parallel = 32
	}
	if c.Client == nil {
		c.Client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1, IdleConnTimeout: 3 * c.Interval}}
	}
	return c
}

// TargetError is the failed scrape of one target: the target is reported
// down and no sample is made for it.
type TargetError struct {
	Target Target
	Err    error
}

func (e *TargetError) Error() string {
	return fmt.Sprintf("scrape %s (replica %s of %s): %v", e.Target.URL, e.Target.Replica, e.Target.Deployment, e.Err)
}

func (e *TargetError) Unwrap() error { return e.Err }

// Scraper scrapes engine targets and turns each reading into an
// EngineSample, keeping each target's previous counters to compute deltas.
type Scraper struct {
	cfg ScraperConfig

	mu   sync.Mutex
	prev map[string]*previous // by deployment and replica
}

// previous is a target's last successful reading.
type previous struct {
	at      time.Time
	reading Reading
}

// NewScraper creates a Scraper.
func NewScraper(cfg ScraperConfig) *Scraper {
	return &Scraper{cfg: cfg.withDefaults(), prev: map[string]*previous{}}
}

// Scrape reads every target once, at most Parallel at a time, and returns
// the samples of the targets that answered, in the order of targets, and
// a *TargetError for each that did not.
func (s *Scraper) Scrape(ctx context.Context, targets []Target, now time.Time) ([]*meterv1.EngineSample, []*TargetError) {
	samples := make([]*meterv1.EngineSample, len(targets))
	errs := make([]*TargetError, len(targets))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(s.cfg.Parallel)
	for i, t := range targets {
		g.Go(func() error {
			r, err := s.fetch(gctx, t)
			if err != nil {
				errs[i] = &TargetError{Target: t, Err: err}
				return nil
			}
			samples[i] = s.Sample(t, r, now)
			return nil
		})
	}
	_ = g.Wait() // the goroutines return no error
	var (
		outS []*meterv1.EngineSample
		outE []*TargetError
	)
	for i := range targets {
		if samples[i] != nil {
			outS = append(outS, samples[i])
		}
		if errs[i] != nil {
			outE = append(outE, errs[i])
		}
	}
	return outS, outE
}

// Forget drops the previous readings of the replicas not among targets
// (pods gone), so that the memory of a long-running agent stays bounded.
func (s *Scraper) Forget(targets []Target) {
	keep := make(map[string]bool, len(targets))
	for _, t := range targets {
		t = t.withDefaults()
		keep[t.Deployment+"\x00"+t.Replica] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.prev {
		if !keep[k] {
			delete(s.prev, k)
		}
	}
}

// maxScrapeBytes bounds one scrape's body (vLLM's /metrics is about 50 KiB).
const maxScrapeBytes = 16 << 20

func (s *Scraper) fetch(ctx context.Context, t Target) (Reading, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.URL, nil)
	if err != nil {
		return Reading{}, err
	}
	// The text format: engines' Python clients answer it by default.
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := s.cfg.Client.Do(req)
	if err != nil {
		return Reading{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
		return Reading{}, fmt.Errorf("HTTP %d: %q", resp.StatusCode, snippet)
	}
	return Parse(io.LimitReader(resp.Body, maxScrapeBytes))
}

// Sample turns target t's reading at now into a sample: gauges as read,
// counters as the deltas since the target's previous reading. A counter
// lower than before restarted (the engine restarted): its delta is its new
// value, as Prometheus's increase() counts it. Counter deltas are unset at
// a target's first reading, and for a counter the previous reading lacked.
// Restarts is 1 when the engine restarted since the previous reading
// (restarted), 0 when not, unset at the first reading.
func (s *Scraper) Sample(t Target, r Reading, now time.Time) *meterv1.EngineSample {
	now = now.UTC().Truncate(time.Millisecond)
	t = t.withDefaults()
	key := t.Deployment + "\x00" + t.Replica
	s.mu.Lock()
	p := s.prev[key]
	s.prev[key] = &previous{at: now, reading: r}
	s.mu.Unlock()

	iv := s.cfg.Interval
	if p != nil {
		if elapsed := now.Sub(p.at); elapsed > 0 && elapsed <= s.cfg.MaxGap {
			iv = elapsed
		}
	}
	out := &meterv1.EngineSample{
		SampleId: SampleID(t.Deployment, t.Replica, now), Deployment: t.Deployment, Engine: r.Engine,
		Replica: t.Replica, Model: r.Model, Node: t.Node, SampledAt: timestamppb.New(now),
		IntervalS: iv.Seconds(), Source: "scrape",
		Running: count(r.Running), Waiting: count(r.Waiting),
		KvCacheUsage: clampRatio(r.KVCacheUsage), PrefixCacheHitRate: clampRatio(r.PrefixHitRate),
	}
	if p == nil {
		return out
	}
	var restarts uint32
	some, whole := restarted(p.reading, r)
	if some {
		restarts = 1
	}
	out.Restarts = &restarts
	if p.reading.Engine != r.Engine {
		return out
	}
	fdelta := func(prev, cur Counter) (float64, bool) { return fdelta(prev, cur, whole) }
	delta := func(prev, cur Counter) (uint64, bool) {
		d, ok := fdelta(prev, cur)
		return uint64(math.Round(d)), ok
	}
	q, qok := delta(p.reading.PrefixQueries, r.PrefixQueries)
	h, hok := delta(p.reading.PrefixHits, r.PrefixHits)
	if qok && hok && h <= q {
		out.PrefixCacheQueries, out.PrefixCacheHits = &q, &h
	}
	if d, ok := delta(p.reading.Preemptions, r.Preemptions); ok {
		out.Preemptions = &d
	}
	sum, sok := fdelta(p.reading.IterationTokensSum, r.IterationTokensSum)
	n, nok := fdelta(p.reading.IterationTokensCount, r.IterationTokensCount)
	if sok && nok && n > 0 {
		b := sum / n
		out.BatchTokens = &b
	}
	return out
}

// restarted tells whether the engine behind two successive readings of a
// target restarted in between (some), and whether its whole process did
// (whole: its counters all started again from zero). A process restart is
// another engine answering, a later process start time, or a lower Dynamo
// uptime; otherwise a series that only grows (a counter) going down is a
// restart of its engine: one of several (vLLM's data-parallel engines)
// restarting is a restart of the replica. Several restarts between two
// scrapes count as one: a scrape cannot tell them apart.
func restarted(prev, cur Reading) (some, whole bool) {
	if prev.Engine != cur.Engine {
		return true, true
	}
	for k, v := range cur.StartTimes {
		if p, ok := prev.StartTimes[k]; ok && v > p {
			return true, true
		}
	}
	for k, v := range cur.Uptime {
		if p, ok := prev.Uptime[k]; ok && v < p {
			return true, true
		}
	}
	for _, c := range [][2]Counter{{prev.Monotonic, cur.Monotonic}, {prev.PrefixQueries, cur.PrefixQueries},
		{prev.PrefixHits, cur.PrefixHits}, {prev.Preemptions, cur.Preemptions},
		{prev.IterationTokensSum, cur.IterationTokensSum}, {prev.IterationTokensCount, cur.IterationTokensCount}} {
		for k, v := range c[1] {
			if p, ok := c[0][k]; ok && v < p {
				return true, false
			}
		}
	}
	return false, false
}

// fdelta is a counter's increase from prev to cur, summed over its series:
// a series lower than before restarted (its engine restarted) and adds its
// new value, as Prometheus's increase() counts it; a series new since prev
// adds nothing (its start is unknown: counted from its next scrape on).
// After a restart of the whole process (fromZero) every series started
// again from zero and adds its new value. ok is false when the counter is
// unknown in either reading.
func fdelta(prev, cur Counter, fromZero bool) (float64, bool) {
	if prev == nil || cur == nil {
		return 0, false
	}
	var d float64
	for k, v := range cur {
		p, seen := prev[k]
		switch {
		case fromZero:
			d += v
		case !seen:
		case v < p:
			d += v
		default:
			d += v - p
		}
	}
	return d, true
}

// count rounds a gauge of requests to a whole number.
func count(v *float64) *uint32 {
	if v == nil || *v < 0 {
		return nil
	}
	n := uint32(min(math.Round(*v), math.MaxUint32))
	return &n
}

// clampRatio keeps a ratio gauge in [0, 1] (an engine may overshoot 1 by
// rounding); a negative one is dropped.
func clampRatio(v *float64) *float64 {
	if v == nil || *v < 0 {
		return nil
	}
	c := min(*v, 1)
	return &c
}

// SampleID is the idempotency key of a sample: a digest of the deployment,
// the replica and sampled_at to the millisecond.
func SampleID(deployment, replica string, at time.Time) string {
	h := sha256.New()
	for _, p := range []string{deployment, replica, strconv.FormatInt(at.UnixMilli(), 10)} {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}
