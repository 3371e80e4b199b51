package chstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// Cluster mode (Config.Cluster) runs the same schema and the same
// statements on a sharded, replicated ClickHouse: every table of the
// migrations named T becomes a Replicated*MergeTree table T_local on every
// server (created ON CLUSTER) and a Distributed table T over them, so that
// every statement of this package keeps its table names. docs/cluster.md
// has the design and the behaviour of ClickHouse 18.16 it rests on.
//
// Every name is qualified with the database: 18.16 runs an ON CLUSTER
// query in each server's default database.
//
// The SQL is rewritten here, not written twice: the migrations stay the
// single-node schema, and clusterSchema.translate turns each statement
// into its cluster form. A statement it does not recognise is an error,
// and TestClusterTranslation translates every embedded migration, so a new
// migration written in another shape fails the tests, not an upgrade.

// shardKeys is the sharding key of every sharded table: the expression
// whose hash picks a row's shard. Everything that deduplicates or rolls
// up must find its rows on one shard: a tenant's events (duplicates
// included: the same tenant_id and event_id) and every rollup and cost row
// keyed by tenant go by tenant; GPU samples and GPU hours by deployment
// (the cost of a deployment-hour is computed from its samples alone),
// and engine samples and rows likewise;
// dead letters by their source partition. The all-tenant levels
// (tenant_id ”) land on one shard. The hour lists (dirty_hours) are
// written by materialized views on the local tables, never through the
// Distributed table: rand() only serves a manual insert.
var shardKeys = map[string]string{
	"inference_events":       "cityHash64(tenant_id)",
	"event_ids":              "cityHash64(tenant_id)",
	"dirty_hours":            "rand()",
	"rollup_minute":          "cityHash64(tenant_id)",
	"rollup_minute_recent":   "cityHash64(tenant_id)",
	"rollup_hour":            "cityHash64(tenant_id)",
	"rollup_tenant_hour":     "cityHash64(tenant_id)",
	"rollup_total_hour":      "cityHash64(tenant_id)",
	"rollup_tenant_day":      "cityHash64(tenant_id)",
	"rollup_deployment_hour": "cityHash64(tenant_id)",
	"gpu_samples":            "cityHash64(deployment)",
	"gpu_dirty_hours":        "rand()",
	"gpu_hour":               "cityHash64(deployment)",
	"gpu_device_hour":        "cityHash64(deployment)",
	"cost_hour":              "cityHash64(tenant_id)",
	"dead_letters":           "cityHash64(source_topic, source_partition)",
	"engine_samples":         "cityHash64(deployment)",
	"engine_dirty_hours":     "rand()",
	"engine_hour":            "cityHash64(deployment)",
	"engine_minute":          "cityHash64(deployment)",
}

// globalTables are the small tables of the whole service (the schema's
// version, the rollup job's watermark, SLO sets, price books, closed
// statements): one Replicated table of the same name on every server, all
// replicas of one ZooKeeper path, read on the server the store talks to.
var globalTables = map[string]bool{
	"schema_migrations": true,
	"rollup_state":      true,
	"slo_sets":          true,
	"price_books":       true,
	"statements":        true,
	// Credit grants and their ledger (billing/credits.go).
	"credit_grants": true,
	"credit_ledger": true,
	// Reissued statements and invoice documents (invoices.go): one
	// gap-free numbering reads and writes them on one server.
	"statement_revisions": true,
	"invoices":            true,
	// Which sinks delivered which statements, and which they gave up on
	// (billing/notify).
	"statement_deliveries":   true,
	"statement_dead_letters": true,
	// The serving labels (engine, tensor parallelism) of each hour,
	// deployment and model (cost.go), which usage reads join on each shard.
	"serving_hour": true,
}

// eachShard starts a translated statement that runs on one server of
// each shard (Store.onEachShard) rather than ON CLUSTER.
const eachShard = "-- on each shard\n"

// dropOlder starts a translated DROP: the name of a table to drop only if
// an earlier migration created it (Store.dropOlder).
const dropOlder = "-- drop if older than this migration\n"

