// Package bench holds the benchmark peers that meterbench measures tokenmeter
// against. Today that is ClickHouse's own Kafka table engine: the built-in
// Kafka → ClickHouse path a user might pick instead of meterd, run on the same
// JSON records (the protojson form of tokenmeter.v1.InferenceEvent).
//
// The package measures; it does not report (meterbench prints the report)
// and it does not own tokenmeter's schema (chstore does). By default the
// tables it creates mirror only the columns a metering query needs; with
// WithStoreSchema the engine fills tokenmeter's own tables instead
// (inference_events with its MATERIALIZED columns and views, and event_ids),
// as meterd does, so that both are measured on the same schema.
package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/segmentio/kafka-go"
)

// Names of the tables RunClickHouseKafkaEngine creates in its database.
const (
	// KafkaEngineQueueTable is the Kafka engine table; it is dropped when the
	// run ends so that the server stops consuming.
	KafkaEngineQueueTable = "kafka_engine_queue"
	// KafkaEngineViewTable is the materialized view that converts and moves
	// rows from the queue to the target; dropped with the queue.
	KafkaEngineViewTable = "kafka_engine_mv"
	// KafkaEngineTargetTable is the MergeTree table the rows land in. It is
	// recreated empty by every run and kept afterwards for inspection.
	KafkaEngineTargetTable = "kafka_engine_events"
	// KafkaEngineIDsViewTable is, with WithStoreSchema, the second view,
	// which records the ids in event_ids; dropped with the queue.
	KafkaEngineIDsViewTable = "kafka_engine_ids_mv"
	// KafkaEngineHoursViewTable is, with WithStoreSchema, the third view,
	// which records the hours written in dirty_hours; dropped with the
	// queue.
	KafkaEngineHoursViewTable = "kafka_engine_hours_mv"
)

const (
	pollInterval   = 50 * time.Millisecond
	cleanupTimeout = time.Minute
	// stallAfter is how long the row count may stand still, while the server
	// logs Kafka engine exceptions, before the run is given up early: in
	// 18.16 a record that fails to parse is re-read forever.
	stallAfter = 10 * time.Second
	// maxLogLines bounds the log lines quoted in a KafkaEngineError.
	maxLogLines = 20
)

// Option tunes RunClickHouseKafkaEngine.
type Option func(*kafkaEngineOptions)

type kafkaEngineOptions struct {
	logDir       string
	consumers    int
	maxBlockSize int
	storeSchema  bool
	progress     func(rows uint64, since time.Duration)
}

// WithStoreSchema has the engine fill tokenmeter's own tables, which the
// database must hold already (chstore's Store.Migrate): a view converts
// each record into a row of inference_events, every column that the JSON
// record carries, with chstore's conversions (dirty_hours_mv and the
// MATERIALIZED columns are computed as for meterd's inserts), a second
// view records its id in event_ids, as meterd does after each insert, and a
// third the hours written in dirty_hours, as dirty_hours_mv does for
// meterd's inserts (18.16 does not run the views of a table that a view
// writes to). What
// 18.16's JSONEachRow cannot read is left at its default: labels (a JSON
// object), and so label_keys and label_values, are empty; source_partition
// and source_offset are 0 (18.16 has no _partition or _offset virtual
// columns); fingerprint is 0 (not known). The run then counts the rows of
// inference_events, which it leaves in place.
func WithStoreSchema() Option {
	return func(o *kafkaEngineOptions) { o.storeSchema = true }
}

// WithLogDir names the ClickHouse server's log directory (for chserver,
// filepath.Join(srv.Dir(), "log")). The run then quotes the Kafka engine's
// errors (err.log) and librdkafka's own messages, which go to the server's
// stderr (stdout.log), when it fails, and gives up early when the engine
// keeps failing on a record.
func WithLogDir(dir string) Option {
	return func(o *kafkaEngineOptions) { o.logDir = dir }
}

// WithConsumers sets kafka_num_consumers, the engine's consumer count. More
// consumers than the topic has partitions stay idle. Default 1.
func WithConsumers(n int) Option {
	return func(o *kafkaEngineOptions) { o.consumers = n }
}

