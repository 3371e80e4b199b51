package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/ingest"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/devenv"
	"tokenmeter/internal/testkit/chcluster"
	"tokenmeter/internal/testkit/chtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
)

// TestIngestReplicasExact runs three real `meterd --role ingest` processes
// in one consumer group over a topic of 12 partitions, SIGKILLs one while
// events stream in, adds a fourth, and has the producer send some batches
// twice (retries): every event is counted exactly once.
func TestIngestReplicasExact(t *testing.T) {
	chtest.RequireLocal(t)
	testIngestReplicas(t, ingestTarget{addr: chtest.StartPrivate(t).Addr(), db: "default"})
}

// TestIngestReplicasClusterExact is TestIngestReplicasExact on a ClickHouse
// cluster of two shards, the first with two replicas, in cluster mode. The
// replicas write through the server of shard 2, and shard 1's first
// replica (the one Distributed inserts go to) is SIGKILLed while events
// stream in and started again later (the fourth ingest replica starts
// while it is down): nothing is lost or counted twice, and the killed
// replica catches up with its twin.
func TestIngestReplicasClusterExact(t *testing.T) {
	c := chcluster.Start(t, chcluster.Layout{})
	db := c.NewDB(t)
	testIngestReplicas(t, ingestTarget{addr: c.Addr(1, 0), db: db, cluster: c.Name(),
		at: map[int]func(){
			1: func() {
				if err := c.Kill(0, 0); err != nil {
					t.Fatal(err)
				}
			},
			// After chunk 4's new ingest replica, which so starts (and
			// checks the schema) while a server of the cluster is down.
			5: func() {
				if err := c.Restart(0, 0); err != nil {
					t.Fatal(err)
				}
			},
		},
		check:    func(wantEvents int64) { checkReplicasCaughtUp(t, c, db, wantEvents) },
		diagnose: func() string { return replicaState(c, db) },
	})
}

// lockedBuffer is a process's output, written by os/exec's copying
// goroutine and read by the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// ingestTarget is the ClickHouse of testIngestReplicas: one server, or a
// cluster with what happens to it mid-stream.
type ingestTarget struct {
	addr, db, cluster string
	// at runs after the chunk of its number has been produced.
	at map[int]func()
	// check runs once the totals are exact, given the number of events.
	check func(wantEvents int64)
	// diagnose, if set, describes the store when the totals are wrong.
	diagnose func() string
}

