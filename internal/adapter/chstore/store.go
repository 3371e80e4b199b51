// Package chstore owns tokenmeter's ClickHouse access: the schema (embedded,
// versioned migrations, and the tables' column names in schema.go),
// columnar batch inserts of raw events (the batches ingest/sink declares),
// the reads and writes of the rollup job (hours, days, cost), the SQL of
// sketch's histograms, and the SQL and scans of the reads package query
// plans. Every other package reaches
// ClickHouse through the small interfaces it declares itself, implemented
// by *Store, and owns the records they carry.
//
// It holds no domain rules: it does not decide what is valid or how an
// event's ITL is defined (package ingest does), what a rollup counts,
// which days are rolled up or fresh (package rollup does), which cost
// policies exist (package billing does), nor who may see what (package api
// does).
package chstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"tokenmeter/internal/tlsfiles"
)

// Config locates the ClickHouse server and database.
type Config struct {
	// Addr lists native-protocol addresses (host:port).
	Addr []string
	// Database is created if missing. Default "tokenmeter".
	Database string
	// Username and Password authenticate; empty means the "default" user.
	Username string
	Password string
	// TLS, when set, speaks the native protocol over TLS (the server's
	// tcp_port_secure, 9440 by default).
	TLS *tls.Config
	// DialTimeout bounds connection attempts. Default 5s.
	DialTimeout time.Duration
	// MaxOpenConns bounds the connection pool. Default 16: an hour's rollup
	// holds up to five connections at once and the job rolls up two hours at
	// once, beside ingest and API queries.
	MaxOpenConns int
	// Compression of the native protocol: "lz4" (default) or "none" (cheaper
	// on loopback, where the bytes cost less than the CPU).
	Compression string
	// Cluster, when set, is the name of a cluster of the server's
	// remote_servers: the schema is made of Replicated tables ON CLUSTER
	// and Distributed tables over them (cluster.go, docs/cluster.md).
	// Empty (the default) is single-node mode.
	Cluster string
}

// Validate reports every problem of the configuration at once.
func (c Config) Validate() error {
	var errs []error
	if len(c.Addr) == 0 {
		errs = append(errs, errors.New("clickhouse: no address"))
	}
	if c.Database != "" && !isIdent(c.Database) {
		errs = append(errs, fmt.Errorf("clickhouse: database name %q: only letters, digits and _", c.Database))
	}
	if c.Cluster != "" && !isIdent(c.Cluster) {
		errs = append(errs, fmt.Errorf("clickhouse: cluster name %q: only letters, digits and _", c.Cluster))
	}
	switch c.Compression {
	case "", "lz4", "none":
	default:
		errs = append(errs, fmt.Errorf("clickhouse: compression %q: want lz4 or none", c.Compression))
	}
	return errors.Join(errs...)
}

func (c Config) withDefaults() Config {
	if c.Database == "" {
		c.Database = "tokenmeter"
	}
	if c.Username == "" {
		c.Username = "default"
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = 5 * time.Second
	}
	if c.MaxOpenConns == 0 {
		c.MaxOpenConns = 16
	}
	return c
}

// readBufferBytes is the read buffer ClickHouse gives each column file a
// query reads (max_read_buffer_size, 1 MiB by default). A tenant's rows lie
// in a few granules of each of a table's parts, so a one-tenant query reads
// little from many files: allocating and first touching 1 MiB for each
// was most of the server's time for a tenant's month of latency on 18.16
// (65 ms of CPU; 38 ms with 64 KiB). Large reads are not slowed: a larger
// compressed block is read whole all the same.
const readBufferBytes = 64 << 10

// maxReplicaDelaySeconds is how far behind a replica may be and still be
// read in cluster mode (max_replica_delay_for_distributed_queries).
const maxReplicaDelaySeconds = 10

// Store is a ClickHouse-backed event store.
type Store struct {
	conn   driver.Conn
	cfg    Config
	logger *slog.Logger
	// saving serializes SaveStatement's check-then-insert in this process
	// (ClickHouse has no insert-if-absent); closes on several replicas must
	// run under one lease.
	saving sync.Mutex
	// usageCostChunk bounds the rows of one query of EachUsageCost;
	// usageCostChunkRows when zero (tests set it).
	usageCostChunk int
	// inserts are the prepared batches of the ingest inserts (insert.go).
	inserts insertCache
}