// localSuffix names the local table under a Distributed one.
const localSuffix = "_local"

// clusterSchema translates the single-node statements of the migrations
// for the cluster cluster and database db.
type clusterSchema struct {
	cluster, db string
}

var (
	createTableRE = regexp.MustCompile(`(?s)^CREATE TABLE IF NOT EXISTS (\w+)\s+(.*?)\bENGINE\s*=\s*(\w+)(?:\(([^)]*)\))?(.*)$`)
	createAsRE    = regexp.MustCompile(`(?s)^AS (\w+)\s*$`)
	createViewRE  = regexp.MustCompile(`(?s)^CREATE MATERIALIZED VIEW IF NOT EXISTS (\w+) TO (\w+) AS\s+(.*\bFROM\s+)(\w+)(.*)$`)
	dropTableRE   = regexp.MustCompile(`^DROP TABLE IF EXISTS (\w+)$`)
	alterTableRE  = regexp.MustCompile(`(?s)^ALTER TABLE (\w+)\s+(.*)$`)
	insertRE      = regexp.MustCompile(`(?s)^INSERT INTO \w+`)
	// materializedRE finds the MATERIALIZED of a column's definition,
	// name type MATERIALIZED expr, after ADD COLUMN or on a line of its own
	// in a CREATE TABLE.
	materializedRE = regexp.MustCompile(`(?im)((?:\bADD COLUMN|^)\s*\w+\s+[^\n]*?)\s+MATERIALIZED\s+`)
)

