package workload

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// Defaults of Config fields left at zero.
const (
	DefaultDuration         = 24 * time.Hour
	DefaultTenants          = 8
	DefaultTenantSkew       = 1.2
	DefaultErrorRate        = 0.03
	DefaultDiurnalAmplitude = 0.5
)

// PeakHourUTC is the hour of the day (UTC) with the most traffic.
const PeakHourUTC = 15

// Config shapes a synthetic workload. Zero fields take the defaults above;
// Start and Events are required.
type Config struct {
	// Seed selects the workload; the same Config always gives the same events.
	Seed int64
	// Start is the earliest completed_at. Required.
	Start time.Time
	// Duration is the span of completed_at: events fall in [Start, Start+Duration).
	Duration time.Duration
	// Events is the number of events in the span. Required.
	Events int
	// Tenants is the number of tenants (IDs from TenantIDs).
	Tenants int
	// TenantSkew is the Zipf exponent of tenant shares: tenant k (from 0) has a
	// share proportional to 1/(k+1)^TenantSkew.
	TenantSkew float64
	// Models is the fleet; nil means DefaultModels().
	Models []Model
	// ErrorRate is the mean share of failed requests; negative means none.
	ErrorRate float64
	// DiurnalAmplitude is the relative swing of the day/night cycle: the
	// request rate is 1 + A·cos(2π(hour − PeakHourUTC)/24) times its mean.
	// It must be below 1; negative means a flat rate.
	DiurnalAmplitude float64
	// WeeklyGrowth is the traffic's compound growth per week (0.05: 5% more
	// each week than the week before), on top of the day/night cycle; 0
	// keeps the rate level. It must be in [0, 1].
	WeeklyGrowth float64
}

func (c Config) withDefaults() Config {
	if c.Duration == 0 {
		c.Duration = DefaultDuration
	}
	if c.Tenants == 0 {
		c.Tenants = DefaultTenants
	}
	if c.TenantSkew == 0 {
		c.TenantSkew = DefaultTenantSkew
	}
	if c.Models == nil {
		c.Models = DefaultModels()
	}
	switch {
	case c.ErrorRate == 0:
		c.ErrorRate = DefaultErrorRate
	case c.ErrorRate < 0:
		c.ErrorRate = 0
	}
	switch {
	case c.DiurnalAmplitude == 0:
		c.DiurnalAmplitude = DefaultDiurnalAmplitude
	case c.DiurnalAmplitude < 0:
		c.DiurnalAmplitude = 0
	}
	return c
}

// Validate reports every problem of the configuration, defaults applied.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.Start.IsZero() {
		errs = append(errs, errors.New("start time is required"))
	}
	if c.Duration < 0 {
		errs = append(errs, fmt.Errorf("duration %s: must be positive", c.Duration))
	}
	if c.Events <= 0 {
		errs = append(errs, fmt.Errorf("events %d: must be positive", c.Events))
	}
	if c.Tenants < 0 {
		errs = append(errs, fmt.Errorf("tenants %d: must be positive", c.Tenants))
	}
	if !(c.TenantSkew > 0 && c.TenantSkew <= 10) {
		errs = append(errs, fmt.Errorf("tenant skew %g: must be in (0, 10]", c.TenantSkew))
	}
	if len(c.Models) == 0 {
		errs = append(errs, errors.New("no models"))
	}
	for _, m := range c.Models {
		if err := m.validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if !(c.ErrorRate <= 0.5) {
		errs = append(errs, fmt.Errorf("error rate %g: must be at most 0.5", c.ErrorRate))
	}
	if !(c.DiurnalAmplitude < 1) {
		errs = append(errs, fmt.Errorf("diurnal amplitude %g: must be below 1", c.DiurnalAmplitude))
	}
	if !(c.WeeklyGrowth >= 0 && c.WeeklyGrowth <= 1) {
		errs = append(errs, fmt.Errorf("weekly growth %g: must be in [0, 1]", c.WeeklyGrowth))
	}
	return errors.Join(errs...)
}

