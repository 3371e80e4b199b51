package api

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// Config configures the listeners and request limits.
type Config struct {
	// GRPCAddr and HTTPAddr are the listen addresses; port 0 picks a free one.
	GRPCAddr string
	HTTPAddr string
	// MaxBatchEvents bounds the events of one publish request. Default 10,000.
	MaxBatchEvents int
	// MaxRequestBytes bounds a request body or gRPC message. Default 16 MiB.
	MaxRequestBytes int
	// Pprof serves net/http/pprof under /debug/pprof/ (off by default).
	Pprof bool
	// ReadTimeout bounds reading a whole HTTP request, body included
	// (default 1m); WriteTimeout bounds a request from the end of its headers
	// to the end of the response (default 2m); IdleTimeout closes a keep-alive
	// connection idle this long (default 2m).
	ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// ExportChunkBytes is the size of the chunks billing exports are
	// streamed in (default DefaultExportChunkBytes).
	ExportChunkBytes int
	// TenantCost shows tenant keys the provider's cost of serving their
	// tenant (seesCost): the allocated GPU cost in /v1/cost, and the
	// finance parts of their statements and exports. Off, they see their
	// usage and charges only; finance and admin keys see everything.
	TenantCost bool
	// TLS, when set, serves both listeners with TLS only: the certificate
	// (tlsfiles reloads it when its files change) and, for mutual TLS, the
	// client verification. Nil serves plaintext.
	TLS *tls.Config
}

// Validate reports every problem of the configuration at once.
func (c Config) Validate() error {
	var errs []error
	if c.GRPCAddr == "" {
		errs = append(errs, errors.New("api: no gRPC address"))
	}
	if c.HTTPAddr == "" {
		errs = append(errs, errors.New("api: no HTTP address"))
	}
	if c.MaxBatchEvents < 0 || c.MaxRequestBytes < 0 {
		errs = append(errs, errors.New("api: limits must not be negative"))
	}
	if c.ReadTimeout < 0 || c.WriteTimeout < 0 || c.IdleTimeout < 0 {
		errs = append(errs, errors.New("api: HTTP timeouts must not be negative"))
	}
	if c.ExportChunkBytes < 0 {
		errs = append(errs, errors.New("api: the export chunk size must not be negative"))
	}
	return errors.Join(errs...)
}

// Services are the backends of the API. A nil Services serves only the
// operational endpoints (a process running only ingest or rollup roles).
type Services struct {
	Keys      *Keys
	Publisher Publisher
	Usage     UsageReader
	// Rollups serves latency, goodput and traffic; nil leaves them unregistered.
	Rollups RollupReader
	// Cost serves cost and GPU usage, with the currency and default
	// policies of the price book in force from Prices; nil leaves them
	// unregistered.
	Cost CostReader
	// Prices keeps the price books; nil: Cost's own, when it keeps them.
	Prices PriceBookStore
	// Admin manages SLO sets and price books; nil leaves it unregistered.
	Admin AdminStore
	// Billing serves billing periods, closes, statements and exports; nil
	// leaves it unregistered.
	Billing Billing
	// Reports serves the capacity report, with the currency of the price
	// book in force from Prices; nil leaves it unregistered.
	Reports ReportReader
	// Engine serves engine stats; nil leaves them unregistered.
	Engine EngineReader
	// UsageMetrics serves the business metrics for Prometheus on
	// UsageMetricsPath to finance and admin keys (package usagemetrics);
	// nil leaves the path unrouted (404).
	UsageMetrics http.Handler
}

// Server is the gRPC server and the HTTP server (REST gateway, metrics, health).
type Server struct {
	cfg    Config
	grpc   *grpc.Server
	http   *http.Server
	grpcLn net.Listener
	httpLn net.Listener
	local  *inProcess // the gateway's way to the gRPC server
	conn   *grpc.ClientConn
	logger *slog.Logger
}

// New listens on both addresses and prepares the servers; Run serves.
// ready reports whether the process can do its work (ClickHouse reachable,
// consumer healthy); gatherer is exposed on /metrics.
func New(ctx context.Context, cfg Config, svc *Services, ready func(context.Context) error, gatherer prometheus.Gatherer, logger *slog.Logger) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := svc.checkPriceBooks(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	keys := svc.keys()
	s := &Server{cfg: cfg, logger: logger}
	if err := s.listen(); err != nil {
		return nil, err
	}
	s.local = newInProcess()
	mux := operationalMux(cfg, gatherer, ready, logger)
	s.grpc = newGRPCServer(cfg, keys, logger)
	if svc != nil {
		if err := s.serve(ctx, mux, svc, keys); err != nil {
			s.close()
			return nil, err
		}
	}
	s.http = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       cfg.ReadTimeout,
		WriteTimeout:      cfg.WriteTimeout,
		IdleTimeout:       cfg.IdleTimeout,
	}
	s.http.ErrorLog = slog.NewLogLogger(logger.Handler(), slog.LevelWarn) // TLS handshake errors among others
	return s, nil
}

