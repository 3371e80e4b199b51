package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"

	"tokenmeter/api"
	"tokenmeter/billing"
	"tokenmeter/billing/closing"
	"tokenmeter/billing/notify"
	"tokenmeter/ingest"
	"tokenmeter/ingest/otlp"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/kafkaconn"
	"tokenmeter/internal/adapter/kafkalock"
	"tokenmeter/internal/logsetup"
	"tokenmeter/internal/tlsfiles"
	"tokenmeter/query"
	"tokenmeter/rollup"
	"tokenmeter/usagemetrics"
)

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := parseConfig(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil // -h: the flag package printed the usage
	}
	if err != nil {
		return err
	}
	if cfg.ValidateOnly {
		fmt.Fprintln(stdout, "configuration is valid")
		return nil
	}
	p := newProcess(cfg, getenv, stderr)
	defer p.close()
	for _, part := range []func(context.Context) error{
		p.startDev,       // --dev: Kafka and ClickHouse beside this process
		p.openStorage,    // Kafka's connection, ClickHouse (schema, price book)
		p.newConsumers,   // ingest role: events, GPU samples, engine samples
		p.newRollupJob,   // rollup role: the SLO set and the job
		p.newAPIServices, // api role: publish, reads, billing, OTLP, usage metrics
		p.newServer,      // every role: the listeners, /metrics, the health checks
	} {
		if err := part(ctx); err != nil {
			return err
		}
	}
	p.announce(stdout)
	return p.serve(ctx)
}

// process is the parts of one meterd, made by run in order; a part of a
// role this process does not run stays nil.
type process struct {
	cfg    Config
	logger *slog.Logger
	now    func() time.Time
	reg    *prometheus.Registry
	// closers run in reverse order when meterd stops: the writers before
	// the clients they write with, the dev engines last.
	closers []func()

	devKeys   []devKey        // --dev: the keys it made
	kafka     *kafkaconn.Conn // Kafka's TLS and SASL; nil: plaintext
	apiTLS    *tls.Config
	store     *chstore.Store
	consumers []consumer // ingest role
	job       *rollup.Job
	services  *api.Services    // api role
	events    *notify.Notifier // api role, with --billing-events-topic or --billing-webhook-url
	otlp      *otlp.Receiver
	server    *api.Server
}

// consumer is one of the ingest role's consumers; what names it in the
// readiness check's reason.
type consumer struct {
	*ingest.Consumer
	what string
}

