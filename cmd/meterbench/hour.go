package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"tokenmeter/internal/chserver"
	"tokenmeter/internal/chstore"
	"tokenmeter/rollup"
)

// runHour is `meterbench hour`: it loads one hour of synthetic events (the
// events of `meterbench queries`) into a private ClickHouse and rolls that
// hour up several times, printing how long reading and aggregating the hour
// and writing each rollup table took.
func runHour(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("meterbench hour", flag.ContinueOnError)
	fs.SetOutput(stderr)
	events := fs.Int("events", 1_000_000, "events in the hour")
	tenants := fs.Int("tenants", 1000, "tenants")
	runs := fs.Int("runs", 3, "rollups of the hour")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the rollups to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	dir, err := os.MkdirTemp("", "meterbench-h-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ch, err := chserver.Start(ctx, chserver.Config{Dir: filepath.Join(dir, "clickhouse"), Logger: logger})
	if err != nil {
		return err
	}
	defer ch.Stop(context.WithoutCancel(ctx))
	store, err := chstore.Open(chstore.Config{Addr: []string{ch.Addr()}, Database: "bench_h", Compression: "none"}, logger)
	if err != nil {
		return err
	}
	defer store.Close()
	if _, err := store.Migrate(ctx); err != nil {
		return err
	}
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{ch.Addr()}, Auth: clickhouse.Auth{Database: "bench_h"}})
	if err != nil {
		return err
	}
	defer conn.Close()
	hour := time.Now().UTC().Truncate(time.Hour).Add(-24 * time.Hour)
	if err := conn.Exec(ctx, loadSQL(0, *events, *events, *tenants, hour, time.Hour)); err != nil {
		return fmt.Errorf("load events: %w", err)
	}
	if err := conn.Exec(ctx, "OPTIMIZE TABLE inference_events FINAL"); err != nil {
		return err
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	fmt.Fprintf(stdout, "rollup of one hour of %d events (%d tenants)\n", *events, *tenants)
	for i := range *runs {
		t0 := time.Now()
		took, err := store.RollupHourTimed(ctx, hour, rollup.DefaultSLOSet().Spec(0), uint64(time.Now().UnixMilli())<<16)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "run %d: %6.2f s  (read and aggregate %.2f s; then inserts at once: minute %.2f s, hour %.2f s, tenant-hour %.2f s, total-hour %.2f s)\n",
			i+1, time.Since(t0).Seconds(), took["read"].Seconds(), took["rollup_minute"].Seconds(), took["rollup_hour"].Seconds(),
			took["rollup_tenant_hour"].Seconds(), took["rollup_total_hour"].Seconds())
	}
	return nil
}
