package otlp

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	// Registers the proto codec that wireCodec wraps.
	_ "google.golang.org/grpc/encoding/proto"

	// Registers the gzip decompressor: OTLP gRPC exporters may compress.
	_ "google.golang.org/grpc/encoding/gzip"

	"tokenmeter/ingest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// Errors an Authorizer wraps: the receivers answer them with 401 and 403
// (gRPC Unauthenticated and PermissionDenied) and the error's text.
var (
	ErrUnauthenticated  = errors.New("unauthenticated")
	ErrPermissionDenied = errors.New("permission denied")
)

// Authorizer checks the Authorization header of an export ("Bearer <key>",
// "" when there is none). It returns the tenant the key is bound to ("" for
// none), or an error wrapping ErrUnauthenticated or ErrPermissionDenied.
type Authorizer interface {
	AuthorizePublish(authorization string) (keyTenant string, err error)
}

// Publisher validates events and publishes the valid ones;
// *ingest.Publisher implements it. An error wrapping ingest.ErrUnavailable
// means nothing was published and the export may be retried.
type Publisher interface {
	Publish(ctx context.Context, events []*meterv1.InferenceEvent) (int, []ingest.Rejected, error)
}

var _ Publisher = (*ingest.Publisher)(nil)

// Config configures the receivers.
type Config struct {
	// GRPCAddr and HTTPAddr are the listen addresses of OTLP/gRPC and
	// OTLP/HTTP; empty leaves that receiver off; port 0 picks a free one.
	GRPCAddr, HTTPAddr string
	// MaxRequestBytes bounds a request body or gRPC message, after
	// decompression too. Default 16 MiB.
	MaxRequestBytes int
	// MaxSpans bounds the spans of one export request, as the event API's
	// batch limit bounds its events: they are counted as they are read,
	// and the request is refused (HTTP 400, gRPC InvalidArgument: the
	// OTLP answer to bad data, which exporters do not retry) at the first
	// span past the limit, before it is decoded. Default DefaultMaxSpans.
	MaxSpans int
	// MaxInFlight bounds the OTLP/HTTP exports converted at once (others
	// wait for a slot once their body is read: a slot is held for CPU work
	// only, never while a client sends) and the concurrent OTLP/gRPC
	// streams of one connection. Default DefaultMaxInFlight.
	MaxInFlight int
	// MaxBufferedBytes bounds the OTLP/HTTP body bytes held at once by
	// the exports being read, converted or published. A body holds only
	// the bytes that have arrived (its buffer grows with them), so a slow
	// client holds little and delays only itself; an export whose body
	// would pass the bound is answered 503 with Retry-After, which
	// exporters retry. Default MaxInFlight × MaxRequestBytes.
	MaxBufferedBytes int64
	// Mapping says how spans become events.
	Mapping Mapping
	// TLS, when set, serves both receivers with TLS only. Nil: plaintext.
	TLS *tls.Config
}

// Validate reports every problem of the configuration at once.
func (c Config) Validate() error {
	var errs []error
	if c.GRPCAddr == "" && c.HTTPAddr == "" {
		errs = append(errs, errors.New("otlp: no gRPC nor HTTP address"))
	}
	for _, a := range []string{c.GRPCAddr, c.HTTPAddr} {
		if a == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("otlp: address %q: %w", a, err))
		}
	}
	if c.MaxRequestBytes < 0 || c.MaxSpans < 0 || c.MaxBufferedBytes < 0 {
		errs = append(errs, errors.New("otlp: the request size, span and buffered bytes limits must not be negative"))
	}
	if strings.TrimSpace(c.Mapping.TenantAttribute) != c.Mapping.TenantAttribute {
		errs = append(errs, fmt.Errorf("otlp: tenant attribute %q has spaces at an end", c.Mapping.TenantAttribute))
	}
	return errors.Join(errs...)
}

// DefaultMaxInFlight is Config.MaxInFlight's default.
const DefaultMaxInFlight = 16

// DefaultMaxSpans is Config.MaxSpans' default: the event API's default
// batch limit.
const DefaultMaxSpans = 10_000

// Receiver serves OTLP trace exports over gRPC and HTTP.
type Receiver struct {
	cfg     Config
	pub     Publisher
	auth    Authorizer
	logger  *slog.Logger
	metrics *metrics
	// bodies are the buffers of OTLP/gRPC messages, reused.
	bodies sync.Pool
	// buffers are the buffers of OTLP/HTTP bodies, reused.
	buffers bodyBuffers
	// gunzips are gzip readers of request bodies, reused.
	gunzips sync.Pool
	// slots holds a token per OTLP/HTTP export being converted.
	slots chan struct{}
	// buffered holds the OTLP/HTTP body bytes of the exports in progress,
	// at most Config.MaxBufferedBytes.
	buffered *semaphore.Weighted

	grpc   *grpc.Server
	http   *http.Server
	grpcLn net.Listener
	httpLn net.Listener
}