// Open connects to ClickHouse and makes sure the database exists. It does not
// apply migrations; call Migrate. Open does not fail when the server is down
// (the connection is lazy), so that a service can start and report not-ready.
func Open(cfg Config, logger *slog.Logger) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	settings := clickhouse.Settings{"max_read_buffer_size": readBufferBytes}
	if cfg.Cluster != "" {
		// An insert into a Distributed table returns once every shard
		// it touches has written its rows, not once they are queued on the
		// server that took it: ingest commits Kafka offsets after it.
		settings["insert_distributed_sync"] = 1
		// A Distributed table reads and writes the server's own shard on
		// the server itself when it is a replica of it (the default,
		// prefer_localhost_replica 1), whatever load_balancing says: a
		// meterd on the second replica of a shard would then read what the
		// first has not yet sent it (a rollup missing events that ingest,
		// talking to the first, had written). Off, every meterd reads and
		// writes each shard on the replica load_balancing (in_order) picks.
		settings["prefer_localhost_replica"] = 0
		// A replica more than this many seconds behind its replication
		// queue (one catching up after a restart) is not read while its
		// twin is fresher: the first replica is read again once it has
		// caught up, not as soon as it answers.
		settings["max_replica_delay_for_distributed_queries"] = maxReplicaDelaySeconds
	}
	conn, err := clickhouse.Open(&clickhouse.Options{
		Addr:         cfg.Addr,
		Auth:         clickhouse.Auth{Database: cfg.Database, Username: cfg.Username, Password: cfg.Password},
		DialTimeout:  cfg.DialTimeout,
		MaxOpenConns: cfg.MaxOpenConns,
		MaxIdleConns: cfg.MaxOpenConns,
		Compression:  compression(cfg.Compression),
		Settings:     settings,
		TLS:          cfg.TLS,
	})
	if err != nil {
		return nil, fmt.Errorf("open clickhouse: %w", err)
	}
	if cfg.Cluster != "" {
		conn = clusterConn{conn}
	}
	return &Store{conn: conn, cfg: cfg, logger: logger}, nil
}

// ClickHouse's error codes for a refused login.
const (
	codeUnknownUser          = 192
	codeWrongPassword        = 193
	codeRequiredPassword     = 194
	codeAuthenticationFailed = 516 // releases after 18.x
)

// Refused tells whether err is ClickHouse refusing the user or password,
// or a TLS handshake that failed on a certificate: retrying cannot help.
func Refused(err error) bool {
	var ex *clickhouse.Exception
	if errors.As(err, &ex) {
		switch ex.Code {
		case codeUnknownUser, codeWrongPassword, codeRequiredPassword, codeAuthenticationFailed:
			return true
		}
	}
	return tlsfiles.IsCertificateError(err)
}

// Close closes the connection pool.
func (s *Store) Close() error { return s.conn.Close() }

// Ping checks that the server answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.conn.Ping(ctx); err != nil {
		return fmt.Errorf("ping clickhouse: %w", err)
	}
	return nil
}

// Database is the database the store works in.
func (s *Store) Database() string { return s.cfg.Database }

// ensureDatabase creates the database through a connection to "default",
// since a connection naming a missing database is refused.
func (s *Store) ensureDatabase(ctx context.Context) error {
	conn, err := clickhouse.Open(&clickhouse.Options{
		Addr:        s.cfg.Addr,
		Auth:        clickhouse.Auth{Database: "default", Username: s.cfg.Username, Password: s.cfg.Password},
		DialTimeout: s.cfg.DialTimeout,
		TLS:         s.cfg.TLS,
	})
	if err != nil {
		return fmt.Errorf("open clickhouse: %w", err)
	}
	defer conn.Close()
	create := "CREATE DATABASE IF NOT EXISTS " + s.cfg.Database
	if s.cfg.Cluster != "" {
		// ON CLUSTER waits for every server, up to 180 s for one that is
		// down: only when the database is missing here, so that a meterd
		// can start while a server of the cluster is down.
		var n uint64
		if err := conn.QueryRow(ctx, "SELECT count() FROM system.databases WHERE name = ?", s.cfg.Database).Scan(&n); err != nil {
			return fmt.Errorf("look up database %s: %w", s.cfg.Database, err)
		}
		if n > 0 {
			return nil
		}
		create += " ON CLUSTER " + s.cfg.Cluster
	}
	if err := conn.Exec(ctx, create); err != nil {
		return fmt.Errorf("create database %s: %w", s.cfg.Database, err)
	}
	return nil
}

func isIdent(s string) bool {
	for i, r := range s {
		switch {
		case r == '_', r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z':
		case r >= '0' && r <= '9' && i > 0:
		default:
			return false
		}
	}
	return s != ""
}

func compression(name string) *clickhouse.Compression {
	if name == "none" {
		return &clickhouse.Compression{Method: clickhouse.CompressionNone}
	}
	return &clickhouse.Compression{Method: clickhouse.CompressionLZ4}
}