// checkPriceBooks refuses backends that need the price book in force
// without a way to read it: it labels amounts and gives the default
// policies, and without one answers would quietly use the empty book. A
// nil Services offers none.
func (svc *Services) checkPriceBooks() error {
	if svc == nil {
		return nil
	}
	for _, b := range []struct {
		name    string
		backend any
		offered bool
	}{{"Cost", svc.Cost, svc.Cost != nil}, {"Reports", svc.Reports, svc.Reports != nil}} {
		if b.offered && svc.priceBooks(b.backend) == nil {
			return fmt.Errorf("api: Services.%s needs Services.Prices (or a %s that keeps the price books)", b.name, b.name)
		}
	}
	return nil
}

// keys are the API keys of svc; none for a nil Services or nil Keys.
func (svc *Services) keys() *Keys {
	if svc != nil && svc.Keys != nil {
		return svc.Keys
	}
	return &Keys{}
}

// withDefaults fills the limits and timeouts left zero.
func (c Config) withDefaults() Config {
	if c.MaxBatchEvents == 0 {
		c.MaxBatchEvents = 10_000
	}
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = 16 << 20
	}
	if c.ReadTimeout == 0 {
		c.ReadTimeout = time.Minute
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = 2 * time.Minute
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = 2 * time.Minute
	}
	if c.ExportChunkBytes == 0 {
		c.ExportChunkBytes = DefaultExportChunkBytes
	}
	return c
}

// listen opens the gRPC and HTTP listeners (HTTP behind TLS when
// configured); on an error neither stays open.
func (s *Server) listen() error {
	var err error
	if s.grpcLn, err = net.Listen("tcp", s.cfg.GRPCAddr); err != nil {
		return fmt.Errorf("listen gRPC: %w", err)
	}
	if s.httpLn, err = net.Listen("tcp", s.cfg.HTTPAddr); err != nil {
		s.grpcLn.Close()
		return fmt.Errorf("listen HTTP: %w", err)
	}
	if s.cfg.TLS != nil {
		s.httpLn = tls.NewListener(s.httpLn, httpTLS(s.cfg.TLS))
	}
	return nil
}

// operationalMux is the HTTP mux with what every meterd serves, whatever
// its roles: /metrics, the health checks, and pprof when configured.
func operationalMux(cfg Config, gatherer prometheus.Gatherer, ready func(context.Context) error, logger *slog.Logger) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	if cfg.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	mux.HandleFunc("GET /healthz/live", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.Handle("GET /healthz/ready", readiness(ready, logger))
	return mux
}

// newGRPCServer is the gRPC server with its limits, authentication,
// parameter checks and error mapping, and no services yet.
func newGRPCServer(cfg Config, keys *Keys, logger *slog.Logger) *grpc.Server {
	return grpc.NewServer(
		grpc.Creds(serverCreds(cfg.TLS)),
		grpc.MaxRecvMsgSize(cfg.MaxRequestBytes),
		grpc.ForceServerCodecV2(newBatchCodec()), // PublishEvents counts its events before decoding them
		grpc.InTapHandle(authTap(keys)),
		grpc.ChainUnaryInterceptor(errorInterceptor(logger), authInterceptor(keys), paramsInterceptor()),
		grpc.ChainStreamInterceptor(errorStreamInterceptor(logger), authStreamInterceptor(keys), paramsStreamInterceptor()),
	)
}

// service is one API service: registered on the gRPC server and the
// gateway when offered (it has a backend).
type service struct {
	name    string
	offered bool
	serve   func(grpc.ServiceRegistrar)
	gateway func(context.Context, *runtime.ServeMux, *grpc.ClientConn) error
}