// WithMaxBlockSize sets kafka_max_block_size, the rows the engine parses
// into one block before it pushes the block through the view. Zero keeps
// the server's max_block_size (65536).
func WithMaxBlockSize(n int) Option {
	return func(o *kafkaEngineOptions) { o.maxBlockSize = n }
}

// WithProgress has fn called whenever a poll sees more rows in the target,
// with the row count and the time since the view was created; the first
// call tells how long the engine took to start delivering.
func WithProgress(fn func(rows uint64, since time.Duration)) Option {
	return func(o *kafkaEngineOptions) { o.progress = fn }
}

// KafkaEngineError reports that the Kafka engine did not deliver the rows
// wanted: it consumed nothing (Rows is 0), or stopped short.
type KafkaEngineError struct {
	Rows, Want uint64
	// Waited is how long the run waited after creating the view.
	Waited time.Duration
	// Stalled is set when the run gave up early because the row count stood
	// still while the server logged Kafka engine exceptions.
	Stalled bool
	// LogLines are the server's Kafka-related log lines written during the
	// run, last ones last; empty without WithLogDir.
	LogLines []string
}

func (e *KafkaEngineError) Error() string {
	var b strings.Builder
	if e.Rows == 0 {
		fmt.Fprintf(&b, "clickhouse kafka engine consumed nothing in %v", e.Waited.Round(time.Millisecond))
	} else {
		fmt.Fprintf(&b, "clickhouse kafka engine delivered %d of %d rows in %v", e.Rows, e.Want, e.Waited.Round(time.Millisecond))
	}
	if e.Stalled {
		b.WriteString(" (stalled on repeated engine errors)")
	}
	if len(e.LogLines) > 0 {
		b.WriteString("; server log:\n")
		b.WriteString(strings.Join(e.LogLines, "\n"))
	}
	return b.String()
}

// RunClickHouseKafkaEngine measures ClickHouse's Kafka table engine. It
// creates, in database (created if missing) on the server at chAddr, a Kafka
// engine table reading the JSONEachRow records of topic on brokerAddr, a
// MergeTree target and a materialized view converting between them; waits
// until the target holds want rows, polling every 50ms; and returns the time
// from the view's creation, which starts consumption, to the poll that saw
// the last row. It then drops the view and the Kafka table so that the server
// stops consuming; the target stays.
//
// Each run reads the topic from its start under a fresh consumer group: the
// 18.16 engine leaves librdkafka's auto.offset.reset at "latest", so the run
// commits the partitions' first offsets for the group before the engine
// joins it. The engine delivers at least once: a run returns as soon as the
// target holds want rows or more.
//
// The 18.16 engine makes rows visible in steps: it reads for up to the
// server profile's stream_flush_interval_ms (7.5s by default) or until a
// 500ms poll comes back empty, squashes what it read into one insert through
// the view, and only then commits. On a finite topic elapsed therefore holds
// some 0.5s before the engine notices the view and a few seconds of empty
// polls after the last record, besides the consuming itself.
//
// When the rows do not all arrive within timeout the error is a
// *KafkaEngineError, quoting the server's Kafka log lines with WithLogDir.
func RunClickHouseKafkaEngine(ctx context.Context, chAddr, database, brokerAddr, topic string, want int, timeout time.Duration, opts ...Option) (elapsed time.Duration, err error) {
	o := kafkaEngineOptions{consumers: 1}
	for _, opt := range opts {
		opt(&o)
	}
	if err := validateRun(database, topic, want, timeout, o); err != nil {
		return 0, err
	}
	conn, err := clickhouse.Open(&clickhouse.Options{
		Addr:         []string{chAddr},
		DialTimeout:  5 * time.Second,
		MaxOpenConns: 1,
	})
	if err != nil {
		return 0, fmt.Errorf("open clickhouse: %w", err)
	}
	defer conn.Close()

	group := fmt.Sprintf("tokenmeter-bench-%s-%d", database, time.Now().UnixNano())
	if err := seedGroupOffsets(ctx, brokerAddr, topic, group); err != nil {
		return 0, err
	}
	if err := conn.Exec(ctx, "CREATE DATABASE IF NOT EXISTS "+database); err != nil {
		return 0, fmt.Errorf("create database %s: %w", database, err)
	}
	for _, q := range dropStatements(database, !o.storeSchema) {
		if err := conn.Exec(ctx, q); err != nil {
			return 0, fmt.Errorf("drop leftover tables: %w", err)
		}
	}
	create := []string{targetDDL(database), queueDDL(database, brokerAddr, topic, group, o)}
	views, target := []string{viewDDL(database)}, KafkaEngineTargetTable
	if o.storeSchema {
		create = []string{storeQueueDDL(database, brokerAddr, topic, group, o)}
		views, target = []string{storeViewDDL(database), storeIDsViewDDL(database), storeHoursViewDDL(database)}, "inference_events"
	}
	for _, q := range create {
		if err := conn.Exec(ctx, q); err != nil {
			return 0, fmt.Errorf("create kafka engine tables: %w", err)
		}
	}
	defer func() {
		// The tables must go even when ctx is cancelled: a Kafka table
		// left behind keeps consuming.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		for _, q := range dropStatements(database, false) {
			if derr := conn.Exec(cctx, q); derr != nil {
				err = errors.Join(err, fmt.Errorf("drop kafka engine tables: %w", derr))
			}
		}
	}()

	logs := newLogWatch(o.logDir)
	start := time.Now()
	// The first view starts consumption (the engine looks for views every
	// 500ms and streams once one depends on it): the one of the rows
	// counted first, then the others, created milliseconds later.
	for _, q := range views {
		if err := conn.Exec(ctx, q); err != nil {
			return 0, fmt.Errorf("create kafka engine view: %w", err)
		}
	}
	return waitRows(ctx, conn, database+"."+target, uint64(want), start, timeout, logs, o.progress)
}

