package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"runtime"
	"slices"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"tokenmeter/internal/logsetup"
	"tokenmeter/rollup"
)

// runHour is `meterbench hour`: it loads one hour of synthetic events (the
// events of `meterbench queries`) into a private ClickHouse and rolls that
// hour up several times, printing how long reading and aggregating the hour
// and writing each rollup table took, and the CPU time meterbench and
// ClickHouse used. Each run starts once ClickHouse merges nothing: the
// merges of the parts earlier runs wrote are not this run's work.
func runHour(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("meterbench hour", flag.ContinueOnError)
	fs.SetOutput(stderr)
	events := fs.Int("events", 1_000_000, "events in the hour")
	tenants := fs.Int("tenants", 1000, "tenants")
	runs := fs.Int("runs", 3, "rollups of the hour")
	pause := fs.Duration("pause", 0, "wait this long between runs (meterd's rollup job runs every --rollup-interval, 10s)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the rollups after the first (which warms up connections and memory) to this file")
	memProfile := fs.String("memprofile", "", "write a profile of the memory the rollups allocated to this file")
	keep := fs.String("keep", "", "keep the ClickHouse directory in DIR (new), for experiments")
	queryLog := fs.Bool("query-log", false, "print ClickHouse's own time for each query of the last rollup (system.query_log)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	logger := logsetup.Warnings(stderr)
	if *keep != "" {
		if err := newFolder("keep", *keep); err != nil {
			return err
		}
	}
	bch, err := startClickHouse(ctx, logger, *keep, "bench_h", clickhouse.Options{})
	if err != nil {
		return err
	}
	defer bch.close()
	store, conn := bch.store, bch.conn
	hour := time.Now().UTC().Truncate(time.Hour).Add(-24 * time.Hour)
	t0 := time.Now()
	if err := conn.Exec(ctx, loadSQL(0, *events, *events, *tenants, hour, time.Hour)); err != nil {
		return fmt.Errorf("load events: %w", err)
	}
	loaded := time.Since(t0)
	if err := conn.Exec(ctx, "OPTIMIZE TABLE inference_events FINAL"); err != nil {
		return err
	}
	stopProfile := func() {}
	defer func() { stopProfile() }()
	if *memProfile != "" {
		runtime.MemProfileRate = 64 << 10
		defer writeAllocProfile(*memProfile, stderr)
	}
	fmt.Fprintf(stdout, "rollup of one hour of %d events (%d tenants; loaded by INSERT … SELECT in %.2f s, merged in %.2f s)\n",
		*events, *tenants, loaded.Seconds(), time.Since(t0).Seconds()-loaded.Seconds())
	rctx := ctx
	if *queryLog {
		rctx = clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"log_queries": 1}))
	}
	cpu := newCPUMeter(bch.pid)
	var walls []time.Duration
	var roller rollup.Roller // keeps the events' memory from run to run, as the job's does
	for i := range *runs {
		if i == *runs-1 && *queryLog {
			if err := conn.Exec(ctx, "SYSTEM FLUSH LOGS"); err != nil {
				return err
			}
			if err := conn.Exec(ctx, "TRUNCATE TABLE IF EXISTS system.query_log"); err != nil {
				return err
			}
		}
		if i == min(1, *runs-1) {
			if stopProfile, err = startCPUProfile(*cpuProfile); err != nil {
				return err
			}
		}
		if i > 0 {
			time.Sleep(*pause)
		}
		if err := waitForMerges(ctx, conn); err != nil {
			return err
		}
		t0 := time.Now()
		cpu.lap()
		took, err := roller.RollupHour(rctx, store, hour, rollup.DefaultSLOSet().Spec(0), uint64(time.Now().UnixMilli())<<16)
		if err != nil {
			return err
		}
		wall := time.Since(t0)
		used := cpu.lap()
		fmt.Fprintf(stdout, "run %d: %6.2f s  (read and aggregate %.2f s; then inserts at once: minute %.2f s, hour %.2f s, tenant-hour %.2f s, total-hour %.2f s; CPU: meterbench %.2f s, ClickHouse %.2f s; page faults: %dk, %dk)\n",
			i+1, wall.Seconds(), took["read"].Seconds(), took["rollup_minute_recent"].Seconds(), took["rollup_hour"].Seconds(),
			took["rollup_tenant_hour"].Seconds(), took["rollup_total_hour"].Seconds(), used.cpu[0].Seconds(), used.cpu[1].Seconds(),
			used.faults[0]/1000, used.faults[1]/1000)
		walls = append(walls, wall)
	}
	if len(walls) > 1 {
		warm := slices.Clone(walls[1:])
		slices.Sort(warm)
		fmt.Fprintf(stdout, "runs 2-%d (the job's steady state): median %.2f s, max %.2f s; run 1 (a new process and server: fresh memory in both) %.2f s\n",
			len(walls), warm[len(warm)/2].Seconds(), warm[len(warm)-1].Seconds(), walls[0].Seconds())
	}
	if *queryLog {
		return printQueryLog(ctx, conn, stdout, "ClickHouse's time per query of the last rollup:")
	}
	return nil
}

// waitForMerges waits (up to a minute) until ClickHouse runs no merge, so
// that a run does not pay for merging the parts of the runs before it.
func waitForMerges(ctx context.Context, conn driver.Conn) error {
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		var n uint64
		if err := conn.QueryRow(ctx, "SELECT count() FROM system.merges").Scan(&n); err != nil {
			return fmt.Errorf("system.merges: %w", err)
		}
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// printQueryLog prints the finished queries of system.query_log under title: how long
// ClickHouse spent on each, the CPU time its threads used, and the rows it
// read and wrote.
func printQueryLog(ctx context.Context, conn driver.Conn, stdout io.Writer, title string) error {
	if err := conn.Exec(ctx, "SYSTEM FLUSH LOGS"); err != nil {
		return err
	}
	rows, err := conn.Query(ctx, `SELECT query_duration_ms,
  intDiv(ProfileEvents.Values[indexOf(ProfileEvents.Names, 'UserTimeMicroseconds')] + ProfileEvents.Values[indexOf(ProfileEvents.Names, 'SystemTimeMicroseconds')], 1000),
  read_rows, written_rows, memory_usage, substring(replaceAll(query, '\n', ' '), 1, 60)
FROM system.query_log WHERE type = 2 AND query NOT LIKE '%system.%' ORDER BY event_time, query_duration_ms`)
	if err != nil {
		return err
	}
	defer rows.Close()
	fmt.Fprintln(stdout, title)
	for rows.Next() {
		var (
			d, cpu, read uint64
			written      uint64
			mem          uint64
			q            string
		)
		if err := rows.Scan(&d, &cpu, &read, &written, &mem, &q); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "  %6d ms  CPU %6d ms  read %8d  written %8d  mem %5d MiB  %s\n", d, cpu, read, written, mem>>20, q)
	}
	return rows.Err()
}
