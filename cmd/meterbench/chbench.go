package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"tokenmeter/internal/chserver"
	"tokenmeter/internal/chstore"
)

// benchClickHouse is a private ClickHouse for a benchmark: a migrated store
// and a plain connection on one database.
type benchClickHouse struct {
	store *chstore.Store
	conn  driver.Conn
	stops []func()
}

// startClickHouse starts ClickHouse on the folder dir (a new temporary
// one, removed by close, when dir is "") and opens database db on it: the
// store without compression (loopback), conn with opts.
func startClickHouse(ctx context.Context, logger *slog.Logger, dir, db string, opts clickhouse.Options) (b *benchClickHouse, err error) {
	b = &benchClickHouse{}
	defer func() {
		if err != nil {
			b.close()
		}
	}()
	if dir == "" {
		tmp, err := os.MkdirTemp("", "meterbench-"+db+"-")
		if err != nil {
			return nil, err
		}
		b.stops = append(b.stops, func() { os.RemoveAll(tmp) })
		dir = filepath.Join(tmp, "clickhouse")
	}
	ch, err := chserver.Start(ctx, chserver.Config{Dir: dir, Logger: logger})
	if err != nil {
		return nil, err
	}
	b.stops = append(b.stops, func() { ch.Stop(context.WithoutCancel(ctx)) })
	if b.store, err = chstore.Open(chstore.Config{Addr: []string{ch.Addr()}, Database: db, Compression: "none"}, logger); err != nil {
		return nil, err
	}
	b.stops = append(b.stops, func() { b.store.Close() })
	if _, err := b.store.Migrate(ctx); err != nil {
		return nil, err
	}
	opts.Addr, opts.Auth = []string{ch.Addr()}, clickhouse.Auth{Database: db}
	if b.conn, err = clickhouse.Open(&opts); err != nil {
		return nil, err
	}
	b.stops = append(b.stops, func() { b.conn.Close() })
	return b, nil
}

// close closes the connections, stops ClickHouse and removes a temporary
// folder, in that order.
func (b *benchClickHouse) close() {
	for i := len(b.stops) - 1; i >= 0; i-- {
		b.stops[i]()
	}
	b.stops = nil
}

// newFolder checks that the folder a --keep flag names does not exist yet.
func newFolder(flag, dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return fmt.Errorf("--%s %s: already exists", flag, dir)
	}
	return nil
}

// startCPUProfile writes a CPU profile to path until stop is called; with
// path "" it does nothing.
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
