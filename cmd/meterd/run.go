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
	logger := logsetup.JSON(stderr, cfg.LogLevel)
	now := time.Now
	if cfg.MemoryMiB > 0 && getenv("GOMEMLIMIT") == "" {
		// A soft limit: the collector works harder near it, so that the
		// process stays within what its container is given.
		debug.SetMemoryLimit(int64(cfg.MemoryMiB) << 20)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	// Development mode: the engines run inside and beside this process.
	var devKeys []devKey
	if cfg.Dev {
		var stopDev func()
		if cfg, devKeys, stopDev, err = startDevMode(ctx, cfg, logger); err != nil {
			return err
		}
		defer stopDev()
	}

	kafkaConn, chCfg, apiTLS, err := security(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer kafkaConn.Close() // after the writers, deferred below
	store, err := chstore.Open(chCfg, logger)
	if err != nil {
		return err
	}
	defer store.Close()
	if err := migrate(ctx, store, logger); err != nil {
		return err
	}

	if cfg.PricesFile != "" {
		data, err := os.ReadFile(cfg.PricesFile)
		if err != nil {
			return fmt.Errorf("--prices: %w", err)
		}
		book, err := billing.ParsePriceBook(data)
		if err != nil {
			return fmt.Errorf("--prices %s: %w", cfg.PricesFile, err)
		}
		v, changed, err := billing.EnsurePriceBook(ctx, store, book, cfg.PricesFile, now())
		if err != nil {
			return err
		}
		logger.Info("price book in force", "version", v, "new", changed, "source", cfg.PricesFile)
	}

	var consumer, gpuConsumer, engineConsumer *ingest.Consumer
	if cfg.HasRole("ingest") && cfg.EngineTopic != "" {
		engineConsumer, err = ingest.NewEngineConsumer(ingest.ConsumerConfig{
			Brokers: cfg.KafkaBrokers, Kafka: kafkaConn, Topic: cfg.EngineTopic, GroupID: cfg.GroupID + "-engine", DLQTopic: cfg.DLQTopic,
			BatchSize: cfg.BatchSize, BatchTimeout: cfg.BatchTimeout,
		}, store, reg, logger, now)
		if err != nil {
			return err
		}
	}
	if cfg.HasRole("ingest") && cfg.GPUTopic != "" {
		gpuConsumer, err = ingest.NewGPUConsumer(ingest.ConsumerConfig{
			Brokers: cfg.KafkaBrokers, Kafka: kafkaConn, Topic: cfg.GPUTopic, GroupID: cfg.GroupID + "-gpu", DLQTopic: cfg.DLQTopic,
			BatchSize: cfg.BatchSize, BatchTimeout: cfg.BatchTimeout,
		}, store, reg, logger, now)
		if err != nil {
			return err
		}
	}
	if cfg.HasRole("ingest") {
		consumer, err = ingest.NewConsumer(ingest.ConsumerConfig{
			Brokers: cfg.KafkaBrokers, Kafka: kafkaConn, Topic: cfg.EventsTopic, GroupID: cfg.GroupID, DLQTopic: cfg.DLQTopic,
			BatchSize: cfg.BatchSize, BatchTimeout: cfg.BatchTimeout,
		}, store, reg, logger, now)
		if err != nil {
			return err
		}
	}
	var job *rollup.Job
	if cfg.HasRole("rollup") {
		// The SLO set in force lives in ClickHouse (versioned, managed through
		// the admin API). A --slo-file is applied at start when it differs from
		// it; without one the stored set stays (the built-in defaults, version
		// 0, until a set is stored).
		if cfg.SLOFile != "" {
			set, err := rollup.LoadSLOFile(cfg.SLOFile)
			if err != nil {
				return err
			}
			v, err := rollup.EnsureSLO(ctx, store, set, cfg.SLOFile)
			if err != nil {
				return err
			}
			logger.Info("SLO set in force", "version", v, "source", cfg.SLOFile)
		}
		if job, err = rollup.NewJob(rollup.Config{Interval: cfg.RollupEvery, MinuteRetention: cfg.MinuteRetention}, store, reg, logger, now); err != nil {
			return err
		}
	}
	var svc *api.Services
	var otlpRecv *otlp.Receiver
	if cfg.HasRole("api") {
		keys, err := api.LoadKeys(cfg.AuthKeys)
		if err != nil {
			return err
		}
		pub, err := ingest.NewPublisher(ingest.PublisherConfig{Brokers: cfg.KafkaBrokers, Kafka: kafkaConn, Topic: cfg.EventsTopic}, reg, logger, now)
		if err != nil {
			return err
		}
		defer pub.Close()
		reads := query.New(store, query.Config{MinuteRetention: cfg.MinuteRetention, Now: now})
		zones, err := cfg.billingZones()
		if err != nil {
			return err
		}
		caughtUp, err := ingestCaughtUp(cfg, kafkaConn)
		if err != nil {
			return err
		}
		// Closes run one at a time across api replicas: a Kafka lock on the
		// rollup lease topic (a consumer group of its own per lock).
		lock, err := kafkalock.New(kafkalock.Config{Brokers: cfg.KafkaBrokers, Kafka: kafkaConn, Topic: rollup.DefaultLeaseTopic, Logger: logger})
		if err != nil {
			return err
		}
		bill, err := closing.NewService(closing.Deps{Reads: reads, Store: store, CaughtUp: caughtUp, Lock: lock,
			Prices: func(ctx context.Context) (*billing.PriceBook, error) { return billing.BookInForce(ctx, store) }},
			closing.Config{Zones: zones, Grace: cfg.BillingGrace, ByDeployment: cfg.BillingByDeployment, Now: now})
		if err != nil {
			return err
		}
		if cfg.OTLP.GRPCAddr != "" || cfg.OTLP.HTTPAddr != "" {
			otlpRecv, err = otlp.New(otlp.Config{
				GRPCAddr: cfg.OTLP.GRPCAddr, HTTPAddr: cfg.OTLP.HTTPAddr, MaxRequestBytes: cfg.MaxBody, TLS: apiTLS,
				MaxSpans: cfg.MaxBatch, // the event API's batch limit
				Mapping:  otlp.Mapping{TenantAttribute: cfg.OTLP.TenantAttribute, TTFTFromE2E: cfg.OTLP.TTFTFromE2E},
			}, pub, keys, reg, logger)
			if err != nil {
				return err
			}
			logger.Info("OTLP receiver", "grpc", otlpRecv.GRPCAddr(), "http", otlpRecv.HTTPAddr())
		}
		svc = &api.Services{Keys: keys, Publisher: pub, Usage: reads, Rollups: reads, Cost: reads, Engine: reads, Prices: store, Admin: store, Billing: bill, Reports: reads}
		if cfg.UsageMetrics {
			if svc.UsageMetrics, err = usagemetrics.New(usagemetrics.Config{MaxSeries: cfg.UsageMetricsMaxSeries, Interval: cfg.UsageMetricsInterval},
				reads, reg, logger, now); err != nil {
				return err
			}
		}
	}
	ready := func(ctx context.Context) error {
		if consumer != nil && !consumer.Healthy() {
			return errors.New("ingest is retrying failed writes")
		}
		if gpuConsumer != nil && !gpuConsumer.Healthy() {
			return errors.New("GPU sample ingest is retrying failed writes")
		}
		if engineConsumer != nil && !engineConsumer.Healthy() {
			return errors.New("engine sample ingest is retrying failed writes")
		}
		// Partitions this replica holds stood still: it re-joins the group.
		for _, c := range []*ingest.Consumer{consumer, gpuConsumer, engineConsumer} {
			if c != nil {
				if err := c.Stalled(); err != nil {
					return err
				}
			}
		}
		return store.Ping(ctx)
	}
	server, err := api.New(ctx, api.Config{
		GRPCAddr: cfg.GRPCAddr, HTTPAddr: cfg.HTTPAddr, MaxBatchEvents: cfg.MaxBatch, MaxRequestBytes: cfg.MaxBody, Pprof: cfg.Pprof,
		ReadTimeout: cfg.HTTPTimeouts[0], WriteTimeout: cfg.HTTPTimeouts[1], IdleTimeout: cfg.HTTPTimeouts[2],
		TLS: apiTLS, TenantCost: cfg.TenantCost,
	}, svc, ready, reg, logger)
	if err != nil {
		return err
	}

	logger.Info("meterd started", "roles", cfg.Roles, "http", server.HTTPAddr(), "grpc", server.GRPCAddr(),
		"kafka", cfg.KafkaBrokers, "clickhouse", cfg.ClickHouse, "dev", cfg.Dev)
	if cfg.Dev {
		printDevBanner(stdout, cfg, server, devKeys)
	}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return server.Run(gctx) })
	if otlpRecv != nil {
		g.Go(func() error { return otlpRecv.Run(gctx) })
	}
	if consumer != nil {
		g.Go(func() error { return consumer.Run(gctx) })
	}
	if gpuConsumer != nil {
		g.Go(func() error { return gpuConsumer.Run(gctx) })
	}
	if engineConsumer != nil {
		g.Go(func() error { return engineConsumer.Run(gctx) })
	}
	if job != nil {
		g.Go(func() error {
			return rollup.HoldLease(gctx, cfg.KafkaBrokers, kafkaConn, rollup.DefaultLeaseTopic, rollup.DefaultLeaseGroup, logger, func(ctx context.Context) {
				// Losing the lease or stopping meterd ends ctx: not a warning.
				if err := job.Run(ctx); err != nil && ctx.Err() == nil {
					logger.Warn("rollup job stopped", "error", err)
				}
			})
		})
	}
	err = g.Wait()
	logger.Info("meterd stopped")
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