// translate returns the cluster form of one statement of migration
// version, and the sharded tables whose Distributed table must be created
// again once the migration's statements have run (an ALTER changed their
// local table's columns: 18.16 refuses ALTER ON CLUSTER of a Distributed
// table, docs/cluster.md).
func (c clusterSchema) translate(version int, stmt string) (stmts []string, redo []string, err error) {
	stmt = strings.TrimSpace(stmt)
	on := " ON CLUSTER " + c.cluster
	switch {
	case createTableRE.MatchString(stmt):
		m := createTableRE.FindStringSubmatch(stmt)
		name, body, engine, args, rest := m[1], m[2], m[3], m[4], m[5]
		if as := createAsRE.FindStringSubmatch(strings.TrimSpace(body)); as != nil {
			src, err := c.localName(as[1])
			if err != nil {
				return nil, nil, err
			}
			body = "AS " + c.db + "." + src + "\n"
		}
		if !strings.HasSuffix(engine, "MergeTree") || strings.HasPrefix(engine, "Replicated") {
			return nil, nil, fmt.Errorf("cluster mode: table %s: engine %s has no replicated form here", name, engine)
		}
		local, err := c.localName(name)
		if err != nil {
			return nil, nil, err
		}
		path := fmt.Sprintf("/clickhouse/tokenmeter/%s/{shard}/%s.m%04d", c.db, local, version)
		replica := "{replica}"
		if globalTables[name] {
			// Every server is a replica of one table: the path has no
			// shard, and the replica name is unique across shards even
			// where {replica} is only unique within one.
			path = fmt.Sprintf("/clickhouse/tokenmeter/%s/all/%s.m%04d", c.db, name, version)
			replica = "{shard}-{replica}"
		}
		params := fmt.Sprintf("'%s', '%s'", path, replica)
		if strings.TrimSpace(args) != "" {
			params += ", " + strings.TrimSpace(args)
		}
		// MATERIALIZED columns become DEFAULT ones, as in ALTER below.
		body = materializedRE.ReplaceAllString(body, "$1 DEFAULT ")
		stmts = append(stmts, fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s.%s%s %sENGINE = Replicated%s(%s)%s", c.db, local, on, body, engine, params, rest))
		if !globalTables[name] {
			stmts = append(stmts, c.distributed(name))
		}
		return stmts, nil, nil
	case createViewRE.MatchString(stmt):
		m := createViewRE.FindStringSubmatch(stmt)
		to, err := c.localName(m[2])
		if err != nil {
			return nil, nil, err
		}
		from, err := c.localName(m[4])
		if err != nil {
			return nil, nil, err
		}
		// The view sees the blocks inserted on its own server into the
		// local table, and writes a replicated table: each shard counts its
		// own rows once (docs/cluster.md, "Materialized views").
		return []string{fmt.Sprintf("CREATE MATERIALIZED VIEW IF NOT EXISTS %[1]s.%[2]s%[3]s TO %[1]s.%[4]s AS\n%[5]s%[1]s.%[6]s%[7]s", c.db, m[1], on, to, m[3], from, m[5])}, nil, nil
	case dropTableRE.MatchString(stmt):
		name := dropTableRE.FindStringSubmatch(stmt)[1]
		if _, err := c.localName(name); err != nil {
			return nil, nil, err
		}
		// Store.dropOlder drops it, ON CLUSTER, only when it was created
		// by an earlier migration than this one.
		return []string{dropOlder + name}, nil, nil
	case alterTableRE.MatchString(stmt):
		m := alterTableRE.FindStringSubmatch(stmt)
		name := m[1]
		if globalTables[name] {
			// ON CLUSTER would run it once per shard on the one shared
			// table; a replicated ALTER on one server reaches every replica.
			return []string{stmt}, nil, nil
		}
		local, err := c.localName(name)
		if err != nil {
			return nil, nil, err
		}
		// A MATERIALIZED column becomes a DEFAULT one, computed by the same
		// expression when an insert leaves it out: the Distributed table
		// computes it and sends it with the row, and 18.16's write to the
		// server's own shard refuses a MATERIALIZED column whatever
		// insert_allow_materialized_columns says (code 44). Only SELECT *
		// tells the two apart, and no statement here uses it.
		//
		// Not ON CLUSTER: 18.16's DDL worker runs an ALTER of a replicated
		// table on one replica of each shard and lets the others race for
		// it; the loser found the column added, failed, then met the
		// winner's "executed" node in ZooKeeper and terminated the server
		// (seen in make test: "Unexpected ZooKeeper error ... Node exists,
		// path: .../shards/.../executed ... Terminating"). The store runs it
		// on one server of each shard instead (Store.onEachShard);
		// replication takes it to the shard's other replicas.
		return []string{eachShard + "ALTER TABLE " + c.db + "." + local + " " + materializedRE.ReplaceAllString(m[2], "$1 DEFAULT ")}, []string{name}, nil
	case insertRE.MatchString(stmt):
		// Through the Distributed tables, like any insert; its IN
		// subqueries become GLOBAL IN (globalSubqueries).
		return []string{stmt}, nil, nil
	}
	return nil, nil, fmt.Errorf("cluster mode: migration %04d: no cluster form for statement %.60q", version, stmt)
}

// localName is the local table of a sharded table name, or name itself
// for a table of every server.
func (c clusterSchema) localName(name string) (string, error) {
	if globalTables[name] {
		return name, nil
	}
	if _, ok := shardKeys[name]; !ok {
		return "", fmt.Errorf("cluster mode: table %s has no sharding key (chstore.shardKeys)", name)
	}
	return name + localSuffix, nil
}

// distributed is the CREATE of the Distributed table name over its local
// tables. With insert_distributed_sync (set by Open in cluster mode) an
// insert into it returns once every shard's rows are written.
func (c clusterSchema) distributed(name string) string {
	return fmt.Sprintf("CREATE TABLE IF NOT EXISTS %[3]s.%[1]s ON CLUSTER %[2]s AS %[3]s.%[1]s%[4]s\nENGINE = Distributed(%[2]s, %[3]s, %[1]s%[4]s, %[5]s)",
		name, c.cluster, c.db, localSuffix, shardKeys[name])
}

// redistribute creates the Distributed table name again, so that it has
// its local table's columns after an ALTER.
func (c clusterSchema) redistribute(name string) []string {
	return []string{"DROP TABLE IF EXISTS " + c.db + "." + name + " ON CLUSTER " + c.cluster, c.distributed(name)}
}

// inSubqueryRE finds an IN (or NOT IN) whose right side is a subquery,
// with the GLOBAL before it if there is one.
var inSubqueryRE = regexp.MustCompile(`(?i)(?:\bGLOBAL\s+)?(?:\bNOT\s+)?\bIN\s*\(\s*SELECT\b`)

// globalSubqueries makes every IN subquery of query a GLOBAL one: 18.16
// refuses a subquery over a Distributed table inside a query over one
// (code 288, distributed_product_mode 'deny'), and GLOBAL keeps the
// single-node meaning: the subquery runs once over every shard and each
// shard compares with its whole answer (the newest version of an hour
// across all tenants; docs/cluster.md, "Reading"). The setting itself
// cannot be sent to 18.16 by clickhouse-go, being a string.
func globalSubqueries(query string) string {
	return inSubqueryRE.ReplaceAllStringFunc(query, func(m string) string {
		if strings.HasPrefix(strings.ToUpper(m), "GLOBAL") {
			return m
		}
		return "GLOBAL " + m
	})
}

// clusterConn sends every query with its IN subqueries made GLOBAL.
type clusterConn struct {
	driver.Conn
}

func (c clusterConn) Query(ctx context.Context, query string, args ...any) (driver.Rows, error) {
	return c.Conn.Query(ctx, globalSubqueries(query), args...)
}

func (c clusterConn) QueryRow(ctx context.Context, query string, args ...any) driver.Row {
	return c.Conn.QueryRow(ctx, globalSubqueries(query), args...)
}

func (c clusterConn) Select(ctx context.Context, dest any, query string, args ...any) error {
	return c.Conn.Select(ctx, dest, globalSubqueries(query), args...)
}

func (c clusterConn) Exec(ctx context.Context, query string, args ...any) error {
	return c.Conn.Exec(ctx, globalSubqueries(query), args...)
}

// zkPathMigrationRE finds the migration number in a replicated table's
// ZooKeeper path, as clusterSchema.translate writes it.
var zkPathMigrationRE = regexp.MustCompile(`\.m(\d{4})'`)

// dropOlder drops the table named after the dropOlder marker of stmt (its
// Distributed and local tables, ON CLUSTER) unless the table here was
// created by migration version or a later one: a migration that runs
// again (its record not yet replicated to this server, or lost) must not
// drop the table it created the first time, with the data written since
// (0004 drops and creates gpu_samples).
func (s *Store) dropOlder(ctx context.Context, version int, stmt string) error {
	name := strings.TrimSpace(strings.TrimPrefix(stmt, dropOlder))
	c := clusterSchema{cluster: s.cfg.Cluster, db: s.cfg.Database}
	local, err := c.localName(name)
	if err != nil {
		return err
	}
	rows, err := s.conn.Query(ctx, "SELECT engine_full FROM system.tables WHERE database = ? AND name = ?", s.cfg.Database, local)
	if err != nil {
		return fmt.Errorf("look up table %s: %w", local, err)
	}
	var engines []string
	for rows.Next() {
		var e string
		if err := rows.Scan(&e); err != nil {
			rows.Close()
			return fmt.Errorf("look up table %s: %w", local, err)
		}
		engines = append(engines, e)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("look up table %s: %w", local, err)
	}
	for _, e := range engines {
		if m := zkPathMigrationRE.FindStringSubmatch(e); m != nil {
			if created, _ := strconv.Atoi(m[1]); created >= version {
				s.logger.Info("not dropping a table this migration created already", "table", name, "migration", version)
				return nil
			}
		}
	}
	on := " ON CLUSTER " + s.cfg.Cluster
	drops := []string{"DROP TABLE IF EXISTS " + s.cfg.Database + "." + name + on}
	if local != name {
		drops = append(drops, "DROP TABLE IF EXISTS "+s.cfg.Database+"."+local+on)
	}
	for _, d := range drops {
		if err := s.conn.Exec(ctx, d); err != nil {
			return err
		}
	}
	return nil
}

// ingestContext is ctx for ingest's inserts of raw events and samples: in
// cluster mode the rows of the server's own shard are written on the
// server itself (prefer_localhost_replica 1) rather than sent over the
// network to the shard's first replica, as every other statement's are:
// the bulk of the traffic saves the round trip (its cost per event is not
// measured apart: meterbench cluster's ClickHouse CPU per event varied
// from 33 to 56 µs between runs either way). The raw rows are read by
// the rollup job seconds later (its Settle), after replication has
// brought them to the first replica. When ingest talks to a shard's
// second replica, a query of raw rows sent within those milliseconds may
// miss the newest of them, as it may miss events still in Kafka.
func (s *Store) ingestContext(ctx context.Context) context.Context {
	if s.cfg.Cluster == "" {
		return ctx
	}
	return clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"prefer_localhost_replica": 1}))
}