// Generator produces the events of one Config. Fill is safe for concurrent
// use; Next and Events keep a cursor and are not.
type Generator struct {
	cfg       Config
	idSeed    uint64
	startNs   int64
	cdf       []float64 // cumulative request intensity at grid points, 0 to 1
	trend     trend     // the weekly growth
	tenants   []tenant
	tenantCDF []float64
	errorCDF  []float64 // cumulative weights of failureMix, 0 to 1
	next      int
}

type tenant struct {
	id         string
	batchShare float64   // share of requests of slo_class "batch"
	modelCDF   []float64 // the tenant's own model mix
}

// failureMix is the relative frequency of each failure status.
// Rate limiting also grows with load (see status).
var failureMix = []struct {
	status meterv1.Status
	weight float64
}{
	{meterv1.Status_STATUS_RATE_LIMITED, 40},
	{meterv1.Status_STATUS_TIMEOUT, 15},
	{meterv1.Status_STATUS_CANCELLED, 15},
	{meterv1.Status_STATUS_CONTEXT_LENGTH, 8},
	{meterv1.Status_STATUS_BAD_REQUEST, 8},
	{meterv1.Status_STATUS_INTERNAL, 6},
	{meterv1.Status_STATUS_OOM, 5},
	{meterv1.Status_STATUS_CUDA, 3},
}

// New checks cfg and prepares a generator.
func New(cfg Config) (*Generator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("workload config: %w", err)
	}
	cfg = cfg.withDefaults()
	cfg.Models = slices.Clone(cfg.Models) // the caller may reuse its slice
	g := &Generator{cfg: cfg, startNs: cfg.Start.UnixNano()}

	// Event IDs depend on everything that places events, so that two different
	// workloads never share an ID (and so never deduplicate each other).
	h := mix64(uint64(cfg.Seed))
	h = mix64(h ^ uint64(g.startNs))
	h = mix64(h ^ uint64(cfg.Duration))
	g.idSeed = mix64(h ^ uint64(cfg.Events))

	g.trend = newTrend(cfg.Start, cfg.Duration, cfg.WeeklyGrowth)
	if cfg.WeeklyGrowth == 0 {
		g.cdf = intensityCDF(cfg.Start, cfg.Duration, cfg.DiurnalAmplitude)
	} else {
		g.cdf = numericCDF(cfg.Start, cfg.Duration, func(ns int64) float64 {
			return dayCycle(ns, cfg.DiurnalAmplitude) * g.trend.at(ns)
		})
	}

	// Tenant traits depend on the seed only.
	r := newRNG(uint64(cfg.Seed), 1<<63)
	shares := make([]float64, cfg.Tenants)
	g.tenants = make([]tenant, cfg.Tenants)
	for k, id := range TenantIDs(cfg.Tenants) {
		shares[k] = 1 / math.Pow(float64(k+1), cfg.TenantSkew)
		t := tenant{id: id, batchShare: 0.02 + 0.13*r.float64()}
		if r.float64() < 0.15 {
			t.batchShare = 0.6 + 0.3*r.float64()
		}
		w := make([]float64, len(cfg.Models))
		for j, m := range cfg.Models {
			w[j] = m.Weight * math.Exp(0.8*r.norm())
			if j == k%len(cfg.Models) {
				w[j] *= 3
			}
		}
		t.modelCDF = cumulative(w)
		g.tenants[k] = t
	}
	g.tenantCDF = cumulative(shares)
	w := make([]float64, len(failureMix))
	for i, f := range failureMix {
		w[i] = f.weight
	}
	g.errorCDF = cumulative(w)
	return g, nil
}

// Len is the number of events, Config.Events.
func (g *Generator) Len() int { return g.cfg.Events }

// Next returns a new message holding the next event, or nil after the last.
func (g *Generator) Next() *meterv1.InferenceEvent {
	if g.next >= g.cfg.Events {
		return nil
	}
	ev := new(meterv1.InferenceEvent)
	g.Fill(ev, g.next)
	g.next++
	return ev
}

