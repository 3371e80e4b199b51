package chcluster_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"tokenmeter/internal/testkit/chcluster"
)

// ClickHouse error codes met on the cluster (18.16).
const (
	codeTimeoutExceeded         = 159 // ON CLUSTER: not every host answered in distributed_ddl_task_timeout
	codeAllConnectionTriesFail  = 279 // Distributed sync insert: a shard has no live replica
	codeTooFewLiveReplicas      = 285 // insert_quorum larger than the live replicas
	codeDistributedINDenied     = 288 // IN over a Distributed table in a query over one (distributed_product_mode=deny)
	codeInconsistentClusterDefn = 371 // ALTER ON CLUSTER of a table that is not replicated, with internal_replication
)

// TestCluster proves, on one cluster of three servers (shard 1 with two
// replicas, shard 2 with one), the features cluster mode is built on. The
// subtests run in order and share the cluster; the last two kill servers.
// docs/cluster.md records what they show.
func TestCluster(t *testing.T) {
	c := chcluster.Start(t, chcluster.Layout{})
	db := c.NewDB(t)
	ctx := t.Context()
	conns := map[string]driver.Conn{}
	conn := func(t *testing.T, shard, replica int) driver.Conn {
		t.Helper()
		addr := c.Addr(shard, replica)
		if cn, ok := conns[addr]; ok {
			return cn
		}
		cn := open(t, addr)
		conns[addr] = cn
		return cn
	}
	// forget drops the connections to a server that was restarted.
	forget := func(shard, replica int) {
		if cn, ok := conns[c.Addr(shard, replica)]; ok {
			cn.Close()
			delete(conns, c.Addr(shard, replica))
		}
	}
	t.Cleanup(func() {
		for _, cn := range conns {
			cn.Close()
		}
	})
	// servers are every (shard, replica) of the layout.
	var servers [][2]int
	for s, n := range c.Layout().Replicas {
		for r := range n {
			servers = append(servers, [2]int{s, r})
		}
	}
	shards := len(c.Layout().Replicas)

	eventsDDL := fmt.Sprintf(`CREATE TABLE %[1]s.events ON CLUSTER %[2]s
(bucket DateTime, tenant_id String, id UInt64, version UInt64, requests UInt64)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/%[1]s/events', '{replica}', version)
PARTITION BY toYYYYMM(bucket) ORDER BY (bucket, tenant_id, id)`, db, c.Name())
	distDDL := func(table string) string {
		return fmt.Sprintf("CREATE TABLE %[1]s.%[2]s_dist ON CLUSTER %[3]s AS %[1]s.%[2]s ENGINE = Distributed(%[3]s, %[1]s, %[2]s, cityHash64(tenant_id))",
			db, table, c.Name())
	}

	ok := t.Run("on_cluster_ddl", func(t *testing.T) {
		for _, q := range []string{eventsDDL, distDDL("events")} {
			began := time.Now()
			got := onCluster(t, conn(t, 0, 0), q)
			t.Logf("%.60s...: %v, answered %v", q, time.Since(began).Round(time.Millisecond), got)
			var ports []uint16
			for _, h := range got {
				if h.Status != 0 || h.Error != "" {
					t.Errorf("host %s:%d: status %d, error %q; want 0", h.Host, h.Port, h.Status, h.Error)
				}
				ports = append(ports, h.Port)
			}
			if want := serverPorts(t, c); !sameSet(ports, want) {
				t.Errorf("hosts answering: got ports %v, want %v", ports, want)
			}
		}
		for _, sr := range servers {
			cn := conn(t, sr[0], sr[1])
			var engines []string
			rows, err := cn.Query(ctx, "SELECT engine FROM system.tables WHERE database = ? ORDER BY name", db)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var e string
				if err := rows.Scan(&e); err != nil {
					t.Fatal(err)
				}
				engines = append(engines, e)
			}
			rows.Close()
			if want := []string{"ReplicatedReplacingMergeTree", "Distributed"}; !slices.Equal(engines, want) {
				t.Errorf("server %v: got engines %v, want %v", sr, engines, want)
			}
			var path, replica string
			if err := cn.QueryRow(ctx, "SELECT zookeeper_path, replica_name FROM system.replicas WHERE database = ?", db).Scan(&path, &replica); err != nil {
				t.Fatal(err)
			}
			wantPath := fmt.Sprintf("/clickhouse/tables/%d/%s/events", sr[0]+1, db)
			wantReplica := fmt.Sprintf("s%dr%d", sr[0]+1, sr[1]+1)
			if path != wantPath || replica != wantReplica {
				t.Errorf("server %v: got replica %s at %s, want %s at %s", sr, replica, path, wantReplica, wantPath)
			}
		}
	})
	if !ok {
		t.FailNow()
	}

	t.Run("settings_over_native_protocol", func(t *testing.T) {
		// clickhouse-go sends settings to 18.16 as unsigned varints (the
		// protocol before settings became strings, revision 54429): a
		// UInt64 setting arrives as sent, an Int64 one (zigzag-decoded by
		// the server) halved, and a string one cannot be sent at all; it
		// goes in the query's SETTINGS clause instead.
		for _, tt := range []struct {
			name string
			want string
		}{
			{"max_threads", "6"},                  // UInt64
			{"insert_quorum", "6"},                // UInt64
			{"insert_distributed_timeout", "6"},   // seconds
			{"distributed_ddl_task_timeout", "3"}, // Int64
		} {
			sctx := clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{tt.name: 6}))
			var got string
			if err := conn(t, 0, 0).QueryRow(sctx, "SELECT value FROM system.settings WHERE name = ?", tt.name).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("%s sent as 6: got %s, want %s", tt.name, got, tt.want)
			}
		}
		sctx := clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"distributed_product_mode": "global"}))
		if err := conn(t, 0, 0).Exec(sctx, "SELECT 1"); err == nil {
			t.Error("string setting sent by clickhouse-go: no error, want one")
		}
		var got string
		if err := conn(t, 0, 0).QueryRow(ctx, "SELECT value FROM system.settings WHERE name = 'distributed_product_mode' SETTINGS distributed_product_mode = 'global'").Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != "global" {
			t.Errorf("distributed_product_mode in a SETTINGS clause: got %s, want global", got)
		}
	})

	t.Run("sharding_and_replication", func(t *testing.T) {
		// 1,000 rows of 50 tenants through the Distributed table of the
		// server of shard 2, synchronously.
		const n = 1000
		if err := conn(t, 1, 0).Exec(syncInsert(ctx), fmt.Sprintf(`INSERT INTO %s.events_dist
SELECT toDateTime('2026-01-01 00:00:00'), concat('tenant-', toString(number %% 50)), number, 1, 1 FROM numbers(%d)`, db, n)); err != nil {
			t.Fatal(err)
		}
		// The insert returns once one replica of each shard has its rows
		// (either: load_balancing is random); the others fetch them.
		began := time.Now()
		syncReplicas(t, c, conn, db+".events")
		t.Logf("replicas in sync %v after the insert", time.Since(began).Round(time.Millisecond))
		// Every replica of a shard holds exactly the rows whose key picks
		// the shard: cityHash64(tenant_id) modulo the shards' total weight
		// (1 each).
		var total uint64
		for _, sr := range servers {
			var rows, misplaced uint64
			if err := conn(t, sr[0], sr[1]).QueryRow(ctx, fmt.Sprintf("SELECT count(), countIf(cityHash64(tenant_id) %% %d != %d) FROM %s.events", shards, sr[0], db)).Scan(&rows, &misplaced); err != nil {
				t.Fatal(err)
			}
			if rows == 0 || misplaced != 0 {
				t.Errorf("server %v: got %d rows, %d of them for another shard; want some rows, none misplaced", sr, rows, misplaced)
			}
			if sr[1] == 0 {
				total += rows
			}
		}
		if total != n {
			t.Errorf("rows on the shards: got %d, want %d", total, n)
		}
		// A read through the Distributed table, from any server, sees every
		// row once.
		for _, sr := range servers {
			var rows, ids uint64
			if err := conn(t, sr[0], sr[1]).QueryRow(ctx, "SELECT count(), uniqExact(id) FROM "+db+".events_dist").Scan(&rows, &ids); err != nil {
				t.Fatal(err)
			}
			if rows != n || ids != n {
				t.Errorf("read through the Distributed table of %v: got %d rows, %d ids, want %d", sr, rows, ids, n)
			}
		}
	})

	t.Run("newest_version", func(t *testing.T) {
		// A rollup-like table: each computation of an hour writes every
		// tenant's row with a higher version, through the Distributed table.
		onCluster(t, conn(t, 0, 0), fmt.Sprintf(`CREATE TABLE %[1]s.rollup ON CLUSTER %[2]s
(bucket DateTime, tenant_id String, version UInt64, requests UInt64)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/%[1]s/rollup', '{replica}', version)
ORDER BY (bucket, tenant_id)`, db, c.Name()))
		onCluster(t, conn(t, 0, 0), distDDL("rollup"))
		const tenants = 20
		insert := func(version, requests int, where string) {
			t.Helper()
			q := fmt.Sprintf(`INSERT INTO %s.rollup_dist SELECT toDateTime('2026-01-01 00:00:00'), tenant_id, %d, %d
FROM (SELECT concat('tenant-', toString(number)) AS tenant_id FROM numbers(%d)) WHERE %s`, db, version, requests, tenants, where)
			if err := conn(t, 0, 0).Exec(syncInsert(ctx), q); err != nil {
				t.Fatal(err)
			}
			// Reads go to any replica of a shard (load_balancing random):
			// right after an insert one may not have fetched it yet.
			syncReplicas(t, c, conn, db+".rollup")
		}
		insert(1, 1, "1")
		insert(2, 10, "1")
		const newest = tenants * 10
		dist, local := db+".rollup_dist", db+".rollup"
		newestIn := func(in, from string) string {
			return fmt.Sprintf("SELECT sum(requests) FROM %s WHERE (bucket, version) %s (SELECT bucket, max(version) FROM %s GROUP BY bucket)", dist, in, from)
		}
		tests := []struct {
			name  string
			query string
			want  uint64
			code  int32 // a ClickHouse error instead
		}{
			{name: "FINAL through Distributed", query: "SELECT sum(requests) FROM " + dist + " FINAL", want: newest},
			{name: "argMax by key", query: "SELECT sum(r) FROM (SELECT argMax(requests, version) AS r FROM " + dist + " GROUP BY bucket, tenant_id)", want: newest},
			{name: "IN over Distributed denied", query: newestIn("IN", dist), code: codeDistributedINDenied},
			{name: "GLOBAL IN", query: newestIn("GLOBAL IN", dist), want: newest},
			{name: "IN over the local table", query: newestIn("IN", local), want: newest},
			// String settings go in the query's SETTINGS clause:
			// clickhouse-go cannot send them to 18.16 (see
			// settings_over_native_protocol).
			{name: "distributed_product_mode=global", query: newestIn("IN", dist) + " SETTINGS distributed_product_mode = 'global'", want: newest},
			{name: "distributed_product_mode=local", query: newestIn("IN", dist) + " SETTINGS distributed_product_mode = 'local'", want: newest},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				var got uint64
				err := conn(t, 1, 0).QueryRow(ctx, tt.query).Scan(&got)
				if tt.code != 0 {
					if code := exceptionCode(err); code != tt.code {
						t.Fatalf("got error %v, want code %d", err, tt.code)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if got != tt.want {
					t.Errorf("got %d requests, want %d", got, tt.want)
				}
			})
		}
		// A computation that writes only some tenants' rows (all on shard
		// 2) tells the versions apart: GLOBAL IN takes the newest version
		// of the hour over every shard (single-node meaning: the newest
		// computation is the hour), the local subquery each shard's own.
		var tenant string
		if err := conn(t, 1, 0).QueryRow(ctx, "SELECT any(tenant_id) FROM "+local).Scan(&tenant); err != nil {
			t.Fatal(err)
		}
		insert(3, 100, "tenant_id = '"+tenant+"'")
		onShard1 := count(t, conn(t, 0, 0), "SELECT sum(requests) FROM "+local+" FINAL")
		for _, tt := range []struct {
			name  string
			query string
			want  uint64
		}{
			{"GLOBAL IN", newestIn("GLOBAL IN", dist), 100},
			{"IN over the local table", newestIn("IN", local), 100 + onShard1},
			{"FINAL", "SELECT sum(requests) FROM " + dist + " FINAL", newest - 10 + 100},
		} {
			if got := count(t, conn(t, 0, 1), tt.query); got != tt.want {
				t.Errorf("partial computation, %s: got %d requests, want %d", tt.name, got, tt.want)
			}
		}
	})

	t.Run("materialized_view", func(t *testing.T) {
		// dirty_hours_mv's shape: a view ON CLUSTER over the local table
		// into a replicated table. It sees the blocks its server receives
		// (inserts through Distributed land on each shard's receiving
		// replica), not those fetched by replication; the target replicates.
		onCluster(t, conn(t, 0, 0), fmt.Sprintf(`CREATE TABLE %[1]s.dirty ON CLUSTER %[2]s (hour DateTime, n UInt64)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/%[1]s/dirty', '{replica}') ORDER BY hour`, db, c.Name()))
		onCluster(t, conn(t, 0, 0), fmt.Sprintf(`CREATE MATERIALIZED VIEW %[1]s.dirty_mv ON CLUSTER %[2]s TO %[1]s.dirty
AS SELECT bucket AS hour, count() AS n FROM %[1]s.events GROUP BY hour`, db, c.Name()))
		if err := conn(t, 1, 0).Exec(syncInsert(ctx), fmt.Sprintf(`INSERT INTO %s.events_dist
SELECT toDateTime('2026-02-01 00:00:00'), concat('tenant-', toString(number %% 50)), 100000 + number, 1, 1 FROM numbers(500)`, db)); err != nil {
			t.Fatal(err)
		}
		syncReplicas(t, c, conn, db+".events")
		syncReplicas(t, c, conn, db+".dirty")
		var sum uint64
		for _, sr := range servers {
			events := count(t, conn(t, sr[0], sr[1]), "SELECT count() FROM "+db+".events WHERE bucket = '2026-02-01 00:00:00'")
			dirty := count(t, conn(t, sr[0], sr[1]), "SELECT sum(n) FROM "+db+".dirty")
			if dirty != events {
				t.Errorf("server %v: the view counted %d rows, want %d (the shard's)", sr, dirty, events)
			}
			if sr[1] == 0 {
				sum += dirty
			}
		}
		if sum != 500 {
			t.Errorf("the view counted %d rows over the shards, want 500", sum)
		}
	})

	t.Run("alter_on_cluster", func(t *testing.T) {
		// The replicated table: every host answers 0 (with
		// internal_replication one replica per shard runs it, the others
		// get it by replication).
		for _, h := range onCluster(t, conn(t, 0, 0), fmt.Sprintf("ALTER TABLE %s.events ON CLUSTER %s ADD COLUMN extra UInt64", db, c.Name())) {
			if h.Status != 0 {
				t.Errorf("ALTER of the replicated table on %s:%d: status %d, error %q", h.Host, h.Port, h.Status, h.Error)
			}
		}
		// The Distributed table: 18.16 refuses ALTER ON CLUSTER of a table
		// that is not replicated on a cluster with internal_replication
		// (each host fails with 371, and the query with the first host's
		// error); each server's own ALTER works.
		_, err := onClusterErr(ctx, conn(t, 0, 0), fmt.Sprintf("ALTER TABLE %s.events_dist ON CLUSTER %s ADD COLUMN extra UInt64", db, c.Name()))
		if code := exceptionCode(err); code != codeInconsistentClusterDefn {
			t.Errorf("ALTER ON CLUSTER of the Distributed table: got %v, want code %d", err, codeInconsistentClusterDefn)
		}
		for _, sr := range servers {
			if err := conn(t, sr[0], sr[1]).Exec(ctx, fmt.Sprintf("ALTER TABLE %s.events_dist ADD COLUMN extra UInt64", db)); err != nil {
				t.Fatalf("ALTER of the Distributed table on %v: %v", sr, err)
			}
		}
		for _, sr := range servers {
			if got := count(t, conn(t, sr[0], sr[1]), "SELECT count() FROM system.columns WHERE database = '"+db+"' AND name = 'extra'"); got != 2 {
				t.Errorf("server %v: column extra in %d tables, want 2", sr, got)
			}
		}
	})

	t.Run("insert_acknowledgement", func(t *testing.T) {
		for _, name := range []string{"insert_distributed_sync", "insert_distributed_timeout", "insert_quorum"} {
			if got := count(t, conn(t, 0, 0), "SELECT count() FROM system.settings WHERE name = '"+name+"'"); got != 1 {
				t.Errorf("setting %s: got %d rows in system.settings, want 1", name, got)
			}
		}
		// insert_quorum=2 on the two-replica shard: the rows are on both
		// replicas when the insert returns.
		quorum := clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"insert_quorum": 2, "insert_quorum_timeout": 10000}))
		if err := conn(t, 0, 0).Exec(quorum, fmt.Sprintf(`INSERT INTO %s.events (bucket, tenant_id, id, version, requests)
SELECT toDateTime('2026-03-01 00:00:00'), 'q', number, 1, 1 FROM numbers(100)`, db)); err != nil {
			t.Fatal(err)
		}
		if got := count(t, conn(t, 0, 1), "SELECT count() FROM "+db+".events WHERE tenant_id = 'q'"); got != 100 {
			t.Errorf("right after a quorum insert: got %d rows on the other replica, want 100", got)
		}
		// A synchronous insert that fails on one shard may have written
		// the others (here insert_quorum=2 fails on the one-replica shard
		// 2). Retried with the same rows, it is exact: each shard's
		// replicated table drops a block it already has (the last 100
		// blocks' hashes are kept in ZooKeeper).
		retried := fmt.Sprintf(`INSERT INTO %s.events_dist (bucket, tenant_id, id, version, requests)
SELECT toDateTime('2026-03-02 00:00:00'), concat('tenant-', toString(number %% 50)), number, 1, 1 FROM numbers(1000)`, db)
		quorumDist := clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"insert_distributed_sync": 1, "insert_quorum": 2, "insert_quorum_timeout": 10000}))
		err := conn(t, 1, 0).Exec(quorumDist, retried)
		if code := exceptionCode(err); code != codeTooFewLiveReplicas {
			t.Errorf("insert with insert_quorum=2 through Distributed: got %v, want code %d", err, codeTooFewLiveReplicas)
		}
		syncReplicas(t, c, conn, db+".events")
		const retriedRows = "SELECT count() FROM " + "%s.events WHERE bucket = '2026-03-02 00:00:00'"
		t.Logf("failed insert left %d rows on shard 1, %d on shard 2",
			count(t, conn(t, 0, 0), fmt.Sprintf(retriedRows, db)), count(t, conn(t, 1, 0), fmt.Sprintf(retriedRows, db)))
		if err := conn(t, 1, 0).Exec(syncInsert(ctx), retried); err != nil {
			t.Fatal(err)
		}
		syncReplicas(t, c, conn, db+".events")
		if got := count(t, conn(t, 0, 0), fmt.Sprintf(retriedRows, db)) + count(t, conn(t, 1, 0), fmt.Sprintf(retriedRows, db)); got != 1000 {
			t.Errorf("after the retry: got %d rows, want 1000", got)
		}

		// Shard 2's only server goes down.
		if err := c.Kill(1, 0); err != nil {
			t.Fatal(err)
		}
		const hour = "toDateTime('2026-04-01 00:00:00')"
		insert := func(settings clickhouse.Settings, version int) error {
			ictx := clickhouse.Context(ctx, clickhouse.WithSettings(settings))
			return conn(t, 0, 0).Exec(ictx, fmt.Sprintf(`INSERT INTO %s.events_dist (bucket, tenant_id, id, version, requests)
SELECT %s, concat('tenant-', toString(number %% 50)), 200000 + number, %d, 1 FROM numbers(200)`, db, hour, version))
		}
		// A synchronous insert fails when a shard has no live replica.
		err = insert(clickhouse.Settings{"insert_distributed_sync": 1}, 1)
		if code := exceptionCode(err); code != codeAllConnectionTriesFail {
			t.Errorf("sync insert with shard 2 down: got %v, want code %d", err, codeAllConnectionTriesFail)
		}
		t.Logf("sync insert with shard 2 down: %v; rows of it on shard 1: %d", err,
			count(t, conn(t, 0, 0), "SELECT count() FROM "+db+".events WHERE bucket = "+hour))
		// The default, asynchronous insert succeeds: shard 1's rows are
		// written, shard 2's wait on the disk of the server that took the
		// insert until shard 2 is back.
		if err := insert(nil, 2); err != nil {
			t.Fatalf("async insert with shard 2 down: %v", err)
		}
		onShard1 := count(t, conn(t, 0, 0), "SELECT count() FROM "+db+".events WHERE bucket = "+hour+" AND version = 2")
		if onShard1 == 0 || onShard1 == 200 {
			t.Errorf("async insert with shard 2 down: %d of 200 rows on shard 1, want some", onShard1)
		}
		if err := c.Restart(1, 0); err != nil {
			t.Fatal(err)
		}
		forget(1, 0)
		began := time.Now()
		waitFor(t, 60*time.Second, func() (bool, error) {
			got, err := countErr(conn(t, 0, 0), "SELECT count() FROM "+db+".events_dist WHERE bucket = "+hour+" AND version = 2")
			return got == 200, err
		})
		t.Logf("queued rows delivered %v after shard 2's restart", time.Since(began).Round(time.Millisecond))
	})

	t.Run("replica_killed_during_inserts", func(t *testing.T) {
		// A stream of batches, alternately through the Distributed table of
		// shard 2's server (synchronous) and straight into shard 1's first
		// replica; shard 1's second replica is killed a little after the
		// stream starts. Failed batches are retried as ingest would.
		onCluster(t, conn(t, 0, 0), fmt.Sprintf(`CREATE TABLE %[1]s.stream ON CLUSTER %[2]s
(tenant_id String, id UInt64, version UInt64)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/%[1]s/stream', '{replica}', version)
ORDER BY (tenant_id, id)`, db, c.Name()))
		onCluster(t, conn(t, 0, 0), distDDL("stream"))
		const batches, batchRows = 60, 200
		var killed atomic.Bool
		var wg sync.WaitGroup
		wg.Go(func() {
			time.Sleep(300 * time.Millisecond)
			if err := c.Kill(0, 1); err != nil {
				t.Error(err)
			}
			killed.Store(true)
		})
		retries, afterKill, b := 0, 0, 0
		for ; b < batches || !killed.Load(); b++ {
			target, table := conn(t, 1, 0), db+".stream_dist"
			if b%2 == 1 {
				target, table = conn(t, 0, 0), db+".stream"
			}
			if killed.Load() {
				afterKill++
			}
			for try := 1; ; try++ {
				err := insertBatch(ctx, target, table, b, batchRows)
				if err == nil {
					break
				}
				if try == 5 {
					t.Fatalf("batch %d: %v", b, err)
				}
				retries++
				t.Logf("batch %d, try %d: %v", b, try, err)
				time.Sleep(200 * time.Millisecond)
			}
		}
		wg.Wait()
		total := uint64(b * batchRows)
		t.Logf("stream: %d batches of %d rows, %d of them after the kill, %d retries", b, batchRows, afterKill, retries)
		if afterKill == 0 {
			t.Error("no batch was inserted after the kill")
		}
		// Rows of a batch the killed replica took (through Distributed)
		// and acknowledged just before it died are on no other replica
		// until it is back: not lost, but not readable either.
		if got := count(t, conn(t, 0, 0), "SELECT count() FROM "+db+".stream_dist"); got > total {
			t.Errorf("read through Distributed while a replica is down: got %d rows, want at most %d", got, total)
		} else {
			t.Logf("read through Distributed while a replica is down: %d rows of %d", got, total)
		}

		// While it is down: a quorum of 2 cannot be had (once its session
		// has expired), and an ON CLUSTER query times out but is queued
		// for it.
		waitFor(t, 30*time.Second, func() (bool, error) {
			got, err := countErr(conn(t, 0, 0), "SELECT active_replicas FROM system.replicas WHERE database = '"+db+"' AND table = 'stream'")
			return got == 1, err
		})
		quorum := clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"insert_quorum": 2, "insert_quorum_timeout": 3000}))
		err := conn(t, 0, 0).Exec(quorum, "INSERT INTO "+db+".stream SELECT 'q', number, 1 FROM numbers(10)")
		if code := exceptionCode(err); code != codeTooFewLiveReplicas {
			t.Errorf("quorum insert with a replica down: got %v, want code %d", err, codeTooFewLiveReplicas)
		}
		short := clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"distributed_ddl_task_timeout": int64Setting(2)}))
		_, err = onClusterErr(short, conn(t, 0, 0), fmt.Sprintf("CREATE TABLE %s.late ON CLUSTER %s (n UInt64) ENGINE = Memory", db, c.Name()))
		if code := exceptionCode(err); code != codeTimeoutExceeded {
			t.Errorf("ON CLUSTER with a server down: got %v, want code %d", err, codeTimeoutExceeded)
		}

		began := time.Now()
		if err := c.Restart(0, 1); err != nil {
			t.Fatal(err)
		}
		forget(0, 1)
		restarted := time.Now()
		waitFor(t, 60*time.Second, func() (bool, error) {
			a, err := countErr(conn(t, 0, 0), "SELECT count() FROM "+db+".stream")
			if err != nil {
				return false, err
			}
			b, err := countErr(conn(t, 0, 1), "SELECT count() FROM "+db+".stream")
			return a == b, err
		})
		t.Logf("restart took %v (waiting out the session), caught up %v after it",
			restarted.Sub(began).Round(time.Millisecond), time.Since(restarted).Round(time.Millisecond))
		waitFor(t, 30*time.Second, func() (bool, error) {
			got, err := countErr(conn(t, 0, 1), "SELECT count() FROM system.tables WHERE database = '"+db+"' AND name = 'late'")
			return got == 1, err
		})
		for _, sr := range servers {
			var rows, ids uint64
			if err := conn(t, sr[0], sr[1]).QueryRow(ctx, "SELECT count(), uniqExact(id) FROM "+db+".stream_dist").Scan(&rows, &ids); err != nil {
				t.Fatal(err)
			}
			if rows != total || ids != total {
				t.Errorf("after the restart, read through Distributed from %v: got %d rows, %d ids, want %d", sr, rows, ids, total)
			}
		}
	})
}

