package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/prometheus/client_golang/prometheus"

	"tokenmeter/ingest"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/devenv"
	"tokenmeter/internal/logsetup"
	"tokenmeter/internal/testkit/chcluster"
	"tokenmeter/rollup"
)

// runCluster is `meterbench cluster` (part of make bench): ingest
// throughput of 1, 2 and 3 `meterd --role ingest` replicas in one consumer
// group into a ClickHouse cluster of two shards (the first with two
// replicas) in cluster mode, all on this machine; then the disk the events
// take on each server and the rollup job's time for them. The sizing guide
// of deploy/README.md quotes these figures.
func runCluster(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("meterbench cluster", flag.ContinueOnError)
	fs.SetOutput(stderr)
	events := fs.Int("events", 1_000_000, "events per run")
	partitions := fs.Int("partitions", 12, "partitions of the events topic")
	replicaList := fs.String("replicas", "1,2,3", "comma-separated numbers of ingest replicas, one run each")
	meterd := fs.String("meterd", "bin/meterd", "meterd binary to measure (make build)")
	batch := fs.Int("batch-size", 20_000, "meterd --batch-size")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var counts []int
	for _, f := range strings.Split(*replicaList, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("--replicas: %q is not a positive number", f)
		}
		counts = append(counts, n)
	}
	if _, err := os.Stat(*meterd); err != nil {
		return fmt.Errorf("meterd binary: %w (run make build)", err)
	}
	progress := func(format string, a ...any) { fmt.Fprintf(stderr, "meterbench: "+format+"\n", a...) }
	dir, err := os.MkdirTemp("", "meterbench-cluster-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	progress("starting ZooKeeper and three ClickHouse servers (two shards, the first with two replicas)")
	c, err := chcluster.StartDir(ctx, chcluster.Layout{}, dir, progress)
	if err != nil {
		return err
	}
	defer c.Stop()
	broker, err := devenv.StartKafka(devenv.KafkaConfig{Addr: "127.0.0.1:0", Partitions: int32(*partitions),
		Topics: []string{"bench.cluster", ingest.DefaultDLQTopic}})
	if err != nil {
		return err
	}
	defer broker.Close()
	progress("generating and producing %d events", *events)
	protoVals, _, evs, err := generate(*events)
	if err != nil {
		return err
	}
	if err := produce(ctx, broker.Addr(), "bench.cluster", protoVals, ingest.ContentTypeProtobuf); err != nil {
		return err
	}
	protoVals = nil

	host, _ := os.Hostname()
	fmt.Fprintf(stdout, "tokenmeter cluster ingest benchmark — %s, %d CPUs, %s\n", host, runtime.NumCPU(), time.Now().UTC().Format(time.RFC3339))
	fmt.Fprintf(stdout, "ClickHouse cluster: 2 shards (2 + 1 replicas) and ZooKeeper on this machine; %d events per run, %d partitions, --batch-size %d\n\n",
		*events, *partitions, *batch)
	fmt.Fprintf(stdout, "%-9s %10s %12s %13s %14s %18s %22s\n", "replicas", "events/s", "per replica", "vs 1 replica", "per partition",
		"meterd CPU µs/event", "ClickHouse CPU µs/event")
	logger := logsetup.Warnings(stderr)
	var base float64
	var firstDB string
	for _, n := range counts {
		db := fmt.Sprintf("bench_c%d", n)
		if firstDB == "" {
			firstDB = db
		}
		progress("%d ingest replica(s): migrating %s on the cluster", n, db)
		store, err := chstore.Open(chstore.Config{Addr: []string{c.Addr(1, 0)}, Database: db, Cluster: c.Name(), Compression: "none"}, logger)
		if err != nil {
			return err
		}
		if _, err := store.Migrate(ctx); err != nil {
			store.Close()
			return err
		}
		store.Close()
		progress("%d ingest replica(s): consuming", n)
		chBefore := cpuOf(processesUnder(dir))
		res, err := clusterRun(ctx, c, *meterd, broker.Addr(), db, n, *events, *batch)
		if err != nil {
			return err
		}
		chCPU := cpuOf(processesUnder(dir)) - chBefore
		rate := float64(*events) / res.elapsed.Seconds()
		if base == 0 {
			base = rate
		}
		fmt.Fprintf(stdout, "%-9d %10.0f %12.0f %12.2fx %14.0f %18.1f %22.1f\n", n, rate, rate/float64(n), rate/base, rate/float64(*partitions),
			res.meterdCPU.Seconds()*1e6/float64(*events), chCPU.Seconds()*1e6/float64(*events))
	}

	// Disk: the events' local tables on each server, after merges.
	fmt.Fprintf(stdout, "\nDisk of %s.inference_events_local (%d events), per server:\n", firstDB, *events)
	var total uint64
	for s, reps := range c.Layout().Replicas {
		for r := range reps {
			b, rows, err := localBytes(ctx, c.Addr(s, r), firstDB)
			if err != nil {
				return err
			}
			total += b
			fmt.Fprintf(stdout, "  shard %d replica %d: %8d rows %10.1f MiB\n", s+1, r+1, rows, float64(b)/(1<<20))
		}
	}
	per100M := float64(total) * 1e8 / float64(*events) / (1 << 30)
	fmt.Fprintf(stdout, "  all servers (shard 1 twice): %.1f MiB = %.1f GiB per 100M events with this layout\n", float64(total)/(1<<20), per100M)

	// Rollup: the job's first run over every hour of the events, on the
	// cluster and, for the ratio, on one server.
	store, err := chstore.Open(chstore.Config{Addr: []string{c.Addr(1, 0)}, Database: firstDB, Cluster: c.Name(), Compression: "none"}, logger)
	if err != nil {
		return err
	}
	defer store.Close()
	progress("rolling up %s on the cluster", firstDB)
	hours, took, err := rollupOnce(ctx, store, logger)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nRollup of the %d events (%d hours), the job's first run:\n  cluster:    %8s, %.2f s per hour of %d events\n",
		*events, hours, took.Round(time.Millisecond), took.Seconds()/float64(hours), *events/hours)
	progress("rolling up the same events on one server")
	single, err := devenv.StartClickHouse(ctx, devenv.ClickHouseConfig{Dir: filepath.Join(dir, "single"), Logger: logger})
	if err != nil {
		return err
	}
	defer single.Stop(context.WithoutCancel(ctx))
	if _, err := rawInsert(ctx, single.Addr(), "bench_single", "none", evs, *batch, logger); err != nil {
		return err
	}
	sstore, err := chstore.Open(chstore.Config{Addr: []string{single.Addr()}, Database: "bench_single", Compression: "none"}, logger)
	if err != nil {
		return err
	}
	defer sstore.Close()
	shours, stook, err := rollupOnce(ctx, sstore, logger)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "  one server: %8s, %.2f s per hour (%d hours); cluster / one server %.2fx\n",
		stook.Round(time.Millisecond), stook.Seconds()/float64(shours), shours, took.Seconds()/stook.Seconds())
	return nil
}