// Events returns the next n events (fewer at the end), each a new message.
func (g *Generator) Events(n int) []*meterv1.InferenceEvent {
	n = max(0, min(n, g.cfg.Events-g.next))
	out := make([]*meterv1.InferenceEvent, n)
	for i := range out {
		out[i] = g.Next()
	}
	return out
}

// Fill overwrites every field of ev with event i, 0 ≤ i < Len(); it panics
// outside that range. Events are in completed_at order: event i never
// completes after event i+1. Fill reuses the optional fields, timestamps and
// labels map already in ev, so refilling one message mostly allocates just
// the string holding both IDs; do not keep pointers into ev across calls.
func (g *Generator) Fill(ev *meterv1.InferenceEvent, i int) {
	if i < 0 || i >= g.cfg.Events {
		panic(fmt.Sprintf("workload: event index %d out of range [0, %d)", i, g.cfg.Events))
	}
	r := newRNG(g.idSeed, uint64(i))
	// Stratified sampling of the day/night process: event i falls in the
	// i-th of Events equal slices of cumulative intensity, which keeps the
	// events in time order and lets any one be made on its own.
	u := (float64(i) + r.float64()) / float64(g.cfg.Events)
	completedNs := g.startNs + g.offset(u)
	completedNs -= completedNs % 1000 // microseconds, as engines report
	if completedNs < g.startNs {
		completedNs += 1000
	}
	load := g.load(completedNs)

	t := &g.tenants[r.pick(g.tenantCDF)]
	m := &g.cfg.Models[r.pick(t.modelCDF)]
	batch := r.float64() < t.batchShare
	streaming := !batch && r.float64() < 0.92
	endpoint := "/v1/chat/completions"
	if r.float64() < 0.12 {
		endpoint = "/v1/completions"
	}
	node := ""
	if len(m.Nodes) > 0 {
		node = m.Nodes[r.intN(len(m.Nodes))]
	}
	status := g.status(&r, load)
	prompt := clampTokens(r.logNormal(m.PromptMedian, m.PromptSigma), 1, m.ContextLength)
	output := clampTokens(r.logNormal(m.OutputMedian, m.OutputSigma), 1, m.MaxOutputTokens)
	req := simulate(&r, m, status, prompt, output, batch, load)

	hi := mix64(g.idSeed + uint64(i)*0x9e3779b97f4a7c15) // distinct for distinct i
	lo := mix64(hi ^ 0x243f6a8885a308d3)
	req.write(ev, eventMeta{
		ids: formatIDs(hi, lo, mix64(lo)), tenant: t.id, model: m, node: node,
		batch: batch, streaming: streaming, endpoint: endpoint, completedNs: completedNs,
	})
}

// status draws the outcome of a request; rate limiting grows with load.
func (g *Generator) status(r *rng, load float64) meterv1.Status {
	u := r.float64()
	if g.cfg.ErrorRate == 0 {
		return meterv1.Status_STATUS_OK
	}
	w0 := g.errorCDF[0] // rate limiting's share at mean load
	rl := w0 * load
	if u >= g.cfg.ErrorRate*(1+rl-w0) {
		return meterv1.Status_STATUS_OK
	}
	u /= g.cfg.ErrorRate
	if u < rl {
		return meterv1.Status_STATUS_RATE_LIMITED
	}
	// The other failures in proportion to their weights.
	v := w0 + (u - rl)
	for i := 1; i < len(failureMix); i++ {
		if v < g.errorCDF[i] {
			return failureMix[i].status
		}
	}
	return failureMix[len(failureMix)-1].status
}

// intensityCDF tabulates the normalized cumulative request intensity
// Λ(x)/Λ(D) over [0, D] on an even grid, with the closed form of
// ∫(1 + A·cos(2π(t − peak)/day)) dt.
func intensityCDF(start time.Time, d time.Duration, amp float64) []float64 {
	k := min(max(int(d/time.Minute), 256), 1<<16)
	const day = 86400.0
	sod := float64(start.UTC().Sub(start.UTC().Truncate(24*time.Hour))) / 1e9
	phi0 := 2 * math.Pi * (sod - PeakHourUTC*3600) / day
	sinPhi0 := math.Sin(phi0)
	dSec := d.Seconds()
	lambda := func(x float64) float64 {
		return x + amp*day/(2*math.Pi)*(math.Sin(phi0+2*math.Pi*x/day)-sinPhi0)
	}
	total := lambda(dSec)
	cdf := make([]float64, k+1)
	for j := 1; j < k; j++ {
		cdf[j] = lambda(dSec*float64(j)/float64(k)) / total
	}
	cdf[k] = 1
	return cdf
}