func validateRun(database, topic string, want int, timeout time.Duration, o kafkaEngineOptions) error {
	var errs []error
	if !identRE.MatchString(database) {
		errs = append(errs, fmt.Errorf("database name %q: only letters, digits and _", database))
	}
	if topic == "" || strings.ContainsAny(topic, "',\\") {
		errs = append(errs, fmt.Errorf("topic name %q: empty or holds ' , or \\", topic))
	}
	if want <= 0 {
		errs = append(errs, fmt.Errorf("want %d rows: must be positive", want))
	}
	if timeout <= 0 {
		errs = append(errs, fmt.Errorf("timeout %v: must be positive", timeout))
	}
	if o.consumers < 1 {
		errs = append(errs, fmt.Errorf("consumers %d: must be at least 1", o.consumers))
	}
	if o.maxBlockSize < 0 {
		errs = append(errs, fmt.Errorf("max block size %d: must not be negative", o.maxBlockSize))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("clickhouse kafka engine run: %w", err)
	}
	return nil
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// seedGroupOffsets commits each partition's first offset for group, with a
// simple (generation -1) commit, so that a consumer joining the group starts
// at the beginning of the topic whatever its auto.offset.reset.
func seedGroupOffsets(ctx context.Context, brokerAddr, topic, group string) error {
	client := &kafka.Client{Addr: kafka.TCP(brokerAddr), Timeout: 10 * time.Second}
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return fmt.Errorf("seed group offsets: metadata: %w", err)
	}
	if len(md.Topics) != 1 || md.Topics[0].Error != nil || len(md.Topics[0].Partitions) == 0 {
		var terr error
		if len(md.Topics) == 1 {
			terr = md.Topics[0].Error
		}
		return fmt.Errorf("seed group offsets: topic %s not found: %w", topic, errors.Join(terr, errors.New("no partitions")))
	}
	var reqs []kafka.OffsetRequest
	for _, p := range md.Topics[0].Partitions {
		reqs = append(reqs, kafka.FirstOffsetOf(p.ID))
	}
	offs, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return fmt.Errorf("seed group offsets: list offsets: %w", err)
	}
	var commits []kafka.OffsetCommit
	for _, p := range offs.Topics[topic] {
		if p.Error != nil {
			return fmt.Errorf("seed group offsets: list offsets of partition %d: %w", p.Partition, p.Error)
		}
		commits = append(commits, kafka.OffsetCommit{Partition: p.Partition, Offset: p.FirstOffset})
	}
	resp, err := client.OffsetCommit(ctx, &kafka.OffsetCommitRequest{
		GroupID:      group,
		GenerationID: -1,
		Topics:       map[string][]kafka.OffsetCommit{topic: commits},
	})
	if err != nil {
		return fmt.Errorf("seed group offsets: commit: %w", err)
	}
	for _, p := range resp.Topics[topic] {
		if p.Error != nil {
			return fmt.Errorf("seed group offsets: commit partition %d: %w", p.Partition, p.Error)
		}
	}
	return nil
}