// syncInsert makes inserts through Distributed tables synchronous.
func syncInsert(ctx context.Context) context.Context {
	return clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"insert_distributed_sync": 1}))
}

// syncReplicas waits until every server has fetched what its shard's
// other replicas have of table (SYSTEM SYNC REPLICA, which 18.16 has).
func syncReplicas(t *testing.T, c *chcluster.Cluster, conn func(*testing.T, int, int) driver.Conn, table string) {
	t.Helper()
	for s, n := range c.Layout().Replicas {
		for r := range n {
			if err := conn(t, s, r).Exec(t.Context(), "SYSTEM SYNC REPLICA "+table); err != nil {
				t.Fatalf("sync replica %d of shard %d: %v", r, s, err)
			}
		}
	}
}

// int64Setting is the value to give clickhouse-go for a setting of type
// Int64 to get v on 18.16: the client sends every setting as an unsigned
// varint (the protocol before settings became strings) and the server
// reads Int64 settings as zigzag-encoded signed ones, so 2 arrives as 1
// (settings_over_native_protocol shows it).
func int64Setting(v int) int { return 2 * v }

// insertBatch inserts batch b of n rows (ids b*n to b*n+n-1) into table
// with a batch of the native protocol, as ingest does, synchronously when
// table is Distributed.
func insertBatch(ctx context.Context, conn driver.Conn, table string, b, n int) error {
	ctx = clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"insert_distributed_sync": 1}))
	batch, err := conn.PrepareBatch(ctx, "INSERT INTO "+table+" (tenant_id, id, version)")
	if err != nil {
		return err
	}
	for i := range n {
		id := uint64(b*n + i)
		if err := batch.Append(fmt.Sprintf("tenant-%d", id%37), id, uint64(1)); err != nil {
			return err
		}
	}
	return batch.Send()
}