// offset inverts the intensity CDF: the time after Start, in nanoseconds, by
// which a share u ∈ [0, 1) of the events has completed. It is non-decreasing
// in u and below Duration.
func (g *Generator) offset(u float64) int64 {
	cdf := g.cdf
	lo, hi := 0, len(cdf)-1 // cdf[lo] ≤ u < cdf[hi]
	for hi-lo > 1 {
		m := int(uint(lo+hi) >> 1)
		if cdf[m] <= u {
			lo = m
		} else {
			hi = m
		}
	}
	frac := (u - cdf[lo]) / (cdf[hi] - cdf[lo])
	step := float64(g.cfg.Duration) / float64(len(cdf)-1)
	off := int64((float64(lo) + frac) * step)
	return min(max(off, 0), int64(g.cfg.Duration)-1)
}

// load is the request intensity at a time relative to its mean (1).
func (g *Generator) load(ns int64) float64 {
	return dayCycle(ns, g.cfg.DiurnalAmplitude) * g.trend.at(ns)
}

// dayCycle is the day/night factor of the request rate at a time (Unix
// nanoseconds): 1 + amp·cos(2π(hour − PeakHourUTC)/24).
func dayCycle(ns int64, amp float64) float64 {
	sod := float64(((ns%86400e9)+86400e9)%86400e9) / 1e9
	return 1 + amp*math.Cos(2*math.Pi*(sod-PeakHourUTC*3600)/86400)
}

// trend is the weekly growth of the rate over a span, as a factor whose
// mean over the span is 1: exp(k·t) / mean, with k = ln(1 + growth) per week.
type trend struct {
	startNs int64
	k, norm float64 // per nanosecond; 1 / the mean of exp(k·t) over the span
}

func newTrend(start time.Time, d time.Duration, growth float64) trend {
	t := trend{startNs: start.UnixNano(), norm: 1}
	if growth > 0 && d > 0 {
		t.k = math.Log1p(growth) / float64(7*24*time.Hour)
		x := t.k * float64(d)
		t.norm = x / math.Expm1(x)
	}
	return t
}

// at is the growth factor at a time (Unix nanoseconds).
func (t trend) at(ns int64) float64 {
	if t.k == 0 {
		return 1
	}
	return t.norm * math.Exp(t.k*float64(ns-t.startNs))
}

// numericCDF tabulates the normalized cumulative intensity of rate over
// [0, d) from start on an even grid (a minute or finer), by the midpoint
// rule.
func numericCDF(start time.Time, d time.Duration, rate func(ns int64) float64) []float64 {
	k := min(max(int(d/time.Minute), 256), 1<<16)
	step := float64(d) / float64(k)
	cdf := make([]float64, k+1)
	s := start.UnixNano()
	for j := 1; j <= k; j++ {
		cdf[j] = cdf[j-1] + rate(s+int64((float64(j)-0.5)*step))
	}
	total := cdf[k]
	for j := range cdf {
		cdf[j] /= total
	}
	cdf[k] = 1
	return cdf
}

func clampTokens(x float64, lo, hi int64) int64 {
	return min(max(int64(math.Round(x)), lo), hi)
}

// formatIDs returns one string holding the event ID (36 bytes, UUID-shaped
// from hi and lo) followed by the request ID ("chatcmpl-" and 16 hex digits
// of req), so that both cost one allocation.
func formatIDs(hi, lo, req uint64) string {
	var b [36 + 9 + 16]byte
	putUUID(b[:36], hi, lo)
	copy(b[36:], "chatcmpl-")
	for i := range 16 {
		b[45+i] = hexDigits[req>>(60-4*i)&0xf]
	}
	return string(b[:])
}