// kafkaSettings is the SETTINGS list of a Kafka engine table of topic.
func kafkaSettings(brokerAddr, topic, group string, o kafkaEngineOptions) string {
	settings := []string{
		"kafka_broker_list = " + quote(brokerAddr),
		"kafka_topic_list = " + quote(topic),
		"kafka_group_name = " + quote(group),
		"kafka_format = 'JSONEachRow'",
		fmt.Sprintf("kafka_num_consumers = %d", o.consumers),
	}
	if o.maxBlockSize > 0 {
		settings = append(settings, fmt.Sprintf("kafka_max_block_size = %d", o.maxBlockSize))
	}
	return strings.Join(settings, ",\n    ")
}

// queueDDL creates the Kafka engine table. Its columns are the protojson
// keys of InferenceEvent that the target needs; the engine skips the other
// keys (labels, a nested object, included). The int64 fields arrive as JSON
// strings, which 18.16 reads into Int64 columns; absent keys read as the
// column default. A value of the wrong JSON type fails the whole block.
func queueDDL(database, brokerAddr, topic, group string, o kafkaEngineOptions) string {
	return `CREATE TABLE ` + database + `.` + KafkaEngineQueueTable + `
(
    eventId            String,
    tenantId           String,
    model              String,
    deployment         String,
    completedAt        String,
    promptTokens       Int64,
    cachedPromptTokens Int64,
    outputTokens       Int64,
    ttftMs             Float64,
    e2eMs              Float64,
    status             String
)
ENGINE = Kafka SETTINGS
    ` + kafkaSettings(brokerAddr, topic, group, o)
}

// targetDDL creates the table the view fills, with chstore's names and types
// for the columns it has.
func targetDDL(database string) string {
	return `CREATE TABLE ` + database + `.` + KafkaEngineTargetTable + `
(
    tenant_id            String,
    event_id             String,
    model                String,
    deployment           String,
    completed_at         DateTime,
    prompt_tokens        UInt64,
    cached_prompt_tokens UInt64,
    output_tokens        UInt64,
    ttft_ms              Float64,
    e2e_ms               Float64,
    status               String
)
ENGINE = MergeTree
PARTITION BY toYYYYMM(completed_at)
ORDER BY (tenant_id, toStartOfHour(completed_at), event_id)`
}

// viewDDL creates the view that moves rows from the queue to the target.
// Its conversions follow chstore: status "STATUS_RATE_LIMITED" becomes
// "rate_limited" and an absent one "ok"; an RFC 3339 completedAt is parsed
// (an absent one is not an error: 18.16 stores 2000-01-01 00:00:00); token
// counts below zero become 0.
func viewDDL(database string) string {
	return `CREATE MATERIALIZED VIEW ` + database + `.` + KafkaEngineViewTable + `
TO ` + database + `.` + KafkaEngineTargetTable + `
AS SELECT
    tenantId                                   AS tenant_id,
    eventId                                    AS event_id,
    model,
    deployment,
    parseDateTimeBestEffortOrZero(completedAt) AS completed_at,
    toUInt64(greatest(promptTokens, 0))        AS prompt_tokens,
    toUInt64(greatest(cachedPromptTokens, 0))  AS cached_prompt_tokens,
    toUInt64(greatest(outputTokens, 0))        AS output_tokens,
    ttftMs                                     AS ttft_ms,
    e2eMs                                      AS e2e_ms,
    if(status IN ('', 'STATUS_UNSPECIFIED'), 'ok', lower(replaceOne(status, 'STATUS_', ''))) AS status
FROM ` + database + `.` + KafkaEngineQueueTable
}

