package workload

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// ErrMalformedRow is wrapped by every *RowError.
var ErrMalformedRow = errors.New("malformed row")

// RowError says which line of a trace could not be read, and why.
// errors.Is(err, ErrMalformedRow) holds for every RowError.
type RowError struct {
	// Line is the 1-based line number in the input.
	Line int
	// Err is the problem, e.g. a *strconv.NumError or a *time.ParseError.
	Err error
}

func (e *RowError) Error() string { return fmt.Sprintf("line %d: %v", e.Line, e.Err) }

// Unwrap returns ErrMalformedRow and the underlying problem.
func (e *RowError) Unwrap() []error { return []error{ErrMalformedRow, e.Err} }

// azureHeader is the header of the Azure LLM inference traces
// (AzurePublicDataset, AzureLLMInferenceTrace_{code,conv}*.csv).
var azureHeader = []string{"TIMESTAMP", "ContextTokens", "GeneratedTokens"}

// azureTimeLayouts are the accepted TIMESTAMP forms: the traces' own
// "2023-11-16 18:15:46.6805900" (any number of fractional digits, UTC unless
// a zone follows) and RFC 3339.
var azureTimeLayouts = []string{
	"2006-01-02 15:04:05.999999999",
	"2006-01-02 15:04:05.999999999Z07:00",
	time.RFC3339Nano,
	"2006-01-02T15:04:05.999999999",
}

// AzureConfig says how rows of an Azure trace become events. The traces hold
// only arrival time and token counts; tenant, model, deployment and
// latencies are made up deterministically from Seed and the row.
type AzureConfig struct {
	// Seed varies the made-up parts and the event IDs. Reading the same trace
	// with the same seed gives the same events, so a replay can be repeated
	// without double counting.
	Seed int64
	// Tenant, if set, owns every request; otherwise requests are spread over
	// Tenants tenants (TenantIDs) with Zipf-skewed shares.
	Tenant string
	// Tenants is the number of tenants when Tenant is empty; 0 means
	// DefaultTenants.
	Tenants int
	// Models is the fleet requests are spread over by weight; nil means
	// DefaultModels().
	Models []Model
	// Shift is added to every timestamp.
	Shift time.Duration
	// EndAt, if set, shifts the trace (on top of Shift) so that its latest
	// completed_at is EndAt, e.g. now, so that a replay lands in a recent
	// query window. Only ReadAzureCSV can honour it; NewAzureReader refuses
	// it: find the shift with AzureSpan instead.
	EndAt time.Time
}

func (c AzureConfig) withDefaults() AzureConfig {
	if c.Tenants == 0 {
		c.Tenants = DefaultTenants
	}
	if c.Models == nil {
		c.Models = DefaultModels()
	}
	return c
}

// Validate reports every problem of the configuration.
func (c AzureConfig) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.Tenant == "" && c.Tenants < 0 {
		errs = append(errs, fmt.Errorf("tenants %d: must be positive", c.Tenants))
	}
	if len(c.Models) == 0 {
		errs = append(errs, errors.New("no models"))
	}
	for _, m := range c.Models {
		if err := m.validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// AzureReader reads events from an Azure LLM inference trace, one row at a
// time. Each event's received_at is the row's TIMESTAMP (the request's
// arrival) and its completed_at follows from the made-up latencies, so
// events come in arrival order, not strictly in completed_at order.
type AzureReader struct {
	cfg       AzureConfig
	csv       *csv.Reader
	seed      uint64
	tenants   []string
	tenantCDF []float64
	modelCDF  []float64
}

// NewAzureReader reads and checks the header of a trace.
func NewAzureReader(r io.Reader, cfg AzureConfig) (*AzureReader, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("azure trace config: %w", err)
	}
	if !cfg.EndAt.IsZero() {
		return nil, errors.New("azure trace config: EndAt needs the whole trace: use ReadAzureCSV, or AzureSpan and Shift")
	}
	cfg = cfg.withDefaults()
	cfg.Models = slices.Clone(cfg.Models)
	a := &AzureReader{cfg: cfg, csv: csv.NewReader(r), seed: mix64(uint64(cfg.Seed) ^ 0x41a7)}
	a.csv.FieldsPerRecord = -1 // counted here, to say what is wrong
	a.csv.ReuseRecord = true
	a.csv.TrimLeadingSpace = true
	if cfg.Tenant == "" {
		a.tenants = TenantIDs(cfg.Tenants)
		w := make([]float64, cfg.Tenants)
		for k := range w {
			w[k] = 1 / math.Pow(float64(k+1), DefaultTenantSkew)
		}
		a.tenantCDF = cumulative(w)
	}
	w := make([]float64, len(cfg.Models))
	for j, m := range cfg.Models {
		w[j] = m.Weight
	}
	a.modelCDF = cumulative(w)

	rec, err := a.csv.Read()
	if errors.Is(err, io.EOF) {
		return nil, &RowError{Line: 1, Err: errors.New("empty input, want the header TIMESTAMP,ContextTokens,GeneratedTokens")}
	}
	if err != nil {
		return nil, a.rowError(err)
	}
	ok := len(rec) == len(azureHeader)
	for i := 0; ok && i < len(rec); i++ {
		ok = strings.EqualFold(strings.TrimSpace(strings.TrimPrefix(rec[i], "\ufeff")), azureHeader[i])
	}
	if !ok {
		line, _ := a.csv.FieldPos(0)
		return nil, &RowError{Line: line, Err: fmt.Errorf("header %q, want TIMESTAMP,ContextTokens,GeneratedTokens", strings.Join(rec, ","))}
	}
	return a, nil
}

// rowError turns an error of the CSV reader into a *RowError.
func (a *AzureReader) rowError(err error) error {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		return &RowError{Line: pe.Line, Err: pe.Err}
	}
	return fmt.Errorf("read azure trace: %w", err)
}