func testIngestReplicas(t *testing.T, target ingestTarget) {
	chAddr, db := target.addr, target.db
	const partitions = 12
	broker, err := devenv.StartKafka(devenv.KafkaConfig{Addr: "127.0.0.1:0", Partitions: partitions,
		Topics: []string{ingest.DefaultEventsTopic, ingest.DefaultDLQTopic, ingest.DefaultGPUTopic, ingest.DefaultEngineTopic}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(broker.Close)
	fleet := newIngestFleet(t, broker.Addr(), chAddr, db, target.cluster)
	start := func() *ingestReplica { return fleet.start(t) }
	for range 3 {
		start()
	}
	// livePIDs maps the pid of each replica still running to its number.
	livePIDs := func() map[int]int {
		pids := map[int]int{}
		for i, r := range fleet.replicas {
			if r.cmd.ProcessState == nil {
				pids[r.cmd.Process.Pid] = i
			}
		}
		return pids
	}

	base := time.Now().UTC().Add(-2 * time.Hour).Truncate(time.Hour)
	event := func(i int) *meterv1.InferenceEvent {
		return &meterv1.InferenceEvent{
			EventId: fmt.Sprintf("ev-%06d", i), TenantId: fmt.Sprintf("tenant-%d", i%7), Model: "m", Deployment: "d",
			CompletedAt:  timestamppb.New(base.Add(time.Duration(i) * 100 * time.Millisecond)),
			PromptTokens: proto.Int64(int64(100 + i%1000)), OutputTokens: proto.Int64(int64(1 + i%300)),
			TtftMs: proto.Float64(50), E2EMs: proto.Float64(500),
		}
	}
	const chunks, perChunk = 6, 4000
	w := &kafka.Writer{Addr: kafka.TCP(broker.Addr()), Topic: ingest.DefaultEventsTopic, Balancer: &kafka.RoundRobin{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, BatchSize: 1000}
	defer w.Close()
	produce := func(c int) {
		t.Helper()
		msgs := make([]kafka.Message, perChunk)
		for i := range perChunk {
			b, err := proto.Marshal(event(c*perChunk + i))
			if err != nil {
				t.Fatal(err)
			}
			msgs[i] = kafka.Message{Value: b, Headers: []kafka.Header{{Key: ingest.HeaderContentType, Value: []byte(ingest.ContentTypeProtobuf)}}}
		}
		if err := w.WriteMessages(context.Background(), msgs...); err != nil {
			t.Fatalf("produce chunk %d: %v", c, err)
		}
	}
	var wantRequests, wantOutput int64
	for i := range chunks * perChunk {
		wantRequests++
		wantOutput += int64(1 + i%300)
	}
	for c := range chunks {
		produce(c)
		switch c {
		case 1:
			produce(0) // a producer's retry: the same events again
		case 2:
			// Crash: no flush, no commit; its partitions go to the others.
			fleet.replicas[1].cmd.Process.Kill()
			fleet.replicas[1].cmd.Wait()
		case 4:
			start() // scaled out mid-stream: the group rebalances
		}
		if f := target.at[c]; f != nil {
			f()
		}
	}

	store, err := chstore.Open(chstore.Config{Addr: []string{chAddr}, Database: db, Cluster: target.cluster}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	reads := query.New(store, query.Config{})
	var rows []query.UsageRow
	waitStart := time.Now()
	nextState := waitStart.Add(30 * time.Second)
	for deadline := time.Now().Add(120 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		if time.Now().After(nextState) {
			// Still short after 30 s: where the events are, as it goes.
			state := groupState(broker.Addr(), partitions, livePIDs())
			if target.diagnose != nil {
				state += target.diagnose()
			}
			t.Logf("usage %+v (%v) after %s:\n%s", rows, err, time.Since(waitStart).Round(time.Second), state)
			nextState = time.Now().Add(30 * time.Second)
		}
		rows, err = reads.Usage(context.Background(), query.UsageQuery{Start: base.Add(-time.Hour), End: base.Add(3 * time.Hour)})
		if err == nil && len(rows) == 1 && rows[0].Requests == wantRequests && rows[0].OutputTokens == wantOutput {
			break
		}
		if time.Now().After(deadline) {
			logs := ""
			for i, r := range fleet.replicas {
				logs += fmt.Sprintf("replica %d:\n%s\n", i, r.log)
			}
			logs += groupState(broker.Addr(), partitions, livePIDs())
			if target.diagnose != nil {
				logs += target.diagnose()
			}
			t.Fatalf("usage %+v (%v), want %d requests and %d output tokens\n%s", rows, err, wantRequests, wantOutput, logs)
		}
	}
	// Stable: a moment later the totals have not grown past exact.
	time.Sleep(2 * time.Second)
	rows, err = reads.Usage(context.Background(), query.UsageQuery{Start: base.Add(-time.Hour), End: base.Add(3 * time.Hour)})
	if err != nil || len(rows) != 1 || rows[0].Requests != wantRequests || rows[0].OutputTokens != wantOutput {
		t.Fatalf("usage later %+v (%v), want %d requests and %d output tokens", rows, err, wantRequests, wantOutput)
	}
	if target.check != nil {
		target.check(wantRequests)
	}
}

// checkReplicasCaughtUp checks that every replica of each shard holds the
// same events, and the shards together every event once: the killed
// replica has caught up.
func checkReplicasCaughtUp(t *testing.T, c *chcluster.Cluster, db string, wantEvents int64) {
	t.Helper()
	var total int64
	for s, n := range c.Layout().Replicas {
		var counts []int64
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(500 * time.Millisecond) {
			counts = counts[:0]
			for r := range n {
				conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{c.Addr(s, r)}, Auth: clickhouse.Auth{Database: db}})
				if err != nil {
					t.Fatal(err)
				}
				var events uint64
				err = conn.QueryRow(context.Background(), "SELECT count() FROM (SELECT DISTINCT tenant_id, event_id FROM inference_events_local)").Scan(&events)
				conn.Close()
				if err != nil {
					t.Fatalf("shard %d replica %d: %v", s+1, r+1, err)
				}
				counts = append(counts, int64(events))
			}
			if slices.Min(counts) == slices.Max(counts) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("shard %d: replicas hold %v events, want the same", s+1, counts)
			}
		}
		t.Logf("shard %d: %d events on each of %d replicas", s+1, counts[0], n)
		if counts[0] == 0 {
			t.Errorf("shard %d holds no events: the sharding key sent every tenant to one shard", s+1)
		}
		total += counts[0]
	}
	if total != wantEvents {
		t.Fatalf("the shards hold %d events, want %d", total, wantEvents)
	}
}

// replicaState is, for each server of the cluster, how many distinct
// events its inference_events_local holds and what its replication queue
// is doing: where the rows of a wrong total are.
func replicaState(c *chcluster.Cluster, db string) string {
	var b bytes.Buffer
	for s, n := range c.Layout().Replicas {
		for r := range n {
			fmt.Fprintf(&b, "server s%dr%d: ", s+1, r+1)
			conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{c.Addr(s, r)}, Auth: clickhouse.Auth{Database: db}, DialTimeout: 5 * time.Second})
			if err != nil {
				fmt.Fprintf(&b, "%v\n", err)
				continue
			}
			// A stuck server must not hang the diagnosis.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			var events, rows uint64
			err = conn.QueryRow(ctx, "SELECT count(), uniqExact(tenant_id, event_id) FROM inference_events_local").Scan(&rows, &events)
			fmt.Fprintf(&b, "%d rows, %d distinct events (%v)", rows, events, err)
			var queue, tries uint64
			var exception string
			err = conn.QueryRow(ctx, "SELECT count(), sum(num_tries), any(last_exception) FROM system.replication_queue WHERE database = ?", db).Scan(&queue, &tries, &exception)
			fmt.Fprintf(&b, "; replication queue %d entries, %d tries, %q (%v)\n", queue, tries, exception, err)
			cancel()
			conn.Close()
		}
	}
	return b.String()
}