// dropStatements drops the views first, so that the engine stops
// streaming, then the Kafka table, and with target the target table too.
func dropStatements(database string, target bool) []string {
	qs := []string{
		"DROP TABLE IF EXISTS " + database + "." + KafkaEngineViewTable,
		"DROP TABLE IF EXISTS " + database + "." + KafkaEngineIDsViewTable,
		"DROP TABLE IF EXISTS " + database + "." + KafkaEngineHoursViewTable,
		"DROP TABLE IF EXISTS " + database + "." + KafkaEngineQueueTable,
	}
	if target {
		qs = append(qs, "DROP TABLE IF EXISTS "+database+"."+KafkaEngineTargetTable)
	}
	return qs
}

func quote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// waitRows polls the row count of table (database.name) until it reaches
// want.
func waitRows(ctx context.Context, conn driver.Conn, table string, want uint64, start time.Time, timeout time.Duration, logs *logWatch, progress func(uint64, time.Duration)) (time.Duration, error) {
	deadline := start.Add(timeout)
	query := "SELECT count() FROM " + table
	var rows uint64
	lastProgress := start
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for {
		asked := time.Now()
		var n uint64
		if err := conn.QueryRow(ctx, query).Scan(&n); err != nil {
			return 0, fmt.Errorf("count kafka engine rows: %w", err)
		}
		if n > rows && progress != nil {
			progress(n, asked.Sub(start))
		}
		if n >= want {
			return asked.Sub(start), nil
		}
		if n > rows {
			rows, lastProgress = n, asked
			logs.forgetErrors()
		}
		stalled := asked.Sub(lastProgress) >= stallAfter && logs.engineErrors() > 0
		if stalled || !asked.Before(deadline) {
			return 0, &KafkaEngineError{Rows: rows, Want: want, Waited: asked.Sub(start), Stalled: stalled, LogLines: logs.lines()}
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("wait for kafka engine rows (%d of %d): %w", rows, want, ctx.Err())
		case <-t.C:
		}
	}
}

// logWatch follows what the server logs during a run: err.log, where the
// Kafka engine's exceptions go, and stdout.log, where librdkafka writes its
// own messages ("%3|...|FAIL|..."). A zero logWatch (no log dir) sees
// nothing.
type logWatch struct {
	errLog, stdoutLog logFile
	// errorsSince counts the engine exceptions seen since forgetErrors.
	errorsSince int
}

type logFile struct {
	path string
	from int64 // size when the run started
	seen int64 // how far engineErrors has read
}

func newLogWatch(dir string) *logWatch {
	if dir == "" {
		return &logWatch{}
	}
	open := func(name string) logFile {
		p := filepath.Join(dir, name)
		size := fileSize(p)
		return logFile{path: p, from: size, seen: size}
	}
	return &logWatch{errLog: open("err.log"), stdoutLog: open("stdout.log")}
}

// engineErrors returns the number of Kafka engine exceptions logged since
// the last forgetErrors.
func (w *logWatch) engineErrors() int {
	if w.errLog.path == "" {
		return 0
	}
	b := readFrom(w.errLog.path, w.errLog.seen)
	w.errLog.seen += int64(len(b))
	for line := range strings.Lines(string(b)) {
		if strings.Contains(line, "<Error>") && strings.Contains(line, "StorageKafka") {
			w.errorsSince++
		}
	}
	return w.errorsSince
}

// forgetErrors restarts the count of engineErrors, after progress.
func (w *logWatch) forgetErrors() {
	w.engineErrors()
	w.errorsSince = 0
}