// Next returns the next row's event as a new message, or io.EOF after the
// last row. A malformed row is a *RowError; reading may go on after it.
func (a *AzureReader) Next() (*meterv1.InferenceEvent, error) {
	ev := new(meterv1.InferenceEvent)
	if err := a.Read(ev); err != nil {
		return nil, err
	}
	return ev, nil
}

// Read overwrites ev with the next row's event, reusing ev's storage like
// Generator.Fill. It returns io.EOF after the last row and a *RowError for a
// malformed row, after which reading may go on.
func (a *AzureReader) Read(ev *meterv1.InferenceEvent) error {
	rec, err := a.csv.Read()
	if errors.Is(err, io.EOF) {
		return io.EOF
	}
	if err != nil {
		return a.rowError(err)
	}
	line, _ := a.csv.FieldPos(0)
	if len(rec) != 3 {
		return &RowError{Line: line, Err: fmt.Errorf("%d fields, want 3 (TIMESTAMP,ContextTokens,GeneratedTokens)", len(rec))}
	}
	arrival, err := parseAzureTime(strings.TrimSpace(rec[0]))
	if err != nil {
		return &RowError{Line: line, Err: fmt.Errorf("TIMESTAMP: %w", err)}
	}
	var tokens [2]int64
	for i, name := range azureHeader[1:] {
		n, err := strconv.ParseInt(strings.TrimSpace(rec[i+1]), 10, 64)
		if err != nil {
			return &RowError{Line: line, Err: fmt.Errorf("%s: %w", name, err)}
		}
		if n < 0 {
			return &RowError{Line: line, Err: fmt.Errorf("%s: negative count %d", name, n)}
		}
		tokens[i] = n
	}

	// The row's content and line make its identity: the same trace gives the
	// same IDs, different traces different ones.
	var buf [128]byte
	key := strconv.AppendInt(buf[:0], int64(line), 10)
	for _, f := range rec {
		key = append(append(key, '|'), f...)
	}
	hi := mix64(a.seed ^ fnv1a(key))
	lo := mix64(hi ^ 0x243f6a8885a308d3)
	r := newRNG(hi, lo)

	tenant := a.cfg.Tenant
	if tenant == "" {
		tenant = a.tenants[r.pick(a.tenantCDF)]
	}
	m := &a.cfg.Models[r.pick(a.modelCDF)]
	node := ""
	if len(m.Nodes) > 0 {
		node = m.Nodes[r.intN(len(m.Nodes))]
	}
	req := simulate(&r, m, meterv1.Status_STATUS_OK, tokens[0], tokens[1], false, 1)
	receivedNs := arrival.Add(a.cfg.Shift).UnixNano()
	completedNs := receivedNs + int64(math.Round(req.e2e*1e6))
	req.write(ev, eventMeta{
		ids: formatIDs(hi, lo, mix64(lo)), tenant: tenant, model: m, node: node,
		streaming: true, endpoint: "/v1/chat/completions", completedNs: completedNs,
	})
	ev.Labels["source"] = "azure-trace"
	return nil
}

func parseAzureTime(s string) (time.Time, error) {
	var first error
	for _, layout := range azureTimeLayouts {
		t, err := time.Parse(layout, s)
		if err == nil {
			return t.UTC(), nil
		}
		if first == nil {
			first = err
		}
	}
	return time.Time{}, first
}

// ReadAzureCSV reads a whole Azure trace (header
// TIMESTAMP,ContextTokens,GeneratedTokens) into events, applying cfg.EndAt.
// It stops at the first malformed row with a *RowError naming its line.
func ReadAzureCSV(r io.Reader, cfg AzureConfig) ([]*meterv1.InferenceEvent, error) {
	endAt := cfg.EndAt
	cfg.EndAt = time.Time{}
	a, err := NewAzureReader(r, cfg)
	if err != nil {
		return nil, err
	}
	var out []*meterv1.InferenceEvent
	var last time.Time
	for {
		ev, err := a.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if t := ev.GetCompletedAt().AsTime(); t.After(last) {
			last = t
		}
		out = append(out, ev)
	}
	if !endAt.IsZero() && len(out) > 0 {
		shift := endAt.Sub(last)
		for _, ev := range out {
			ev.CompletedAt = setTime(ev.CompletedAt, ev.GetCompletedAt().AsTime().Add(shift).UnixNano())
			ev.ReceivedAt = setTime(ev.ReceivedAt, ev.GetReceivedAt().AsTime().Add(shift).UnixNano())
		}
	}
	return out, nil
}

// Span summarizes a trace: how many events and the range of completed_at.
type Span struct {
	// Events is the number of rows read.
	Events int
	// First and Last are the earliest and latest completed_at.
	First, Last time.Time
}

// AzureSpan reads a whole trace and reports its span, so that a streaming
// reader can be given the Shift that ends the trace at a chosen time:
// Shift = end − span.Last (with a cfg whose Shift is zero).
func AzureSpan(r io.Reader, cfg AzureConfig) (Span, error) {
	a, err := NewAzureReader(r, cfg)
	if err != nil {
		return Span{}, err
	}
	var s Span
	var ev meterv1.InferenceEvent
	for {
		err := a.Read(&ev)
		if errors.Is(err, io.EOF) {
			return s, nil
		}
		if err != nil {
			return s, err
		}
		t := ev.GetCompletedAt().AsTime()
		if s.Events == 0 || t.Before(s.First) {
			s.First = t
		}
		if s.Events == 0 || t.After(s.Last) {
			s.Last = t
		}
		s.Events++
	}
}

// fnv1a is the 64-bit FNV-1a hash of b.
func fnv1a(b []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return h
}