// services are the API's services over svc's backends; those without a
// backend are not offered.
func (s *Server) services(svc *Services) []service {
	cfg := s.cfg
	return []service{
		{"ingest", true, func(r grpc.ServiceRegistrar) {
			registerIngest(r, &ingestService{pub: svc.Publisher, maxEvents: cfg.MaxBatchEvents})
		}, meterv1.RegisterIngestServiceHandler},
		{"usage", true, func(r grpc.ServiceRegistrar) {
			meterv1.RegisterUsageServiceServer(r, &usageService{store: svc.Usage})
		}, meterv1.RegisterUsageServiceHandler},
		{"metrics", svc.Rollups != nil, func(r grpc.ServiceRegistrar) {
			meterv1.RegisterMetricsServiceServer(r, &metricsService{store: svc.Rollups})
		}, meterv1.RegisterMetricsServiceHandler},
		{"cost", svc.Cost != nil, func(r grpc.ServiceRegistrar) {
			cs := newCostService(svc)
			cs.tenantCost = cfg.TenantCost
			meterv1.RegisterCostServiceServer(r, cs)
		}, meterv1.RegisterCostServiceHandler},
		{"admin", svc.Admin != nil, func(r grpc.ServiceRegistrar) {
			meterv1.RegisterAdminServiceServer(r, &adminService{store: svc.Admin})
		}, meterv1.RegisterAdminServiceHandler},
		{"billing", svc.Billing != nil, func(r grpc.ServiceRegistrar) {
			meterv1.RegisterBillingServiceServer(r, &billingService{b: svc.Billing, chunk: cfg.ExportChunkBytes, tenantCost: cfg.TenantCost})
		}, meterv1.RegisterBillingServiceHandler},
		{"invoice", invoicesOf(svc) != nil, func(r grpc.ServiceRegistrar) {
			meterv1.RegisterInvoiceServiceServer(r, &invoiceService{inv: invoicesOf(svc), tenantCost: cfg.TenantCost})
		}, meterv1.RegisterInvoiceServiceHandler},
		{"credit", creditsOf(svc) != nil, func(r grpc.ServiceRegistrar) {
			meterv1.RegisterCreditServiceServer(r, &creditService{c: creditsOf(svc)})
		}, meterv1.RegisterCreditServiceHandler},
		{"report", svc.Reports != nil, func(r grpc.ServiceRegistrar) {
			meterv1.RegisterReportServiceServer(r, newReportService(svc))
		}, meterv1.RegisterReportServiceHandler},
		{"engine", svc.Engine != nil, func(r grpc.ServiceRegistrar) {
			meterv1.RegisterEngineServiceServer(r, &engineService{store: svc.Engine})
		}, meterv1.RegisterEngineServiceHandler},
	}
}

// serve offers svc's services over gRPC and, through the REST gateway,
// under /v1/ on mux, with the OpenAPI document, the usage metrics and the
// dashboard beside them.
func (s *Server) serve(ctx context.Context, mux *http.ServeMux, svc *Services, keys *Keys) error {
	services := s.services(svc)
	for _, sv := range services {
		if sv.offered {
			sv.serve(s.grpc)
		}
	}
	gw, err := s.gateway(ctx, svc, keys, services)
	if err != nil {
		return err
	}
	mux.Handle("/v1/", gw)
	offered := map[string]bool{}
	for name := range s.grpc.GetServiceInfo() {
		offered[name] = true
	}
	doc, err := openAPIDocument(offered)
	if err != nil {
		return err
	}
	mux.Handle("GET "+OpenAPIPath, serveOpenAPI(doc))
	if svc.UsageMetrics != nil {
		mux.Handle("GET "+UsageMetricsPath, usageMetrics(keys, svc.UsageMetrics))
	}
	// The web dashboard: static files, and /ui/session for the key's role.
	mux.Handle("GET /ui/", dashboard(keys))
	mux.Handle("GET /ui", http.RedirectHandler("/ui/", http.StatusMovedPermanently))
	return nil
}