// groupState describes the ingest consumer group on the broker: each
// partition's end offset and committed offset, and which member holds it,
// so that a short total tells a partition nobody consumes from one
// consumed but not yet visible in ClickHouse. A member is named by the
// replica whose reader it is (the client ID, tokenmeter-<host>-<pid>-<n>,
// carries the pid; live maps the pids of running replicas to their
// numbers); a partition with records left is marked, and one held by a
// member of no running replica (a dead member the broker kept) is said so.
func groupState(addr string, partitions int, live map[int]int) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(addr)}
	topic := ingest.DefaultEventsTopic
	var parts []int
	var ends []kafka.OffsetRequest
	for p := range partitions {
		parts = append(parts, p)
		ends = append(ends, kafka.LastOffsetOf(p))
	}
	var b bytes.Buffer
	holder := map[int]string{}
	if groups, err := client.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{ingest.DefaultGroupID}}); err != nil {
		fmt.Fprintf(&b, "describe group: %v\n", err)
	} else {
		for _, g := range groups.Groups {
			fmt.Fprintf(&b, "group %s: state %s, %d members (%v)\n", g.GroupID, g.GroupState, len(g.Members), g.Error)
			for _, m := range g.Members {
				who := "a member of no running replica"
				if f := strings.Split(m.ClientID, "-"); len(f) >= 2 {
					if pid, err := strconv.Atoi(f[len(f)-2]); err == nil {
						if i, ok := live[pid]; ok {
							who = fmt.Sprintf("replica %d", i)
						}
					}
				}
				for _, tp := range m.MemberAssignments.Topics {
					for _, p := range tp.Partitions {
						holder[p] = fmt.Sprintf("%s (%s %s %s)", who, m.ClientHost, m.ClientID, m.MemberID)
					}
				}
			}
		}
	}
	offsets, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: ends}})
	if err != nil {
		return b.String() + fmt.Sprintf("list offsets: %v\n", err)
	}
	committed, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: ingest.DefaultGroupID, Topics: map[string][]int{topic: parts}})
	if err != nil {
		return b.String() + fmt.Sprintf("offset fetch: %v\n", err)
	}
	end := map[int]int64{}
	for _, o := range offsets.Topics[topic] {
		end[o.Partition] = o.LastOffset
	}
	for _, c := range committed.Topics[topic] {
		mark := ""
		if left := end[c.Partition] - max(c.CommittedOffset, 0); left > 0 {
			mark = fmt.Sprintf(" <- %d records left", left)
		}
		h, ok := holder[c.Partition]
		if !ok {
			h = "nobody"
		}
		fmt.Fprintf(&b, "partition %2d: end %d, committed %d, held by %s%s\n", c.Partition, end[c.Partition], c.CommittedOffset, h, mark)
	}
	return b.String()
}

// ingestFleet runs real `meterd --role ingest` processes of one binary,
// built once, against one broker and one ClickHouse database (in cluster
// mode when cluster is set); the test's cleanup stops those still running.
type ingestFleet struct {
	bin, broker, chAddr, db, cluster string
	replicas                         []*ingestReplica
}

// ingestReplica is one process of an ingestFleet.
type ingestReplica struct {
	cmd  *exec.Cmd
	log  *lockedBuffer
	http string
}

func newIngestFleet(t *testing.T, broker, chAddr, db, cluster string) *ingestFleet {
	t.Helper()
	f := &ingestFleet{bin: filepath.Join(t.TempDir(), "meterd"), broker: broker, chAddr: chAddr, db: db, cluster: cluster}
	if out, err := exec.Command("go", "build", "-o", f.bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		for _, r := range f.replicas {
			if r.cmd.ProcessState == nil {
				r.cmd.Process.Signal(syscall.SIGTERM)
				r.cmd.Wait()
			}
		}
	})
	return f
}

// start starts one more replica and waits until it is ready.
func (f *ingestFleet) start(t *testing.T) *ingestReplica {
	t.Helper()
	r := &ingestReplica{log: &lockedBuffer{}, http: freeAddr(t)}
	r.cmd = exec.Command(f.bin, "--role", "ingest", "--kafka-brokers", f.broker, "--clickhouse", f.chAddr,
		"--clickhouse-database", f.db, "--clickhouse-cluster", f.cluster,
		"--http-addr", r.http, "--grpc-addr", freeAddr(t), "--batch-timeout", "100ms", "--log-level", "warn")
	r.cmd.Stdout, r.cmd.Stderr = r.log, r.log
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.replicas = append(f.replicas, r)
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if resp, err := http.Get("http://" + r.http + "/healthz/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return r
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica %d not ready:\n%s", len(f.replicas), r.log)
		}
	}
}