// onEachShard runs stmt on one server of each shard of the cluster, from
// system.clusters, trying a shard's replicas in order until one answers;
// replication takes it to the shard's other replicas. A column the shard
// has already (a replica that migrated at the same time, or a run that
// stopped half-way) counts as added. meterd must reach the servers by the
// host names of remote_servers, at their ports there or, over TLS, at the
// port of the store's address (every server listening on the same secure
// port).
func (s *Store) onEachShard(ctx context.Context, stmt string, _ ...any) error {
	rows, err := s.conn.Query(ctx, "SELECT shard_num, host_name, port FROM system.clusters WHERE cluster = ? ORDER BY shard_num, replica_num", s.cfg.Cluster)
	if err != nil {
		return fmt.Errorf("servers of cluster %s: %w", s.cfg.Cluster, err)
	}
	tlsPort := ""
	if s.cfg.TLS != nil && len(s.cfg.Addr) > 0 {
		if _, p, err := net.SplitHostPort(s.cfg.Addr[0]); err == nil {
			tlsPort = p
		}
	}
	var shards [][]string
	last := uint32(0)
	for rows.Next() {
		var shard uint32
		var host string
		var port uint16
		if err := rows.Scan(&shard, &host, &port); err != nil {
			rows.Close()
			return fmt.Errorf("servers of cluster %s: %w", s.cfg.Cluster, err)
		}
		if shard != last || len(shards) == 0 {
			shards = append(shards, nil)
			last = shard
		}
		if tlsPort != "" {
			// remote_servers names the servers' plain native ports; over
			// TLS, dial each at the secure port meterd uses (--clickhouse).
			shards[len(shards)-1] = append(shards[len(shards)-1], net.JoinHostPort(host, tlsPort))
			continue
		}
		shards[len(shards)-1] = append(shards[len(shards)-1], net.JoinHostPort(host, strconv.Itoa(int(port))))
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("servers of cluster %s: %w", s.cfg.Cluster, err)
	}
	if len(shards) == 0 {
		return fmt.Errorf("cluster %s is not in the server's system.clusters (remote_servers)", s.cfg.Cluster)
	}
	for i, addrs := range shards {
		var errs []error
		done := false
		for _, addr := range addrs {
			err := s.execOn(ctx, addr, stmt)
			if err == nil || addedBefore(stmt, err) {
				done = true
				break
			}
			// Down, read-only (no ZooKeeper session) or behind: its twin
			// may do it.
			errs = append(errs, fmt.Errorf("%s: %w", addr, err))
		}
		if !done {
			return fmt.Errorf("shard %d: no server answered: %w", i+1, errors.Join(errs...))
		}
	}
	return nil
}

// execOn runs stmt on the server at addr, with the store's credentials.
func (s *Store) execOn(ctx context.Context, addr, stmt string) error {
	conn, err := clickhouse.Open(&clickhouse.Options{
		Addr:        []string{addr},
		Auth:        clickhouse.Auth{Database: s.cfg.Database, Username: s.cfg.Username, Password: s.cfg.Password},
		DialTimeout: s.cfg.DialTimeout,
		TLS:         s.cfg.TLS,
	})
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Exec(ctx, stmt)
}