// rollupOnce runs the rollup job once over everything in store, and says
// how many hours it rolled up in how long.
func rollupOnce(ctx context.Context, store *chstore.Store, logger *slog.Logger) (int, time.Duration, error) {
	job, err := rollup.NewJob(rollup.Config{Settle: -time.Second, Overlap: time.Nanosecond}, store, prometheus.NewRegistry(), logger, time.Now)
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	hours, err := job.RunOnce(ctx)
	if err != nil {
		return 0, 0, err
	}
	if len(hours) == 0 {
		return 0, 0, errors.New("rollup: no hour rolled up")
	}
	return len(hours), time.Since(start), nil
}

type clusterResult struct {
	elapsed   time.Duration
	meterdCPU time.Duration // all replicas, user and system
}

// clusterRun starts n ingest replicas in one consumer group on database db,
// each talking to another server of the cluster, and returns the time from
// their start until all events are rows in the Distributed table, and the
// CPU time the replicas used meanwhile.
func clusterRun(ctx context.Context, c *chcluster.Cluster, meterd, broker, db string, n, events, batch int) (clusterResult, error) {
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{c.Addr(1, 0)}, Auth: clickhouse.Auth{Database: db}})
	if err != nil {
		return clusterResult{}, err
	}
	defer conn.Close()
	addrs := c.Addrs()
	var cmds []*exec.Cmd
	defer func() {
		for _, cmd := range cmds {
			cmd.Process.Signal(syscall.SIGTERM)
			cmd.Wait()
		}
	}()
	start := time.Now()
	for i := range n {
		cmd := exec.CommandContext(ctx, meterd, "--role", "ingest", "--clickhouse", addrs[i%len(addrs)],
			"--clickhouse-database", db, "--clickhouse-cluster", c.Name(), "--clickhouse-compression", "none",
			"--kafka-brokers", broker, "--events-topic", "bench.cluster", "--gpu-topic", "", "--group-id", "bench-"+db,
			"--http-addr", freeAddr(), "--grpc-addr", freeAddr(), "--batch-size", strconv.Itoa(batch), "--log-level", "warn")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			return clusterResult{}, fmt.Errorf("start meterd: %w", err)
		}
		cmds = append(cmds, cmd)
	}
	for deadline := time.Now().Add(15 * time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		rows, err := countRows(ctx, conn, "inference_events")
		if err == nil && rows >= uint64(events) {
			// Rows, not events, reached the count: a batch written again
			// after a rebalance counts twice until merged. Done when every
			// event is there.
			var distinct uint64
			if err := conn.QueryRow(ctx, "SELECT uniqExact(tenant_id, event_id) FROM inference_events").Scan(&distinct); err != nil || distinct < uint64(events) {
				continue
			}
			res := clusterResult{elapsed: time.Since(start)}
			var pids []int
			for _, cmd := range cmds {
				pids = append(pids, cmd.Process.Pid)
			}
			res.meterdCPU = cpuOf(pids)
			return res, nil
		}
		for _, cmd := range cmds {
			if cmd.ProcessState != nil {
				return clusterResult{}, errors.New("meterd exited")
			}
		}
	}
	return clusterResult{}, fmt.Errorf("%d replicas did not ingest %d events in 15 minutes", n, events)
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's CPU times: 100 on
// every Linux architecture Go supports.
const clockTicks = 100

// cpuOf is the user and system CPU time the processes pids have used so
// far (/proc/PID/stat); a process that is gone counts nothing.
func cpuOf(pids []int) time.Duration {
	var ticks int64
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// The fields after the command name, which is in parentheses
		// and may hold spaces: state is the first, utime the 12th.
		_, rest, ok := strings.Cut(string(b), ") ")
		f := strings.Fields(rest)
		if !ok || len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + s
	}
	return time.Duration(ticks) * time.Second / clockTicks
}

// processesUnder lists the processes whose command line names a path
// under dir: the cluster's ClickHouse servers and ZooKeeper.
func processesUnder(dir string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmdline), dir+"/") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// localBytes is the size on disk and the rows of the active parts of db's
// inference_events_local on the server at addr.
func localBytes(ctx context.Context, addr, db string) (bytes, rows uint64, err error) {
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{addr}})
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	err = conn.QueryRow(ctx, "SELECT sum(bytes_on_disk), sum(rows) FROM system.parts WHERE active AND database = ? AND table = 'inference_events_local'", db).Scan(&bytes, &rows)
	return bytes, rows, err
}