// hostStatus is a row of what an ON CLUSTER query answers on 18.16: one
// per host, as each finishes.
type hostStatus struct {
	Host      string
	Port      uint16
	Status    int64
	Error     string
	Remaining uint64
	Active    uint64
}

// onCluster runs an ON CLUSTER query and returns its hosts' answers.
func onCluster(t *testing.T, conn driver.Conn, query string) []hostStatus {
	t.Helper()
	hosts, err := onClusterErr(t.Context(), conn, query)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return hosts
}

func onClusterErr(ctx context.Context, conn driver.Conn, query string) ([]hostStatus, error) {
	rows, err := conn.Query(ctx, query)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var hosts []hostStatus
	for rows.Next() {
		var h hostStatus
		if err := rows.Scan(&h.Host, &h.Port, &h.Status, &h.Error, &h.Remaining, &h.Active); err != nil {
			var types []string
			for _, ct := range rows.ColumnTypes() {
				types = append(types, ct.Name()+" "+ct.DatabaseTypeName())
			}
			return nil, fmt.Errorf("scan %v: %w", types, err)
		}
		hosts = append(hosts, h)
	}
	return hosts, rows.Err()
}

func serverPorts(t *testing.T, c *chcluster.Cluster) []uint16 {
	t.Helper()
	var ports []uint16
	for _, addr := range c.Addrs() {
		var p uint16
		if _, err := fmt.Sscanf(addr, "127.0.0.1:%d", &p); err != nil {
			t.Fatal(err)
		}
		ports = append(ports, p)
	}
	return ports
}