// lines returns the Kafka-related lines logged since the run started, the
// engine's errors from err.log (without stack traces) and then librdkafka's
// messages, each message once with its last time and how often it came, at
// most maxLogLines.
func (w *logWatch) lines() []string {
	type entry struct {
		line  string
		count int
	}
	var order []string
	seen := map[string]*entry{}
	for _, f := range []logFile{w.errLog, w.stdoutLog} {
		if f.path == "" {
			continue
		}
		for line := range strings.Lines(string(readFrom(f.path, f.from))) {
			line = strings.TrimRight(line, "\r\n")
			key, ok := kafkaLogMessage(line)
			if !ok {
				continue
			}
			if e, ok := seen[key]; ok {
				e.line = line
				e.count++
				continue
			}
			seen[key] = &entry{line: line, count: 1}
			order = append(order, key)
		}
	}
	out := make([]string, 0, len(order))
	for _, key := range order {
		e := seen[key]
		if e.count > 1 {
			out = append(out, fmt.Sprintf("%s (logged %d times)", e.line, e.count))
			continue
		}
		out = append(out, e.line)
	}
	if len(out) > maxLogLines {
		out = out[len(out)-maxLogLines:]
	}
	return out
}

// kafkaLogMessage reports whether a server log line is about Kafka, and
// returns its message without the timestamp and thread. It keeps the
// engine's lines in err.log ("2026.11.22 18:45:59.927303 [ 40 ] {} <Error>
// void DB::StorageKafka::streamThread(): Code: 27, ...") and librdkafka's
// lines on stderr ("%3|1795373137.860|FAIL|ClickHouse 18.16.1#consumer-5|
// ..."), and leaves out stack frames ("13. /lib/...StorageKafka...").
func kafkaLogMessage(line string) (string, bool) {
	if strings.HasPrefix(line, "%") {
		parts := strings.SplitN(line, "|", 3)
		if len(parts) < 3 {
			return line, true
		}
		return parts[2], true
	}
	if !strings.Contains(line, "Kafka") || stackFrameRE.MatchString(line) {
		return "", false
	}
	if _, msg, ok := strings.Cut(line, "} "); ok {
		return msg, true
	}
	return line, true
}

var stackFrameRE = regexp.MustCompile(`^\d+\. `)

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// readFrom returns path's content from offset on; all of it when the file
// has shrunk (rotated) since.
func readFrom(path string, offset int64) []byte {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil
	}
	if offset > fi.Size() {
		offset = 0
	}
	b := make([]byte, fi.Size()-offset)
	n, _ := f.ReadAt(b, offset)
	return b[:n]
}

// storeQueueDDL creates the Kafka engine table of WithStoreSchema: every
// protojson key of InferenceEvent that 18.16's JSONEachRow can read (labels
// is an object: skipped). Optional numbers are Nullable, so that an absent
// one is NULL as in meterd's rows.
func storeQueueDDL(database, brokerAddr, topic, group string, o kafkaEngineOptions) string {
	return `CREATE TABLE ` + database + `.` + KafkaEngineQueueTable + `
(
    eventId            String,
    requestId          String,
    tenantId           String,
    model              String,
    modelVersion       String,
    deployment         String,
    engine             String,
    gpuType            String,
    tensorParallelism  UInt32,
    node               String,
    region             String,
    receivedAt         String,
    completedAt        String,
    promptTokens       Int64,
    cachedPromptTokens Int64,
    outputTokens       Int64,
    ttftMs             Nullable(Float64),
    e2eMs              Nullable(Float64),
    queueMs            Nullable(Float64),
    prefillMs          Nullable(Float64),
    itlMs              Nullable(Float64),
    status             String,
    streaming          UInt8,
    sloClass           String
)
ENGINE = Kafka SETTINGS
    ` + kafkaSettings(brokerAddr, topic, group, o)
}

// rfc3339Millis is the SQL for the Unix milliseconds of an RFC 3339 string
// column (0 when empty), as chstore's unixMilli: the seconds parsed, plus
// the first three digits of the fraction.
func rfc3339Millis(col string) string {
	return `if(` + col + ` = '', toInt64(0), toInt64(toUInt32(parseDateTimeBestEffortOrZero(` + col + `))) * 1000 + toInt64OrZero(substring(concat(extract(` + col + `, '\\.(\\d+)'), '000'), 1, 3)))`
}