func newProcess(cfg Config, getenv func(string) string, stderr io.Writer) *process {
	if cfg.MemoryMiB > 0 && getenv("GOMEMLIMIT") == "" {
		// A soft limit: the collector works harder near it, so that the
		// process stays within what its container is given.
		debug.SetMemoryLimit(int64(cfg.MemoryMiB) << 20)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return &process{cfg: cfg, logger: logsetup.JSON(stderr, cfg.LogLevel), now: time.Now, reg: reg}
}

// onClose adds f to what close runs.
func (p *process) onClose(f func()) { p.closers = append(p.closers, f) }

// close runs the closers, the last added first.
func (p *process) close() {
	for i := len(p.closers) - 1; i >= 0; i-- {
		p.closers[i]()
	}
}

// startDev starts the engines inside and beside this process in
// development mode, and points the configuration at them.
func (p *process) startDev(ctx context.Context) error {
	if !p.cfg.Dev {
		return nil
	}
	cfg, keys, stop, err := startDevMode(ctx, p.cfg, p.logger)
	if err != nil {
		return err
	}
	p.cfg, p.devKeys = cfg, keys
	p.onClose(stop)
	return nil
}

// openStorage connects to Kafka and ClickHouse, applies the schema and
// stores the --prices book when it is new.
func (p *process) openStorage(ctx context.Context) error {
	kafkaConn, chCfg, apiTLS, err := security(ctx, p.cfg, p.logger)
	if err != nil {
		return err
	}
	p.kafka, p.apiTLS = kafkaConn, apiTLS
	p.onClose(kafkaConn.Close) // after the writers, closed before it
	store, err := chstore.Open(chCfg, p.logger)
	if err != nil {
		return err
	}
	p.store = store
	p.onClose(func() { store.Close() })
	if err := migrate(ctx, store, p.logger); err != nil {
		return err
	}
	return p.ensurePrices(ctx)
}

// ensurePrices stores the --prices book, when given and new.
func (p *process) ensurePrices(ctx context.Context) error {
	if p.cfg.PricesFile == "" {
		return nil
	}
	data, err := os.ReadFile(p.cfg.PricesFile)
	if err != nil {
		return fmt.Errorf("--prices: %w", err)
	}
	book, err := billing.ParsePriceBook(data)
	if err != nil {
		return fmt.Errorf("--prices %s: %w", p.cfg.PricesFile, err)
	}
	v, changed, err := billing.EnsurePriceBook(ctx, p.store, book, p.cfg.PricesFile, p.now())
	if err != nil {
		return err
	}
	p.logger.Info("price book in force", "version", v, "new", changed, "source", p.cfg.PricesFile)
	return nil
}

// newConsumers makes the ingest role's consumers: of engine samples and
// GPU samples when their topics are set, and of events.
func (p *process) newConsumers(context.Context) error {
	cfg := p.cfg
	if !cfg.HasRole("ingest") {
		return nil
	}
	consumerConfig := func(topic, group string) ingest.ConsumerConfig {
		return ingest.ConsumerConfig{
			Brokers: cfg.KafkaBrokers, Kafka: p.kafka, Topic: topic, GroupID: group, DLQTopic: cfg.DLQTopic,
			BatchSize: cfg.BatchSize, BatchTimeout: cfg.BatchTimeout,
		}
	}
	var engine, gpu *ingest.Consumer
	var err error
	if cfg.EngineTopic != "" {
		if engine, err = ingest.NewEngineConsumer(consumerConfig(cfg.EngineTopic, cfg.GroupID+"-engine"), p.store, p.reg, p.logger, p.now); err != nil {
			return err
		}
	}
	if cfg.GPUTopic != "" {
		if gpu, err = ingest.NewGPUConsumer(consumerConfig(cfg.GPUTopic, cfg.GroupID+"-gpu"), p.store, p.reg, p.logger, p.now); err != nil {
			return err
		}
	}
	events, err := ingest.NewConsumer(consumerConfig(cfg.EventsTopic, cfg.GroupID), p.store, p.reg, p.logger, p.now)
	if err != nil {
		return err
	}
	p.consumers = append(p.consumers, consumer{events, "ingest"})
	if gpu != nil {
		p.consumers = append(p.consumers, consumer{gpu, "GPU sample ingest"})
	}
	if engine != nil {
		p.consumers = append(p.consumers, consumer{engine, "engine sample ingest"})
	}
	return nil
}

// newRollupJob makes the rollup role's job. The SLO set in force lives in
// ClickHouse (versioned, managed through the admin API). A --slo-file is
// applied at start when it differs from it; without one the stored set
// stays (the built-in defaults, version 0, until a set is stored).
func (p *process) newRollupJob(ctx context.Context) error {
	cfg := p.cfg
	if !cfg.HasRole("rollup") {
		return nil
	}
	if cfg.SLOFile != "" {
		set, err := rollup.LoadSLOFile(cfg.SLOFile)
		if err != nil {
			return err
		}
		v, err := rollup.EnsureSLO(ctx, p.store, set, cfg.SLOFile)
		if err != nil {
			return err
		}
		p.logger.Info("SLO set in force", "version", v, "source", cfg.SLOFile)
	}
	job, err := rollup.NewJob(rollup.Config{Interval: cfg.RollupEvery, MinuteRetention: cfg.MinuteRetention}, p.store, p.reg, p.logger, p.now)
	p.job = job
	return err
}

// newAPIServices makes the api role's backends: the publisher, the reads,
// billing closes, the OTLP receiver and the usage metrics.
func (p *process) newAPIServices(ctx context.Context) error {
	cfg := p.cfg
	if !cfg.HasRole("api") {
		return nil
	}
	keys, err := api.LoadKeys(cfg.AuthKeys)
	if err != nil {
		return err
	}
	pub, err := ingest.NewPublisher(ingest.PublisherConfig{Brokers: cfg.KafkaBrokers, Kafka: p.kafka, Topic: cfg.EventsTopic}, p.reg, p.logger, p.now)
	if err != nil {
		return err
	}
	p.onClose(func() { pub.Close() })
	reads := query.New(p.store, query.Config{MinuteRetention: cfg.MinuteRetention, Now: p.now})
	bill, err := p.newBilling(reads)
	if err != nil {
		return err
	}
	if p.otlp, err = p.newOTLP(pub, keys); err != nil {
		return err
	}
	p.services = &api.Services{Keys: keys, Publisher: pub, Usage: reads, Rollups: reads, Cost: reads, Engine: reads,
		Prices: p.store, Admin: p.store, Billing: bill, Reports: reads}
	if cfg.UsageMetrics {
		if p.services.UsageMetrics, err = usagemetrics.New(usagemetrics.Config{MaxSeries: cfg.UsageMetricsMaxSeries, Interval: cfg.UsageMetricsInterval, SLOs: p.store},
			reads, p.reg, p.logger, p.now); err != nil {
			return err
		}
	}
	return nil
}

// newBilling makes the billing service: closes wait for ingest to catch
// up, and run one at a time across api replicas, under a Kafka lock on the
// rollup lease topic (a consumer group of its own per lock).
func (p *process) newBilling(reads *query.Service) (*closing.Service, error) {
	cfg := p.cfg
	accounts, zones, err := cfg.billingAccounts()
	if err != nil {
		return nil, err
	}
	caughtUp, err := ingestCaughtUp(cfg, p.kafka)
	if err != nil {
		return nil, err
	}
	lock, err := kafkalock.New(kafkalock.Config{Brokers: cfg.KafkaBrokers, Kafka: p.kafka, Topic: rollup.DefaultLeaseTopic, Logger: p.logger})
	if err != nil {
		return nil, err
	}
	store := p.store
	deps := closing.Deps{Reads: reads, Store: store, CaughtUp: caughtUp, Lock: lock, Credits: store,
		Prices: func(ctx context.Context) (*billing.PriceBook, error) { return billing.BookInForce(ctx, store) }}
	if p.events, err = p.newBillingEvents(); err != nil {
		return nil, err
	}
	if p.events != nil {
		deps.Notify = p.events
	}
	svc, err := closing.NewService(deps,
		closing.Config{Zones: zones, Grace: cfg.BillingGrace, ByDeployment: cfg.BillingByDeployment, Now: p.now, Accounts: accounts})
	if err == nil && p.events != nil {
		// A statement whose invoice a close failed to issue goes out
		// once issued, with it.
		p.events.IssueWith(svc.IssueInvoices)
	}
	return svc, err
}

// newOTLP makes the OTLP receiver when it has an address; nil otherwise.
func (p *process) newOTLP(pub *ingest.Publisher, keys *api.Keys) (*otlp.Receiver, error) {
	cfg := p.cfg
	if cfg.OTLP.GRPCAddr == "" && cfg.OTLP.HTTPAddr == "" {
		return nil, nil
	}
	recv, err := otlp.New(otlp.Config{
		GRPCAddr: cfg.OTLP.GRPCAddr, HTTPAddr: cfg.OTLP.HTTPAddr, MaxRequestBytes: cfg.MaxBody, TLS: p.apiTLS,
		MaxSpans: cfg.MaxBatch, // the event API's batch limit
		Mapping:  otlp.Mapping{TenantAttribute: cfg.OTLP.TenantAttribute, TTFTFromE2E: cfg.OTLP.TTFTFromE2E},
	}, pub, keys, p.reg, p.logger)
	if err != nil {
		return nil, err
	}
	p.logger.Info("OTLP receiver", "grpc", recv.GRPCAddr(), "http", recv.HTTPAddr())
	return recv, nil
}

// newServer opens the API's listeners: the services of the api role, and
// on every role /metrics and the health checks.
func (p *process) newServer(ctx context.Context) error {
	cfg := p.cfg
	server, err := api.New(ctx, api.Config{
		GRPCAddr: cfg.GRPCAddr, HTTPAddr: cfg.HTTPAddr, MaxBatchEvents: cfg.MaxBatch, MaxRequestBytes: cfg.MaxBody, Pprof: cfg.Pprof,
		ReadTimeout: cfg.HTTPTimeouts[0], WriteTimeout: cfg.HTTPTimeouts[1], IdleTimeout: cfg.HTTPTimeouts[2],
		TLS: p.apiTLS, TenantCost: cfg.TenantCost,
	}, p.services, p.ready, p.reg, p.logger)
	p.server = server
	return err
}

// ready is the readiness check: the consumers write and their partitions
// move, and ClickHouse answers.
func (p *process) ready(ctx context.Context) error {
	for _, c := range p.consumers {
		if !c.Healthy() {
			return errors.New(c.what + " is retrying failed writes")
		}
	}
	// Partitions this replica holds stood still: it re-joins the group.
	for _, c := range p.consumers {
		if err := c.Stalled(); err != nil {
			return err
		}
	}
	return p.store.Ping(ctx)
}

// announce logs the start, and in development mode prints the banner.
func (p *process) announce(stdout io.Writer) {
	cfg := p.cfg
	p.logger.Info("meterd started", "roles", cfg.Roles, "http", p.server.HTTPAddr(), "grpc", p.server.GRPCAddr(),
		"kafka", cfg.KafkaBrokers, "clickhouse", cfg.ClickHouse, "dev", cfg.Dev)
	if cfg.Dev {
		printDevBanner(stdout, cfg, p.server, p.devKeys)
	}
}

// serve runs the parts until ctx ends or one fails: the API server, the
// OTLP receiver, the consumers, and the rollup job while this replica
// holds the rollup lease.
func (p *process) serve(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return p.server.Run(gctx) })
	if p.otlp != nil {
		g.Go(func() error { return p.otlp.Run(gctx) })
	}
	if p.events != nil {
		g.Go(func() error { return p.events.Run(gctx) })
	}
	for _, c := range p.consumers {
		g.Go(func() error { return c.Run(gctx) })
	}
	if p.job != nil {
		g.Go(func() error {
			return rollup.HoldLease(gctx, p.cfg.KafkaBrokers, p.kafka, rollup.DefaultLeaseTopic, rollup.DefaultLeaseGroup, p.logger, func(ctx context.Context) {
				// Losing the lease or stopping meterd ends ctx: not a warning.
				if err := p.job.Run(ctx); err != nil && ctx.Err() == nil {
					p.logger.Warn("rollup job stopped", "error", err)
				}
			})
		})
	}
	err := g.Wait()
	p.logger.Info("meterd stopped")
	return err
}