// New listens on the configured addresses; Run serves.
func New(cfg Config, pub Publisher, auth Authorizer, reg prometheus.Registerer, logger *slog.Logger) (*Receiver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if pub == nil || auth == nil {
		return nil, errors.New("otlp: a publisher and an authorizer are required")
	}
	if cfg.MaxRequestBytes == 0 {
		cfg.MaxRequestBytes = 16 << 20
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.MaxSpans == 0 {
		cfg.MaxSpans = DefaultMaxSpans
	}
	if cfg.MaxBufferedBytes == 0 {
		cfg.MaxBufferedBytes = int64(cfg.MaxInFlight) * int64(cfg.MaxRequestBytes)
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	r := &Receiver{cfg: cfg, pub: pub, auth: auth, logger: logger, metrics: m,
		bodies: sync.Pool{New: func() any { return new(bytes.Buffer) }}, slots: make(chan struct{}, cfg.MaxInFlight),
		buffered: semaphore.NewWeighted(cfg.MaxBufferedBytes)}
	if cfg.GRPCAddr != "" {
		if r.grpcLn, err = net.Listen("tcp", cfg.GRPCAddr); err != nil {
			return nil, fmt.Errorf("otlp: listen gRPC: %w", err)
		}
		creds := insecure.NewCredentials()
		if cfg.TLS != nil {
			creds = credentials.NewTLS(cfg.TLS)
		}
		r.grpc = grpc.NewServer(grpc.Creds(creds), grpc.MaxRecvMsgSize(cfg.MaxRequestBytes), grpc.InTapHandle(r.authTap),
			grpc.MaxConcurrentStreams(uint32(cfg.MaxInFlight)),
			grpc.ForceServerCodecV2(wireCodec{CodecV2: encoding.GetCodecV2(protoCodec), r: r}))
		(&traceService{r: r}).register(r.grpc)
	}
	if cfg.HTTPAddr != "" {
		if r.httpLn, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
			if r.grpcLn != nil {
				r.grpcLn.Close()
			}
			return nil, fmt.Errorf("otlp: listen HTTP: %w", err)
		}
		if cfg.TLS != nil {
			c := cfg.TLS.Clone()
			for _, p := range []string{"h2", "http/1.1"} {
				if !slices.Contains(c.NextProtos, p) {
					c.NextProtos = append(c.NextProtos, p)
				}
			}
			r.httpLn = tls.NewListener(r.httpLn, c)
		}
		mux := http.NewServeMux()
		mux.Handle(TracesPath, r.HTTPHandler())
		r.http = &http.Server{
			Handler:           mux,
			ReadHeaderTimeout: 10 * time.Second,
			ReadTimeout:       time.Minute,
			WriteTimeout:      2 * time.Minute,
			IdleTimeout:       2 * time.Minute,
			ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		}
	}
	return r, nil
}

// GRPCAddr is the OTLP/gRPC listener's address, "" when it is off.
func (r *Receiver) GRPCAddr() string {
	if r.grpcLn == nil {
		return ""
	}
	return r.grpcLn.Addr().String()
}

// HTTPAddr is the OTLP/HTTP listener's address, "" when it is off.
func (r *Receiver) HTTPAddr() string {
	if r.httpLn == nil {
		return ""
	}
	return r.httpLn.Addr().String()
}

// Run serves until ctx is cancelled, then stops accepting exports and waits
// for those in flight (15 s at most).
func (r *Receiver) Run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	if r.grpc != nil {
		g.Go(func() error {
			if err := r.grpc.Serve(r.grpcLn); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				return fmt.Errorf("otlp: serve gRPC: %w", err)
			}
			return nil
		})
	}
	if r.http != nil {
		g.Go(func() error {
			if err := r.http.Serve(r.httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("otlp: serve HTTP: %w", err)
			}
			return nil
		})
	}
	g.Go(func() error {
		<-gctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		defer cancel()
		var err error
		if r.http != nil {
			err = r.http.Shutdown(sctx)
		}
		if r.grpc != nil {
			stopped := make(chan struct{})
			go func() { r.grpc.GracefulStop(); close(stopped) }()
			select {
			case <-stopped:
			case <-sctx.Done():
				r.grpc.Stop()
			}
		}
		return err
	})
	return g.Wait()
}

// protoCodec is the name of gRPC's protobuf codec.
const protoCodec = "proto"

// maxPooledBody bounds the buffers kept for reuse: an unusually large
// message's buffer is left to the collector.
const maxPooledBody = 4 << 20

// putBody gives a request body's buffer back to the pool.
func (r *Receiver) putBody(buf *bytes.Buffer) {
	if buf.Cap() <= maxPooledBody {
		buf.Reset()
		r.bodies.Put(buf)
	}
}

// errBusy is an OTLP/HTTP export refused because the bodies of the
// exports in progress hold Config.MaxBufferedBytes: retryable, like
// errUnavailable.
var errBusy = errors.New("too many export bytes in progress: nothing of this export was accepted; retry")

