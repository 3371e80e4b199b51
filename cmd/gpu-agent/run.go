package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"tokenmeter/ingest/engine"
	"tokenmeter/ingest/gpu"
	"tokenmeter/internal/adapter/kafkaconn"
	"tokenmeter/internal/logsetup"
	"tokenmeter/internal/tlsfiles"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := parseConfig(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil // -h: the flag package printed the usage
	}
	if err != nil {
		return err
	}
	// The deployment map is part of the configuration: --validate reads it.
	attr, err := newAttributor(cfg)
	if err != nil {
		return err
	}
	if cfg.ValidateOnly {
		fmt.Fprintln(stdout, "configuration is valid")
		return nil
	}
	logger := logsetup.JSON(stderr, cfg.LogLevel)
	now := time.Now

	var src gpu.Source
	if cfg.Source != SourceNone {
		src, err = openSource(cfg, logger)
		if errors.Is(err, gpu.ErrDCGMUnavailable) {
			return fmt.Errorf("%w; use --source dcgm-exporter or replay, or --source nvml where the NVIDIA driver is installed", err)
		}
		if errors.Is(err, gpu.ErrNVMLUnavailable) {
			return fmt.Errorf("%w; use --source dcgm-exporter or replay", err)
		}
		if err != nil {
			return err
		}
		defer func() {
			if err := src.Close(); err != nil {
				logger.Warn("close GPU source", "error", err)
			}
		}()
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	agentCfg := gpu.AgentConfig{Interval: cfg.Interval, Node: cfg.Node, BufferSamples: cfg.BufferSamples}
	engineCfg := engine.AgentConfig{Targets: cfg.EngineEndpoints, Scraper: engine.ScraperConfig{Interval: cfg.Interval}, BufferSamples: cfg.BufferSamples}
	if cfg.EnginePods.Selector != "" {
		d, err := engine.NewPodDiscovery(cfg.EnginePods)
		if err != nil {
			return err
		}
		engineCfg.Discover = d.Targets
	}

	if cfg.Once {
		if src != nil {
			agent, err := gpu.NewAgent(agentCfg, src, attr, &jsonLines[*meterv1.GpuSample]{w: stdout}, reg, logger, now)
			if err != nil {
				return err
			}
			if _, err := agent.Collect(ctx); err != nil {
				return err
			}
			if err := agent.Flush(ctx); err != nil {
				return err
			}
		}
		if cfg.scrapesEngines() {
			eagent, err := engine.NewAgent(engineCfg, &jsonLines[*meterv1.EngineSample]{w: stdout}, reg, logger, now)
			if err != nil {
				return err
			}
			_, serr := eagent.Collect(ctx) // the targets that answered are printed all the same
			return errors.Join(eagent.Flush(ctx), serr)
		}
		return nil
	}

	kcfg, err := cfg.Kafka.Resolve()
	if err != nil {
		return err
	}
	kafkaConn, err := kafkaconn.New(kcfg, tlsfiles.Options{Logger: logger})
	if err != nil {
		return err
	}
	defer kafkaConn.Close() // after the writer's Close, deferred below
	if kafkaConn != nil {
		// A refused password or certificate will not mend: stop now.
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err := kafkaConn.Check(cctx, cfg.KafkaBrokers)
		cancel()
		if errors.Is(err, kafkaconn.ErrRefused) {
			return err
		}
		if err != nil {
			logger.Warn("Kafka does not answer yet; will retry", "error", err)
		}
	}
	var agent *gpu.Agent
	if src != nil {
		pub, err := gpu.NewKafkaPublisher(gpu.KafkaConfig{Brokers: cfg.KafkaBrokers, Kafka: kafkaConn, Topic: cfg.Topic})
		if err != nil {
			return err
		}
		defer func() {
			if err := pub.Close(); err != nil {
				logger.Warn("close Kafka writer", "error", err)
			}
		}()
		if agent, err = gpu.NewAgent(agentCfg, src, attr, pub, reg, logger, now); err != nil {
			return err
		}
	}
	var eagent *engine.Agent
	if cfg.scrapesEngines() {
		epub, err := engine.NewKafkaPublisher(cfg.KafkaBrokers, kafkaConn, cfg.EngineTopic)
		if err != nil {
			return err
		}
		defer func() {
			if err := epub.Close(); err != nil {
				logger.Warn("close engine Kafka writer", "error", err)
			}
		}()
		if eagent, err = engine.NewAgent(engineCfg, epub, reg, logger, now); err != nil {
			return err
		}
	}

	actx, stop := context.WithCancel(ctx)
	defer stop()
	g, gctx := errgroup.WithContext(actx)
	if cfg.HTTPAddr != "" {
		ln, err := net.Listen("tcp", cfg.HTTPAddr)
		if err != nil {
			return fmt.Errorf("listen on --http-addr: %w", err)
		}
		srv := &http.Server{Handler: httpHandler(reg, agent, eagent), ReadHeaderTimeout: 5 * time.Second}
		g.Go(func() error {
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serve %s: %w", cfg.HTTPAddr, err)
			}
			return nil
		})
		g.Go(func() error {
			<-gctx.Done()
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			return srv.Shutdown(sctx)
		})
	}
	logger.Info("gpu-agent started", "source", cfg.Source, "node", cfg.Node, "interval", cfg.Interval,
		"kafka", cfg.KafkaBrokers, "topic", cfg.Topic, "engine_endpoints", len(cfg.EngineEndpoints), "engine_pod_selector", cfg.EnginePods.Selector, "engine_topic", cfg.EngineTopic, "http", cfg.HTTPAddr)
	if agent != nil {
		g.Go(func() error {
			if eagent == nil {
				defer stop() // a finished replay stops the HTTP server too
			}
			return agent.Run(gctx)
		})
	}
	if eagent != nil {
		g.Go(func() error { return eagent.Run(gctx) })
	}
	err = g.Wait()
	logger.Info("gpu-agent stopped")
	return err
}