// security builds the Kafka clients' connection, the ClickHouse
// configuration and the listeners' TLS. With Kafka TLS or SASL configured it
// checks the brokers at once: a refused password or certificate is an error,
// a broker that does not answer is only logged (the clients retry).
func security(ctx context.Context, cfg Config, logger *slog.Logger) (*kafkaconn.Conn, chstore.Config, *tls.Config, error) {
	opts := tlsfiles.Options{Logger: logger}
	chCfg := chstore.Config{Addr: []string{cfg.ClickHouse}, Database: cfg.Database, Cluster: cfg.Cluster, Compression: cfg.Compression, Username: cfg.Security.ClickHouseUser}
	kcfg, err := cfg.Security.Kafka.Resolve()
	if err != nil {
		return nil, chCfg, nil, err
	}
	kafkaConn, err := kafkaconn.New(kcfg, opts)
	if err != nil {
		return nil, chCfg, nil, err
	}
	if chCfg.Password, err = cfg.Security.ClickHousePassword(); err != nil {
		return nil, chCfg, nil, err
	}
	if chCfg.TLS, err = cfg.Security.ClickHouseTLS.Config(opts); err != nil {
		return nil, chCfg, nil, fmt.Errorf("ClickHouse TLS: %w", err)
	}
	apiTLS, err := cfg.Security.TLS.Config(opts)
	if err != nil {
		return nil, chCfg, nil, fmt.Errorf("listeners' TLS: %w", err)
	}
	if kafkaConn != nil {
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err := kafkaConn.Check(cctx, cfg.KafkaBrokers)
		cancel()
		if errors.Is(err, kafkaconn.ErrRefused) {
			return nil, chCfg, nil, err
		}
		if err != nil {
			logger.Warn("Kafka does not answer yet; the clients will retry", "error", err)
		}
	}
	return kafkaConn, chCfg, apiTLS, nil
}