// errUnavailable is an export whose events Kafka did not take: OTLP's
// retryable answer (503, gRPC Unavailable).
var errUnavailable = errors.New("event log unavailable: nothing of this export was accepted; retry (retries are safe: events are deduplicated by trace and span id)")

// export converts and publishes one authorized export request.
func (r *Receiver) export(ctx context.Context, req *coltracepb.ExportTraceServiceRequest, keyTenant string) (*coltracepb.ExportTraceServiceResponse, error) {
	return r.publish(ctx, r.cfg.Mapping.Convert(req, keyTenant))
}

// publish publishes the events of a converted export and answers it.
func (r *Receiver) publish(ctx context.Context, b Batch) (*coltracepb.ExportTraceServiceResponse, error) {
	rejected := b.Rejected
	accepted := 0
	if len(b.Events) > 0 {
		n, invalid, err := r.pub.Publish(ctx, b.Events)
		if errors.Is(err, ingest.ErrUnavailable) {
			r.logger.Warn("OTLP export not published", "error", err)
			return nil, errUnavailable
		}
		if err != nil {
			return nil, fmt.Errorf("publish %d events: %w", len(b.Events), err)
		}
		accepted = n
		for _, v := range invalid {
			reason, msg := ingest.ReasonInvalidValue, "invalid event"
			if v.Err != nil {
				reason, msg = v.Err.Reason, v.Err.Message
			}
			rejected = append(rejected, Rejection{Span: b.Spans[v.Index], Reason: reason, Message: msg})
		}
	}
	r.metrics.spans.WithLabelValues(ResultAccepted).Add(float64(accepted))
	r.metrics.spans.WithLabelValues(ResultRejected).Add(float64(len(rejected)))
	r.metrics.spans.WithLabelValues(ResultNotGenAI).Add(float64(b.NotGenAI))
	r.metrics.spans.WithLabelValues(ResultNotInference).Add(float64(b.NotInference))
	for _, rej := range rejected {
		r.metrics.rejected.WithLabelValues(rej.Reason).Inc()
	}
	resp := &coltracepb.ExportTraceServiceResponse{}
	if len(rejected) > 0 {
		resp.PartialSuccess = &coltracepb.ExportTracePartialSuccess{
			RejectedSpans: int64(len(rejected)),
			ErrorMessage:  summarize(rejected),
		}
	}
	return resp, nil
}

// maxReasonsShown bounds the partial-success message: one example per
// reason, for this many reasons.
const maxReasonsShown = 8

// summarize is the partial-success error message: per reason (most spans
// first), the count and one span's message.
func summarize(rejected []Rejection) string {
	type group struct {
		reason string
		n      int
		first  Rejection
	}
	var groups []*group
	by := map[string]*group{}
	for _, r := range rejected {
		g := by[r.Reason]
		if g == nil {
			g = &group{reason: r.Reason, first: r}
			by[r.Reason] = g
			groups = append(groups, g)
		}
		g.n++
	}
	sort.SliceStable(groups, func(i, j int) bool { return groups[i].n > groups[j].n })
	var b strings.Builder
	fmt.Fprintf(&b, "%d GenAI spans rejected", len(rejected))
	for i, g := range groups {
		if i == maxReasonsShown {
			fmt.Fprintf(&b, "; and %d more reasons", len(groups)-i)
			break
		}
		fmt.Fprintf(&b, "; %s: %d (e.g. span %s: %s)", g.reason, g.n, g.first.Span, g.first.Message)
	}
	return b.String()
}

type metrics struct {
	spans    *prometheus.CounterVec
	rejected *prometheus.CounterVec
	exports  *prometheus.CounterVec
	buffered prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		spans: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meter_otlp_spans_total",
			Help: "Spans received over OTLP, by result: accepted (published as events), rejected (GenAI inference spans that could not become events), not_genai and not_inference (ignored).",
		}, []string{"result"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meter_otlp_spans_rejected_total",
			Help: "GenAI spans received over OTLP and rejected, by reason code.",
		}, []string{"reason"}),
		exports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meter_otlp_exports_total",
			Help: "OTLP export requests, by protocol (grpc, http) and answer (ok, bad_request, unauthenticated, permission_denied, too_large, unsupported, busy, unavailable, internal).",
		}, []string{"protocol", "answer"}),
		buffered: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meter_otlp_http_buffered_bytes",
			Help: "Bytes reserved by the bodies of the OTLP/HTTP exports being read, converted or published (at most the receiver's MaxBufferedBytes; beyond it exports are answered 503).",
		}),
	}
	for _, c := range []prometheus.Collector{m.spans, m.rejected, m.exports, m.buffered} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register OTLP metrics: %w", err)
		}
	}
	for _, res := range []string{ResultAccepted, ResultRejected, ResultNotGenAI, ResultNotInference} {
		m.spans.WithLabelValues(res)
	}
	return m, nil
}
