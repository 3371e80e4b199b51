// Package devenv starts the engines tokenmeter runs on, for development and
// tests: an in-process Kafka-protocol broker (franz-go's kfake) and a
// private clickhouse-server process on loopback.
//
// meterd --dev starts both with Start. Tests (through chtest) and the
// benchmarks start one engine at a time with StartClickHouse and
// StartKafka. The engines themselves live in devenv's internal packages;
// every caller goes through this one.
package devenv

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"tokenmeter/internal/adapter/devenv/internal/chserver"
	"tokenmeter/internal/adapter/devenv/internal/devkafka"
)

// The engines and their configuration.
type (
	// ClickHouse is a private clickhouse-server process that owns one
	// directory (its data, logs, ports and config).
	ClickHouse = chserver.Server
	// ClickHouseConfig configures a private ClickHouse: its directory and
	// optionally users with passwords and a TLS port.
	ClickHouseConfig = chserver.Config
	ClickHouseUser   = chserver.User
	ClickHouseTLS    = chserver.TLS

	// Kafka is an in-process single-node broker.
	Kafka = devkafka.Broker
	// KafkaConfig configures the broker: its address, topics and
	// optionally TLS and SASL users.
	KafkaConfig = devkafka.Config
	KafkaUser   = devkafka.User
)

// ErrNotInstalled reports that no clickhouse-server binary was found.
var ErrNotInstalled = chserver.ErrNotInstalled

// clickHouseStopTimeout bounds the stop of the private ClickHouse in Close.
const clickHouseStopTimeout = 30 * time.Second

// StartClickHouse starts a private ClickHouse on cfg.Dir. The error wraps
// ErrNotInstalled when no binary is found.
func StartClickHouse(ctx context.Context, cfg ClickHouseConfig) (*ClickHouse, error) {
	return chserver.Start(ctx, cfg)
}

// FindClickHouse returns the path of the clickhouse-server binary, or an
// error wrapping ErrNotInstalled.
func FindClickHouse() (string, error) { return chserver.FindBinary() }

// StartKafka starts a broker and creates cfg's topics.
func StartKafka(cfg KafkaConfig) (*Kafka, error) { return devkafka.Start(cfg) }

// Config configures the development environment of Start.
type Config struct {
	// DataDir holds the broker's state (DataDir/kafka) and the private
	// ClickHouse (DataDir/clickhouse); it is created if missing.
	DataDir string
	// KafkaAddr is the broker's host:port; port 0 picks a free one.
	KafkaAddr string
	// Topics are created with the broker's default partitions,
	// SinglePartitionTopics with one (leases).
	Topics, SinglePartitionTopics []string
	// ClickHouse is the address of a running server to use; empty starts a
	// private one, restarted if it dies until Close.
	ClickHouse string
	Logger     *slog.Logger
}

// Env is a running development environment.
type Env struct {
	// KafkaAddr is the broker's address.
	KafkaAddr string
	// ClickHouseAddr is the native address of the private server, or
	// Config.ClickHouse when one was given.
	ClickHouseAddr string
	stops          []func() // in the order they were started
}

// Start starts the broker, which deletes the records its consumer groups
// have committed (KafkaConfig.TrimCommitted), and, unless cfg.ClickHouse
// names one, a supervised private ClickHouse sized for a laptop
// (ClickHouseConfig.Lean). Close stops them.
func Start(ctx context.Context, cfg Config) (_ *Env, err error) {
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	e := &Env{ClickHouseAddr: cfg.ClickHouse}
	defer func() {
		if err != nil {
			e.Close()
		}
	}()
	broker, err := StartKafka(KafkaConfig{
		Addr:                  cfg.KafkaAddr,
		DataDir:               filepath.Join(cfg.DataDir, "kafka"),
		Topics:                cfg.Topics,
		SinglePartitionTopics: cfg.SinglePartitionTopics,
		Logger:                cfg.Logger,
		// What the consumers committed leaves the disk: a make run demo's
		// events otherwise stayed in DataDir/kafka (60 MB).
		TrimCommitted: true,
	})
	if err != nil {
		return nil, err
	}
	e.stops = append(e.stops, broker.Close)
	e.KafkaAddr = broker.Addr()
	if cfg.ClickHouse != "" {
		return e, nil
	}
	// Lean: sized for a laptop (the tests and benchmarks start theirs
	// with StartClickHouse, sized for speed).
	srv, err := StartClickHouse(ctx, ClickHouseConfig{Dir: filepath.Join(cfg.DataDir, "clickhouse"), Logger: cfg.Logger, Lean: true})
	if err != nil {
		return nil, fmt.Errorf("start private ClickHouse: %w", err)
	}
	e.stops = append(e.stops, func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), clickHouseStopTimeout)
		defer cancel()
		if err := srv.Stop(sctx); err != nil && cfg.Logger != nil {
			cfg.Logger.Warn("stop ClickHouse", "error", err)
		}
	})
	// Restart the server if it dies while the environment runs. Supervision
	// ends before the server stops (Close runs the stops in reverse).
	superviseCtx, stopSupervising := context.WithCancel(ctx)
	supervised := make(chan struct{})
	go func() {
		defer close(supervised)
		srv.Supervise(superviseCtx, chserver.Backoff{})
	}()
	e.stops = append(e.stops, func() { stopSupervising(); <-supervised })
	e.ClickHouseAddr = srv.Addr()
	return e, nil
}

// Close stops what Start started, in reverse order: supervision, the
// private ClickHouse, the broker (which persists its state).
func (e *Env) Close() {
	for i := len(e.stops) - 1; i >= 0; i-- {
		e.stops[i]()
	}
	e.stops = nil
}