func newAttributor(cfg Config) (*gpu.Attributor, error) {
	var m gpu.DeploymentMap
	if cfg.DeploymentMap != "" {
		var err error
		if m, err = gpu.LoadDeploymentMap(cfg.DeploymentMap); err != nil {
			return nil, err
		}
	}
	var re *regexp.Regexp
	if cfg.PodRegex != "" {
		re = regexp.MustCompile(cfg.PodRegex) // checked by Validate
	}
	return gpu.NewAttributor(gpu.AttributionConfig{Map: m, PodRegex: re, Region: cfg.Region, Pool: cfg.Pool})
}

func openSource(cfg Config, logger *slog.Logger) (gpu.Source, error) {
	switch cfg.Source {
	case gpu.SourceDCGM:
		return gpu.NewDCGMSource(gpu.DCGMConfig{
			Mode: gpu.DCGMMode(cfg.DCGMMode), Address: cfg.DCGMAddress,
			KeepAge: max(5*time.Minute, 3*cfg.Interval),
		}, logger)
	case gpu.SourceNVML:
		return gpu.NewNVMLSource(logger)
	case gpu.SourceExporter:
		ec := gpu.ExporterConfig{URL: cfg.ExporterURL, Timeout: min(cfg.Interval, 30*time.Second)}
		if cfg.NodeSet {
			ec.Node = cfg.Node
		}
		return gpu.NewExporterSource(ec, logger)
	case gpu.SourceReplay:
		return gpu.NewReplaySource(gpu.ReplayConfig{Path: cfg.File, Loop: cfg.Loop})
	}
	return nil, fmt.Errorf("--source %q: unknown", cfg.Source)
}

func httpHandler(reg *prometheus.Registry, agent *gpu.Agent, eagent *engine.Agent) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz/live", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /healthz/ready", func(w http.ResponseWriter, _ *http.Request) {
		if (agent != nil && !agent.Healthy()) || (eagent != nil && !eagent.Healthy()) {
			http.Error(w, "GPU source or Kafka failing; see the logs and meter_gpu_agent_* metrics", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	})
	return mux
}

// jsonLines is the publisher of --once: one protojson sample per line
// (for GPU samples, the format --source replay reads).
type jsonLines[T proto.Message] struct {
	mu sync.Mutex
	w  io.Writer
}

func (j *jsonLines[T]) Publish(_ context.Context, samples []T) ([]T, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for i, s := range samples {
		b, err := protojson.Marshal(s)
		if err == nil {
			_, err = fmt.Fprintf(j.w, "%s\n", b)
		}
		if err != nil {
			return samples[i:], fmt.Errorf("write sample: %w", err)
		}
	}
	return nil, nil
}