func sameSet[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

func open(t *testing.T, addr string) driver.Conn {
	t.Helper()
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{addr}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// count runs a query that answers one number.
func count(t *testing.T, conn driver.Conn, query string) uint64 {
	t.Helper()
	n, err := countErr(conn, query)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

func countErr(conn driver.Conn, query string) (uint64, error) {
	var v any
	rows, err := conn.Query(context.Background(), query)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	if !rows.Next() {
		return 0, errors.Join(rows.Err(), errors.New("no rows"))
	}
	ct := rows.ColumnTypes()[0].ScanType()
	p := reflect.New(ct)
	if err := rows.Scan(p.Interface()); err != nil {
		return 0, err
	}
	v = p.Elem().Interface()
	switch n := v.(type) {
	case uint64:
		return n, nil
	case uint8:
		return uint64(n), nil
	case uint16:
		return uint64(n), nil
	case uint32:
		return uint64(n), nil
	case int64:
		return uint64(n), nil
	default:
		return 0, fmt.Errorf("%s: answers %T", query, v)
	}
}

// waitFor polls cond until it holds, failing t after timeout.
func waitFor(t *testing.T, timeout time.Duration, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not so after %v (last error: %v)", timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// exceptionCode returns the ClickHouse error code in err, or 0.
func exceptionCode(err error) int32 {
	var ex *clickhouse.Exception
	if errors.As(err, &ex) {
		return ex.Code
	}
	return 0
}