// migrate applies the schema, retrying while ClickHouse is not reachable.
func migrate(ctx context.Context, store *chstore.Store, logger *slog.Logger) error {
	backoff := 200 * time.Millisecond
	for {
		applied, err := store.Migrate(ctx)
		if err == nil {
			if len(applied) > 0 {
				logger.Info("schema migrated", "applied", applied)
			}
			return nil
		}
		if chstore.Refused(err) {
			return fmt.Errorf("migrate schema: %w", err) // a wrong password or certificate: no retry mends it
		}
		logger.Warn("migrate schema, will retry", "error", err, "backoff", backoff)
		select {
		case <-ctx.Done():
			return fmt.Errorf("migrate schema: %w", err)
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 10*time.Second)
	}
}

var _ closing.Locker = (*kafkalock.Locker)(nil)

// ingestCaughtUp is the billing close's check that ingest has every event:
// the consumer groups of events (and of GPU samples, whose cost the
// statements' finance part holds) have committed everything their topics
// held when it was asked. A lag wraps billing.ErrIngestBehind.
func ingestCaughtUp(cfg Config, conn *kafkaconn.Conn) (func(context.Context) (time.Time, error), error) {
	checks := []ingest.LagConfig{{Brokers: cfg.KafkaBrokers, Kafka: conn, GroupID: cfg.GroupID, Topics: []string{cfg.EventsTopic}}}
	if cfg.GPUTopic != "" {
		checks = append(checks, ingest.LagConfig{Brokers: cfg.KafkaBrokers, Kafka: conn, GroupID: cfg.GroupID + "-gpu", Topics: []string{cfg.GPUTopic}})
	}
	var lcs []*ingest.LagChecker
	for _, c := range checks {
		lc, err := ingest.NewLagChecker(c)
		if err != nil {
			return nil, err
		}
		lcs = append(lcs, lc)
	}
	return func(ctx context.Context) (time.Time, error) {
		var first time.Time
		for i, lc := range lcs {
			t, err := lc.CaughtUp(ctx)
			if errors.Is(err, ingest.ErrLagging) {
				err = fmt.Errorf("%w: %w", billing.ErrIngestBehind, err)
			}
			if err != nil {
				return time.Time{}, err
			}
			if i == 0 || t.Before(first) {
				first = t
			}
		}
		return first, nil
	}, nil
}
