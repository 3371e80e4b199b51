package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/ingest"
	"tokenmeter/ingest/sink"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/devenv"
	"tokenmeter/internal/logsetup"
	"tokenmeter/internal/testkit/bench"
	"tokenmeter/internal/workload"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

type config struct {
	events      int
	partitions  int
	meterd      string
	rate        int
	latencyDur  time.Duration
	batch       int
	batchWait   time.Duration
	skipCHK     bool
	narrowCHK   bool
	compression string
	profileDir  string
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	err := dispatch(ctx, args, getenv, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil // -h: the flag package printed the usage
	}
	return err
}

func dispatch(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "queries" {
		return runQueries(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "billing" {
		return runBilling(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "cluster" {
		return runCluster(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "hour" {
		return runHour(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "bombs" {
		return runBombs(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "insertcost" {
		return runInsertCost(ctx, args[1:], stdout, stderr)
	}
	var cfg config
	fs := flag.NewFlagSet("meterbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&cfg.events, "events", 1_000_000, "events per throughput run")
	fs.IntVar(&cfg.partitions, "partitions", 4, "partitions of the benchmark topics")
	fs.StringVar(&cfg.meterd, "meterd", "bin/meterd", "meterd binary to measure (make build)")
	fs.IntVar(&cfg.rate, "latency-rate", 10_000, "events/s of the latency run")
	fs.DurationVar(&cfg.latencyDur, "latency-duration", 20*time.Second, "length of the latency run")
	fs.IntVar(&cfg.batch, "batch-size", 100_000, "meterd --batch-size and the raw insert batch")
	fs.DurationVar(&cfg.batchWait, "batch-timeout", 500*time.Millisecond, "meterd --batch-timeout: below batch-size / batch-timeout events/s meterd's INSERTs are smaller than --batch-size")
	fs.StringVar(&cfg.compression, "clickhouse-compression", "none", "compression of meterd's and the raw insert's ClickHouse connection (loopback: none)")
	fs.BoolVar(&cfg.skipCHK, "skip-clickhouse-kafka", false, "skip ClickHouse's Kafka engine run")
	fs.BoolVar(&cfg.narrowCHK, "clickhouse-kafka-narrow", false, "also run the Kafka engine into a narrow table (11 columns, no views, as before issue 34), for reference")
	fs.StringVar(&cfg.profileDir, "meterd-profile", "", "write a CPU profile of meterd (--pprof) over each pipeline run's first 5 s to this folder")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if _, err := os.Stat(cfg.meterd); err != nil {
		return fmt.Errorf("meterd binary: %w (run make build)", err)
	}
	logger := logsetup.Warnings(stderr)
	dir, err := os.MkdirTemp("", "meterbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	ch, err := devenv.StartClickHouse(ctx, devenv.ClickHouseConfig{Dir: filepath.Join(dir, "clickhouse"), Logger: logger})
	if err != nil {
		return err
	}
	defer ch.Stop(context.WithoutCancel(ctx))
	broker, err := devenv.StartKafka(devenv.KafkaConfig{Addr: "127.0.0.1:0", Partitions: int32(cfg.partitions),
		Topics: []string{"bench.proto", "bench.json", "bench.latency", ingest.DefaultDLQTopic}})
	if err != nil {
		return err
	}
	defer broker.Close()

	r := &report{w: stdout}
	r.header(cfg)

	progress := func(format string, a ...any) { fmt.Fprintf(stderr, "meterbench: "+format+"\n", a...) }
	progress("generating %d events", cfg.events)
	protoVals, jsonVals, events, err := generate(cfg.events)
	if err != nil {
		return err
	}
	progress("producing to the broker")
	if err := produce(ctx, broker.Addr(), "bench.proto", protoVals, ingest.ContentTypeProtobuf); err != nil {
		return err
	}
	if err := produce(ctx, broker.Addr(), "bench.json", jsonVals, ingest.ContentTypeJSON); err != nil {
		return err
	}

	// (a) raw fetch.
	progress("(a) raw kafka-go fetch")
	fetchRate, err := rawFetch(ctx, broker.Addr(), "bench.proto", cfg.events)
	if err != nil {
		return err
	}
	r.line("(a) kafka-go FetchMessage + batched commits, protobuf", fetchRate)

	// (b) raw insert.
	progress("(b) raw clickhouse-go columnar insert")
	insertRate, err := rawInsert(ctx, ch.Addr(), "bench_raw", cfg.compression, events, cfg.batch, logger)
	if err != nil {
		return err
	}
	r.line(fmt.Sprintf("(b) clickhouse-go columnar INSERT, %d-row batches", cfg.batch), insertRate)
	events = nil

	// (c) pipeline, protobuf and JSON.
	progress("(c) meterd pipeline, protobuf records")
	pipe, err := pipeline(ctx, cfg, ch.Addr(), ch.Dir(), broker.Addr(), "bench.proto", "bench_pipe_proto", cfg.events)
	if err != nil {
		return err
	}
	r.line("(c) meterd ingest end to end, protobuf records", pipe.rate)
	r.cpuLine(pipe, cfg.events)
	progress("(c) meterd pipeline, JSON records")
	pipeJSON, err := pipeline(ctx, cfg, ch.Addr(), ch.Dir(), broker.Addr(), "bench.json", "bench_pipe_json", cfg.events)
	if err != nil {
		return err
	}
	r.line("(c') meterd ingest end to end, JSON records", pipeJSON.rate)
	r.cpuLine(pipeJSON, cfg.events)
	floor := min(fetchRate, insertRate)
	r.printf("    ratio (c) / min(a, b)            %.2f protobuf, %.2f JSON   (target >= 0.6)\n", pipe.rate/floor, pipeJSON.rate/floor)
	r.printf("    meterd peak RSS while ingesting  %.0f MiB (protobuf), %.0f MiB (JSON)   (target < 300 MiB)\n",
		float64(pipe.peakRSS)/(1<<20), float64(pipeJSON.peakRSS)/(1<<20))

	// (d) latency at a fixed rate.
	progress("(d) event-to-queryable latency at %d events/s for %s", cfg.rate, cfg.latencyDur)
	lat, err := latency(ctx, cfg, ch.Addr(), broker.Addr())
	if err != nil {
		return err
	}
	r.printf("(d) event-to-queryable latency at %d events/s (%d ticks of %d events): p50 %s  p99 %s  max %s   (target p99 < 1s)\n",
		cfg.rate, lat.ticks, lat.perTick, lat.p50.Round(time.Millisecond), lat.p99.Round(time.Millisecond), lat.max.Round(time.Millisecond))

	// (e) ClickHouse's Kafka engine on the same JSON records and schema.
	var engine *pipeResult
	if !cfg.skipCHK {
		progress("(e) ClickHouse Kafka table engine, JSON records")
		res, err := kafkaEngine(ctx, cfg, ch.Addr(), ch.Dir(), broker.Addr(), "bench.json", "bench_chkafka")
		if err != nil {
			r.printf("(e) ClickHouse Kafka engine: did not complete: %v\n", err)
		} else {
			engine = &res
			r.line("(e) ClickHouse Kafka engine (JSONEachRow + views), JSON records, meterd's schema", res.rate)
			r.cpuLine(res, cfg.events)
		}
		if cfg.narrowCHK {
			progress("(e') ClickHouse Kafka table engine, JSON records, narrow table")
			chPids := processesUnder(ch.Dir())
			chBefore, benchBefore := cpuOf(chPids), cpuOf([]int{os.Getpid()})
			elapsed, err := bench.RunClickHouseKafkaEngine(ctx, ch.Addr(), "bench_chkafka_narrow", broker.Addr(), "bench.json", cfg.events, 10*time.Minute, bench.WithLogDir(filepath.Join(ch.Dir(), "log")))
			if err != nil {
				r.printf("(e') ClickHouse Kafka engine, narrow table: did not complete: %v\n", err)
			} else {
				r.line("(e') ClickHouse Kafka engine, JSON records, narrow table (11 columns, no views)", float64(cfg.events)/elapsed.Seconds())
				r.cpuLine(pipeResult{chCPU: cpuOf(chPids) - chBefore, benchCPU: cpuOf([]int{os.Getpid()}) - benchBefore}, cfg.events)
			}
		}
	}
	r.summary(cfg.events, pipe, pipeJSON, engine)
	return nil
}

// kafkaEngine measures ClickHouse's Kafka engine filling the tables meterd
// fills (bench.WithStoreSchema) in database db, migrated before the clock
// starts, with the CPU ClickHouse (librdkafka included) and this process
// (the broker) used from the creation of the engine's tables to the poll
// that saw the last row. Its meterdCPU is zero: no meterd runs.
func kafkaEngine(ctx context.Context, cfg config, chAddr, chDir, brokerAddr, topic, db string) (pipeResult, error) {
	if err := createSchema(ctx, chAddr, db); err != nil {
		return pipeResult{}, err
	}
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{chAddr}})
	if err != nil {
		return pipeResult{}, err
	}
	defer conn.Close()
	chPids := processesUnder(chDir)
	counters0, countersErr := chEvents(ctx, conn)
	chBefore, benchBefore := cpuOf(chPids), cpuOf([]int{os.Getpid()})
	elapsed, err := bench.RunClickHouseKafkaEngine(ctx, chAddr, db, brokerAddr, topic, cfg.events, 10*time.Minute,
		bench.WithLogDir(filepath.Join(chDir, "log")), bench.WithStoreSchema())
	if err != nil {
		return pipeResult{}, err
	}
	res := pipeResult{rate: float64(cfg.events) / elapsed.Seconds(),
		chCPU: cpuOf(chPids) - chBefore, benchCPU: cpuOf([]int{os.Getpid()}) - benchBefore}
	res.countersSince(ctx, conn, counters0, countersErr)
	return res, nil
}

// Targets of the ingest report (issue 34).
const (
	targetJSONOverEngine = 1.5
	targetProtoRate      = 250_000
)

// summary prints the three ingest runs side by side, events/s and CPU per
// event of each process, and where they stand against the targets.
func (r *report) summary(n int, proto, json pipeResult, engine *pipeResult) {
	per := func(d time.Duration) float64 { return d.Seconds() * 1e6 / float64(n) }
	r.printf("\nIngest summary: %d events each, the same records and tables (inference_events, event_ids, dirty_hours)\n", n)
	r.printf("%-34s %11s %25s\n", "", "", "CPU per event (µs)")
	r.printf("%-34s %11s %8s %11s %7s %7s\n", "run", "events/s", "meterd", "ClickHouse", "broker", "total")
	row := func(name string, res pipeResult, meterd string) {
		r.printf("%-34s %11.0f %8s %11.1f %7.1f %7.1f\n", name, res.rate, meterd, per(res.chCPU), per(res.benchCPU),
			per(res.meterdCPU+res.chCPU+res.benchCPU))
	}
	row("meterd, protobuf records", proto, fmt.Sprintf("%.1f", per(proto.meterdCPU)))
	row("meterd, JSON records", json, fmt.Sprintf("%.1f", per(json.meterdCPU)))
	if engine != nil {
		row("ClickHouse Kafka engine, JSON", *engine, "-")
	}
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "NOT met"
	}
	if engine != nil && engine.rate > 0 {
		ratio := json.rate / engine.rate
		r.printf("target: meterd JSON / Kafka engine      %6.2fx   (>= %.1fx: %s; protobuf / Kafka engine %.2fx)\n",
			ratio, targetJSONOverEngine, verdict(ratio >= targetJSONOverEngine), proto.rate/engine.rate)
	} else {
		r.printf("target: meterd JSON / Kafka engine      not measured (>= %.1fx)\n", targetJSONOverEngine)
	}
	r.printf("target: meterd protobuf                 %6.0f events/s   (>= %d: %s; %.2fx of it)\n",
		proto.rate, targetProtoRate, verdict(proto.rate >= targetProtoRate), proto.rate/targetProtoRate)
}

type report struct{ w io.Writer }

func (r *report) printf(format string, a ...any) { fmt.Fprintf(r.w, format, a...) }
func (r *report) line(what string, rate float64) {
	fmt.Fprintf(r.w, "%-78s %10.0f events/s\n", what, rate)
}
func (r *report) header(cfg config) {
	host, _ := os.Hostname()
	r.printf("tokenmeter ingest benchmark — %s, %d CPUs, %s\n", host, runtime.NumCPU(), time.Now().UTC().Format(time.RFC3339))
	r.printf("%d events per run, %d partitions, meterd --batch-size %d --batch-timeout %s --clickhouse-compression %s (default heap limit 256 MiB)\n\n",
		cfg.events, cfg.partitions, cfg.batch, cfg.batchWait, cfg.compression)
}

// generate builds the synthetic events and their protobuf and JSON records.
func generate(n int) (protoVals, jsonVals [][]byte, events []*meterv1.InferenceEvent, err error) {
	g, err := workload.New(workload.Config{Seed: 42, Start: time.Now().Add(-24 * time.Hour), Duration: 24 * time.Hour, Events: n, Tenants: 100})
	if err != nil {
		return nil, nil, nil, err
	}
	protoVals = make([][]byte, n)
	jsonVals = make([][]byte, n)
	events = make([]*meterv1.InferenceEvent, n)
	for i := range n {
		ev := &meterv1.InferenceEvent{}
		g.Fill(ev, i)
		events[i] = ev
		if protoVals[i], err = proto.Marshal(ev); err != nil {
			return nil, nil, nil, err
		}
		if jsonVals[i], err = protojson.Marshal(ev); err != nil {
			return nil, nil, nil, err
		}
	}
	return protoVals, jsonVals, events, nil
}

func produce(ctx context.Context, addr, topic string, values [][]byte, contentType string) error {
	w := &kafka.Writer{Addr: kafka.TCP(addr), Topic: topic, Balancer: &kafka.RoundRobin{}, RequiredAcks: kafka.RequireAll,
		BatchSize: 10_000, BatchBytes: 64 << 20, BatchTimeout: time.Millisecond, Compression: kafka.Lz4}
	defer w.Close()
	hdr := []kafka.Header{{Key: ingest.HeaderContentType, Value: []byte(contentType)}}
	msgs := make([]kafka.Message, 0, 20_000)
	for i, v := range values {
		msgs = append(msgs, kafka.Message{Value: v, Headers: hdr})
		if len(msgs) == cap(msgs) || i == len(values)-1 {
			if err := w.WriteMessages(ctx, msgs...); err != nil {
				return fmt.Errorf("produce %s: %w", topic, err)
			}
			msgs = msgs[:0]
		}
	}
	return nil
}

// rawFetch is the ceiling of the Kafka side: FetchMessage of every record in
// a consumer group, committing every 10,000.
func rawFetch(ctx context.Context, addr, topic string, n int) (float64, error) {
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{addr}, Topic: topic, GroupID: "bench-raw-fetch",
		StartOffset: kafka.FirstOffset, MinBytes: 1, MaxBytes: 8 << 20, MaxWait: 100 * time.Millisecond, QueueCapacity: 20_000})
	defer r.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	var start time.Time
	var pending []kafka.Message
	for i := range n {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			return 0, fmt.Errorf("raw fetch after %d records: %w", i, err)
		}
		if i == 0 {
			start = time.Now()
		}
		pending = append(pending, m)
		if len(pending) == 10_000 || i == n-1 {
			if err := r.CommitMessages(ctx, pending...); err != nil {
				return 0, fmt.Errorf("raw fetch commit: %w", err)
			}
			pending = pending[:0]
		}
	}
	return float64(n-1) / time.Since(start).Seconds(), nil
}

// rawInsert is the ceiling of the ClickHouse side: the same rows, already
// decoded, inserted with the store's columnar batches.
func rawInsert(ctx context.Context, addr, db, compression string, events []*meterv1.InferenceEvent, batchSize int, logger *slog.Logger) (float64, error) {
	store, err := chstore.Open(chstore.Config{Addr: []string{addr}, Database: db, Compression: compression}, logger)
	if err != nil {
		return 0, err
	}
	defer store.Close()
	if _, err := store.Migrate(ctx); err != nil {
		return 0, err
	}
	var batches []*chstore.EventBatch
	now := time.Now()
	for i := 0; i < len(events); i += batchSize {
		b := &chstore.EventBatch{}
		for j, ev := range events[i:min(i+batchSize, len(events))] {
			b.Append(ev, ingest.ITL(ev), now, sink.Source{Partition: 0, Offset: int64(i + j)})
		}
		batches = append(batches, b)
	}
	start := time.Now()
	for _, b := range batches {
		if err := store.InsertEvents(ctx, b); err != nil {
			return 0, err
		}
	}
	return float64(len(events)) / time.Since(start).Seconds(), nil
}

type pipeResult struct {
	rate    float64
	peakRSS int64
	// CPU per event: meterd's, ClickHouse's, and this process's (the
	// in-process broker serving the fetches, and the row counting).
	meterdCPU, chCPU, benchCPU time.Duration
	// ClickHouse's counters over the run (system.events): INSERT
	// statements, the rows they inserted and the rows merges wrote;
	// countersErr says why they could not be read (cpuLine prints n/a).
	counters    chCounters
	countersErr error
}

// chCounters are ClickHouse's cumulative counters that cpuLine reports.
type chCounters struct {
	// inserts is system.events' InsertQuery: every INSERT statement into
	// any table (meterd's events and event_ids statements, and the empty
	// INSERT each newly prepared batch sends), not meterd's batches.
	inserts, insertedRows, mergedRows uint64
}

// chEvents reads ClickHouse's cumulative counters that cpuLine reports.
func chEvents(ctx context.Context, conn driver.Conn) (chCounters, error) {
	rows, err := conn.Query(ctx, "SELECT event, value FROM system.events WHERE event IN ('InsertQuery', 'InsertedRows', 'MergedRows')")
	if err != nil {
		return chCounters{}, fmt.Errorf("read system.events: %w", err)
	}
	defer rows.Close()
	var c chCounters
	for rows.Next() {
		var name string
		var v uint64
		if err := rows.Scan(&name, &v); err != nil {
			return chCounters{}, fmt.Errorf("read system.events: %w", err)
		}
		switch name {
		case "InsertQuery":
			c.inserts = v
		case "InsertedRows":
			c.insertedRows = v
		case "MergedRows":
			c.mergedRows = v
		}
	}
	if err := rows.Err(); err != nil {
		return chCounters{}, fmt.Errorf("read system.events: %w", err)
	}
	return c, nil
}

// countersSince sets res's counters to what ClickHouse counted since
// before (chEvents' values then, and its error). A failed read on either
// side, or a counter that went down (a restarted server), leaves them
// unset with countersErr saying why.
func (res *pipeResult) countersSince(ctx context.Context, conn driver.Conn, before chCounters, beforeErr error) {
	if beforeErr != nil {
		res.countersErr = beforeErr
		return
	}
	after, err := chEvents(ctx, conn)
	if err != nil {
		res.countersErr = err
		return
	}
	if after.inserts < before.inserts || after.insertedRows < before.insertedRows || after.mergedRows < before.mergedRows {
		res.countersErr = errors.New("system.events went down during the run (server restarted?)")
		return
	}
	res.counters = chCounters{
		inserts:      after.inserts - before.inserts,
		insertedRows: after.insertedRows - before.insertedRows,
		mergedRows:   after.mergedRows - before.mergedRows,
	}
}

// cpuLine prints where the CPU of a pipeline run went, per event.
func (r *report) cpuLine(res pipeResult, n int) {
	per := func(d time.Duration) float64 { return d.Seconds() * 1e6 / float64(n) }
	r.printf("    CPU per event: meterd %.1f µs, ClickHouse %.1f µs, broker (meterbench) %.1f µs\n",
		per(res.meterdCPU), per(res.chCPU), per(res.benchCPU))
	switch c := res.counters; {
	case res.countersErr != nil:
		r.printf("    ClickHouse counters: n/a (%v)\n", res.countersErr)
	case c.inserts > 0:
		r.printf("    ClickHouse: %d INSERT statements into all tables (events, event_ids, and each prepared batch's empty INSERT), %.0f inserted rows per statement on average; merges wrote %.2f rows per event\n",
			c.inserts, float64(c.insertedRows)/float64(c.inserts), float64(c.mergedRows)/float64(n))
	case c.mergedRows > 0:
		r.printf("    ClickHouse: merges wrote %.2f rows per event\n", float64(c.mergedRows)/float64(n))
	}
}

// startMeterd runs the meterd binary with the ingest role on topic.
func startMeterd(ctx context.Context, cfg config, chAddr, brokerAddr, topic, db string) (*exec.Cmd, func(), error) {
	httpAddr := freeAddr()
	args := []string{"--role", "ingest", "--clickhouse", chAddr, "--clickhouse-database", db,
		"--kafka-brokers", brokerAddr, "--events-topic", topic, "--group-id", "bench-" + db,
		"--http-addr", httpAddr, "--grpc-addr", freeAddr(), "--batch-size", strconv.Itoa(cfg.batch), "--batch-timeout", cfg.batchWait.String(), "--log-level", "warn", "--clickhouse-compression", cfg.compression}
	if cfg.profileDir != "" {
		args = append(args, "--pprof")
		go profileMeterd(ctx, httpAddr, filepath.Join(cfg.profileDir, db+".pprof"))
	}
	cmd := exec.CommandContext(ctx, cfg.meterd, args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("start meterd: %w", err)
	}
	stop := func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}
	return cmd, stop, nil
}

// pipeline measures meterd from the moment it starts (on an existing
// schema) until all n records are rows in ClickHouse, sampling its RSS on
// the way.
func pipeline(ctx context.Context, cfg config, chAddr, chDir, brokerAddr, topic, db string, n int) (pipeResult, error) {
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{chAddr}})
	if err != nil {
		return pipeResult{}, err
	}
	defer conn.Close()
	// The schema exists before the clock starts, as the Kafka engine's
	// tables do in (e): both are timed from the start of consumption, not
	// from the creation of tables.
	if err := createSchema(ctx, chAddr, db); err != nil {
		return pipeResult{}, err
	}
	chPids := processesUnder(chDir)
	counters0, countersErr := chEvents(ctx, conn)
	chBefore, benchBefore := cpuOf(chPids), cpuOf([]int{os.Getpid()})
	start := time.Now()
	cmd, stop, err := startMeterd(ctx, cfg, chAddr, brokerAddr, topic, db)
	if err != nil {
		return pipeResult{}, err
	}
	defer stop()
	var res pipeResult
	deadline := time.Now().Add(10 * time.Minute)
	for time.Now().Before(deadline) {
		if rss := rssBytes(cmd.Process.Pid); rss > res.peakRSS {
			res.peakRSS = rss
		}
		rows, err := countRows(ctx, conn, db+".inference_events")
		if err == nil && rows >= uint64(n) {
			res.rate = float64(n) / time.Since(start).Seconds()
			res.meterdCPU = cpuOf([]int{cmd.Process.Pid})
			res.chCPU, res.benchCPU = cpuOf(chPids)-chBefore, cpuOf([]int{os.Getpid()})-benchBefore
			res.countersSince(ctx, conn, counters0, countersErr)
			return res, nil
		}
		if cmd.ProcessState != nil {
			return res, errors.New("meterd exited")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return res, fmt.Errorf("pipeline on %s did not finish", topic)
}

func countRows(ctx context.Context, conn driver.Conn, table string) (uint64, error) {
	var n uint64
	err := conn.QueryRow(ctx, "SELECT count() FROM "+table).Scan(&n)
	return n, err
}

type latencyResult struct {
	ticks, perTick int
	p50, p99, max  time.Duration
}

// latency produces at cfg.rate in 10 ms ticks; every tick's events carry the
// tick number in request_id. A tick's latency is from the moment its write
// started to the poll that first sees all its rows.
func latency(ctx context.Context, cfg config, chAddr, brokerAddr string) (latencyResult, error) {
	const db, tick = "bench_latency", 10 * time.Millisecond
	perTick := max(1, cfg.rate/100)
	ticks := int(cfg.latencyDur / tick)
	_, stop, err := startMeterd(ctx, cfg, chAddr, brokerAddr, "bench.latency", db)
	if err != nil {
		return latencyResult{}, err
	}
	defer stop()
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{chAddr}})
	if err != nil {
		return latencyResult{}, err
	}
	defer conn.Close()
	// Wait until meterd created its schema and joined the group.
	for i := 0; ; i++ {
		if _, err := countRows(ctx, conn, db+".inference_events"); err == nil {
			break
		}
		if i > 600 {
			return latencyResult{}, errors.New("meterd did not create its schema")
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)

	w := &kafka.Writer{Addr: kafka.TCP(brokerAddr), Topic: "bench.latency", Balancer: &kafka.RoundRobin{}, RequiredAcks: kafka.RequireAll,
		BatchSize: perTick, BatchTimeout: time.Millisecond}
	defer w.Close()
	sent := make([]time.Time, ticks)
	seen := make([]time.Duration, ticks)
	done := make(chan error, 1)
	go func() {
		hdr := []kafka.Header{{Key: ingest.HeaderContentType, Value: []byte(ingest.ContentTypeProtobuf)}}
		next := time.Now()
		for k := range ticks {
			time.Sleep(time.Until(next))
			msgs := make([]kafka.Message, perTick)
			now := time.Now()
			for j := range msgs {
				v, _ := proto.Marshal(&meterv1.InferenceEvent{
					EventId: fmt.Sprintf("l-%d-%d", k, j), RequestId: strconv.Itoa(k), TenantId: "latency", Model: "m",
					CompletedAt: timestamppb.New(now), PromptTokens: proto.Int64(10), OutputTokens: proto.Int64(10),
					TtftMs: proto.Float64(1), E2EMs: proto.Float64(2),
				})
				msgs[j] = kafka.Message{Value: v, Headers: hdr}
			}
			sent[k] = now
			if err := w.WriteMessages(ctx, msgs...); err != nil {
				done <- err
				return
			}
			next = next.Add(tick)
		}
		done <- nil
	}()
	complete := 0
	deadline := time.Now().Add(cfg.latencyDur + 60*time.Second)
	for complete < ticks && time.Now().Before(deadline) {
		select {
		case err := <-done:
			if err != nil {
				return latencyResult{}, fmt.Errorf("produce: %w", err)
			}
		default:
		}
		rows, err := conn.Query(ctx, "SELECT request_id, count() FROM "+db+".inference_events WHERE tenant_id = 'latency' GROUP BY request_id")
		if err != nil {
			return latencyResult{}, err
		}
		now := time.Now()
		for rows.Next() {
			var id string
			var c uint64
			if err := rows.Scan(&id, &c); err != nil {
				return latencyResult{}, err
			}
			k, _ := strconv.Atoi(id)
			if c >= uint64(perTick) && seen[k] == 0 && !sent[k].IsZero() {
				seen[k] = now.Sub(sent[k])
				complete++
			}
		}
		rows.Close()
		time.Sleep(20 * time.Millisecond)
	}
	if complete < ticks {
		return latencyResult{}, fmt.Errorf("only %d of %d ticks arrived", complete, ticks)
	}
	sort.Slice(seen, func(i, j int) bool { return seen[i] < seen[j] })
	return latencyResult{ticks: ticks, perTick: perTick, p50: seen[ticks/2], p99: seen[ticks*99/100], max: seen[ticks-1]}, nil
}

// rssBytes reads VmRSS of a process from /proc.
func rssBytes(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "127.0.0.1:0"
	}
	defer ln.Close()
	return ln.Addr().String()
}

// profileMeterd saves a 5 s CPU profile of the meterd serving pprof at
// addr, once it answers.
func profileMeterd(ctx context.Context, addr, file string) {
	for range 100 {
		resp, err := http.Get("http://" + addr + "/debug/pprof/profile?seconds=5")
		if err != nil {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode == http.StatusOK {
			err = os.WriteFile(file, b, 0o644)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "meterbench: profile of meterd: %v\n", err)
		}
		return
	}
}

// createSchema migrates database db of the server at chAddr: the tables
// meterd and the Kafka engine runs fill.
func createSchema(ctx context.Context, chAddr, db string) error {
	store, err := chstore.Open(chstore.Config{Addr: []string{chAddr}, Database: db}, logsetup.Warnings(io.Discard))
	if err != nil {
		return err
	}
	_, err = store.Migrate(ctx)
	store.Close()
	if err != nil {
		return fmt.Errorf("create the schema of %s: %w", db, err)
	}
	return nil
}