// gateway is the REST gateway of the offered services. It calls our own
// gRPC server, in process (see tls.go), so that REST and gRPC share
// authentication, limits and error mapping; a few routes are handled by
// hand in its place (publish, billing exports, capacity report files).
func (s *Server) gateway(ctx context.Context, svc *Services, keys *Keys, services []service) (*runtime.ServeMux, error) {
	cfg, logger := s.cfg, s.logger
	var err error
	s.conn, err = grpc.NewClient(gatewayTarget, append(s.local.gatewayDialOptions(),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(cfg.MaxRequestBytes), grpc.MaxCallRecvMsgSize(64<<20)))...)
	if err != nil {
		return nil, fmt.Errorf("dial own gRPC server: %w", err)
	}
	guard, err := newHTTPGuard(keys, int64(cfg.MaxRequestBytes))
	if err != nil {
		return nil, err
	}
	// Answers carry every scalar and list field, zero values included
	// (EmitDefaultValues); a message or optional field that is not set is
	// left out rather than written as null, which the OpenAPI document
	// (Swagger 2.0, no nullable) could not describe.
	gw := runtime.NewServeMux(
		runtime.WithMarshalerOption(runtime.MIMEWildcard, &runtime.JSONPb{
			MarshalOptions:   protojson.MarshalOptions{UseProtoNames: true, EmitDefaultValues: true},
			UnmarshalOptions: protojson.UnmarshalOptions{},
		}),
		runtime.WithMiddlewares(guard.middleware),
		runtime.WithRoutingErrorHandler(guard.routingError),
		runtime.WithErrorHandler(errorHandler(logger)),
	)
	guard.mux = gw
	for _, sv := range services {
		if !sv.offered {
			continue
		}
		if err := sv.gateway(ctx, gw, s.conn); err != nil {
			return nil, fmt.Errorf("register %s gateway: %w", sv.name, err)
		}
	}
	// Registered after the generated ingest handler, so it takes its place.
	pe := &publishHandler{mux: gw, client: meterv1.NewIngestServiceClient(s.conn), maxEvents: cfg.MaxBatchEvents}
	if err := gw.HandlePath(http.MethodPost, "/v1/events", pe.serve); err != nil {
		return nil, fmt.Errorf("register publish handler: %w", err)
	}
	if svc.Billing != nil {
		// Registered after the generated billing handlers, so that
		// exports stream as files (see billing_http.go).
		ex := &exportHandler{mux: gw, client: meterv1.NewBillingServiceClient(s.conn), writeTimeout: cfg.WriteTimeout, logger: logger}
		if err := ex.register(gw); err != nil {
			return nil, err
		}
	}
	if invoicesOf(svc) != nil {
		// Registered after the generated invoice handler, so that the
		// invoice answers as an HTML page (see invoice_http.go).
		ih := &invoiceHandler{mux: gw, client: meterv1.NewInvoiceServiceClient(s.conn), logger: logger}
		if err := ih.register(gw); err != nil {
			return nil, fmt.Errorf("register invoice handler: %w", err)
		}
	}
	if svc.Reports != nil {
		// Registered after the generated report handler, so that
		// format=csv and format=html answer files (see report_http.go).
		rh := &reportHandler{mux: gw, client: meterv1.NewReportServiceClient(s.conn), logger: logger}
		if err := rh.register(gw); err != nil {
			return nil, fmt.Errorf("register capacity report handler: %w", err)
		}
	}
	return gw, nil
}

// readiness answers /healthz/ready: 200 "ready", or 503 "not ready" without
// the reason, which may name internal addresses; the reason is logged when
// it changes.
func readiness(ready func(context.Context) error, logger *slog.Logger) http.Handler {
	var mu sync.Mutex
	last := ""
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		err := ready(rctx)
		reason := ""
		if err != nil {
			reason = err.Error()
		}
		mu.Lock()
		if reason != last {
			if err != nil {
				logger.Warn("not ready", "error", err)
			} else {
				logger.Info("ready again")
			}
			last = reason
		}
		mu.Unlock()
		if err != nil {
			http.Error(w, "not ready (the reason is in meterd's log)", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
}

// GRPCAddr is the gRPC listener's address.
func (s *Server) GRPCAddr() string { return s.grpcLn.Addr().String() }

// HTTPAddr is the HTTP listener's address.
func (s *Server) HTTPAddr() string { return s.httpLn.Addr().String() }

// Run serves until ctx is cancelled, then stops gracefully: it stops
// accepting requests and waits for those in flight.
func (s *Server) Run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := s.grpc.Serve(s.grpcLn); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("serve gRPC: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		if err := s.grpc.Serve(s.local); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("serve gRPC in process: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		if err := s.http.Serve(s.httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve HTTP: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		defer cancel()
		err := s.http.Shutdown(sctx)
		stopped := make(chan struct{})
		go func() { s.grpc.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-sctx.Done():
			s.grpc.Stop()
		}
		if s.conn != nil {
			s.conn.Close()
		}
		return err
	})
	return g.Wait()
}

func (s *Server) close() {
	s.grpcLn.Close()
	s.httpLn.Close()
	s.local.Close()
	if s.conn != nil {
		s.conn.Close()
	}
}