// storeViewDDL converts each record into a row of inference_events as
// chstore's EventBatch does: times to the second and to the millisecond,
// token counts below zero as 0, ITL as ingest.RowITL (the event's own, or
// (E2E - TTFT) / (output - 1) for two output tokens or more), the status
// name, ingested_at the time of the insert. 18.16 writes a view's block to
// its table as it is, without computing the MATERIALIZED columns (group_hash,
// migration 0006; ttft_estimated, 0023) as an INSERT does: the view computes
// them with the migrations' expressions.
func storeViewDDL(database string) string {
	return `CREATE MATERIALIZED VIEW ` + database + `.` + KafkaEngineViewTable + `
TO ` + database + `.inference_events
AS SELECT
    tenantId                                  AS tenant_id,
    eventId                                   AS event_id,
    requestId                                 AS request_id,
    model,
    modelVersion                              AS model_version,
    deployment,
    engine,
    gpuType                                   AS gpu_type,
    tensorParallelism                         AS tensor_parallelism,
    node,
    region,
    toDateTime(intDiv(completed_at_ms, 1000)) AS completed_at,
    ` + rfc3339Millis("completedAt") + ` AS completed_at_ms,
    ` + rfc3339Millis("receivedAt") + ` AS received_at_ms,
    toUInt64(greatest(promptTokens, 0))       AS prompt_tokens,
    toUInt64(greatest(cachedPromptTokens, 0)) AS cached_prompt_tokens,
    toUInt64(greatest(outputTokens, 0))       AS output_tokens,
    ttftMs                                    AS ttft_ms,
    e2eMs                                     AS e2e_ms,
    queueMs                                   AS queue_ms,
    prefillMs                                 AS prefill_ms,
    if(isNotNull(itlMs), itlMs, if(outputTokens >= 2, (e2eMs - ttftMs) / (outputTokens - 1), NULL)) AS itl_ms,
    toUInt8(isNotNull(itlMs))                 AS itl_measured,
    if(status IN ('', 'STATUS_UNSPECIFIED'), 'ok', lower(replaceOne(status, 'STATUS_', ''))) AS status,
    streaming,
    sloClass                                  AS slo_class,
    emptyArrayString()                        AS label_keys,
    emptyArrayString()                        AS label_values,
    now()                                     AS ingested_at,
    toInt32(0)                                AS source_partition,
    toInt64(0)                                AS source_offset,
    cityHash64(tenant_id, model, model_version, deployment, gpu_type, slo_class) AS group_hash,
    toUInt8(label_values[indexOf(label_keys, 'ttft_source')] = 'e2e') AS ttft_estimated
FROM ` + database + `.` + KafkaEngineQueueTable
}

// storeIDsViewDDL records each record's id in event_ids as chstore's
// InsertEvents does: key_hash is cityHash64(tenant_id '\0' event_id)
// (sink.EventKey), fingerprint 0.
func storeIDsViewDDL(database string) string {
	return `CREATE MATERIALIZED VIEW ` + database + `.` + KafkaEngineIDsViewTable + `
TO ` + database + `.event_ids
AS SELECT
    cityHash64(concat(tenantId, '\0', eventId)) AS key_hash,
    tenantId                                    AS tenant_id,
    eventId                                     AS event_id,
    ` + rfc3339Millis("completedAt") + ` AS completed_at_ms,
    toUInt64(0)                                 AS fingerprint,
    now()                                       AS ingested_at,
    toInt32(0)                                  AS source_partition,
    toInt64(0)                                  AS source_offset
FROM ` + database + `.` + KafkaEngineQueueTable
}

// storeHoursViewDDL records the hours of each block in dirty_hours with
// dirty_hours_mv's query (migration 0003).
func storeHoursViewDDL(database string) string {
	return `CREATE MATERIALIZED VIEW ` + database + `.` + KafkaEngineHoursViewTable + `
TO ` + database + `.dirty_hours
AS SELECT DISTINCT toDateTime(intDiv(toUInt32(parseDateTimeBestEffortOrZero(completedAt)), 3600) * 3600) AS hour, now() AS ingested_at
FROM ` + database + `.` + KafkaEngineQueueTable
}
