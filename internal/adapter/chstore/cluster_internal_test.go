package chstore

import (
	"strings"
	"testing"
)

// TestClusterTranslation translates every embedded migration for cluster
// mode: a migration in a shape cluster mode does not know fails here.
func TestClusterTranslation(t *testing.T) {
	migs, err := Migrations()
	if err != nil {
		t.Fatal(err)
	}
	s := &Store{cfg: Config{Cluster: "meter", Database: "db"}}
	all := map[string]bool{}
	for _, m := range migs {
		stmts, err := s.statements(m.Version, m.Statements...)
		if err != nil {
			t.Fatalf("migration %d: %v", m.Version, err)
		}
		for _, stmt := range stmts {
			all[stmt] = true
			upper := strings.ToUpper(stmt)
			if strings.HasPrefix(stmt, eachShard) && (!strings.HasPrefix(stmt, eachShard+"ALTER TABLE db.") || strings.Contains(stmt, " ON CLUSTER ")) {
				t.Errorf("migration %d: only ALTERs of local tables run on each shard, not ON CLUSTER: %s", m.Version, stmt)
			}
			if (strings.HasPrefix(upper, "CREATE") || strings.HasPrefix(upper, "DROP")) && !strings.Contains(stmt, " ON CLUSTER meter") {
				t.Errorf("migration %d: DDL not ON CLUSTER: %s", m.Version, stmt)
			}
			if strings.Contains(stmt, "ENGINE = ReplacingMergeTree") || strings.Contains(stmt, "ENGINE = MergeTree") {
				t.Errorf("migration %d: table not replicated: %s", m.Version, stmt)
			}
		}
	}
	want := []string{
		"CREATE TABLE IF NOT EXISTS db.inference_events ON CLUSTER meter AS db.inference_events_local\nENGINE = Distributed(meter, db, inference_events_local, cityHash64(tenant_id))",
		"CREATE TABLE IF NOT EXISTS db.gpu_hour ON CLUSTER meter AS db.gpu_hour_local\nENGINE = Distributed(meter, db, gpu_hour_local, cityHash64(deployment))",
		// 0006 alters the local table, then makes the Distributed table anew.
		eachShard + "ALTER TABLE db.inference_events_local ADD COLUMN group_hash UInt64 DEFAULT cityHash64(tenant_id, model, model_version, deployment, gpu_type, slo_class)",
		"DROP TABLE IF EXISTS db.inference_events ON CLUSTER meter",
	}
	for _, w := range want {
		if !all[w] {
			t.Errorf("no statement\n%s", w)
		}
	}
	var creates []string
	for stmt := range all {
		if strings.Contains(stmt, "ENGINE = Replicated") {
			creates = append(creates, stmt)
		}
	}
	for _, frag := range []string{
		"CREATE TABLE IF NOT EXISTS db.rollup_hour_local ON CLUSTER meter AS db.rollup_minute_local\nENGINE = ReplicatedReplacingMergeTree('/clickhouse/tokenmeter/db/{shard}/rollup_hour_local.m0003', '{replica}', version)",
		"CREATE TABLE IF NOT EXISTS db.price_books ON CLUSTER meter (",
		"ENGINE = ReplicatedMergeTree('/clickhouse/tokenmeter/db/all/price_books.m0004', '{shard}-{replica}')",
	} {
		found := false
		for _, c := range creates {
			found = found || strings.Contains(c, frag)
		}
		if !found {
			t.Errorf("no CREATE containing\n%s", frag)
		}
	}
	views := 0
	for stmt := range all {
		if strings.HasPrefix(stmt, "CREATE MATERIALIZED VIEW") {
			views++
			toLocal := strings.Contains(stmt, "TO db.dirty_hours_local AS") || strings.Contains(stmt, "TO db.gpu_dirty_hours_local AS") ||
				strings.Contains(stmt, "TO db.engine_dirty_hours_local AS")
			if !toLocal || !strings.Contains(stmt, "_local\n") && !strings.HasSuffix(stmt, "_local") {
				t.Errorf("view not over local tables: %s", stmt)
			}
		}
	}
	if views != 3 {
		t.Errorf("%d views, want 3", views)
	}
	if _, _, err := (clusterSchema{cluster: "c", db: "d"}).translate(99, "RENAME TABLE a TO b"); err == nil {
		t.Error("an unknown statement translated")
	}
	if _, _, err := (clusterSchema{cluster: "c", db: "d"}).translate(99, "CREATE TABLE IF NOT EXISTS brand_new (x UInt8) ENGINE = MergeTree ORDER BY x"); err == nil {
		t.Error("a table without a sharding key translated")
	}
}

// TestClusterMaterialized: a MATERIALIZED column, in a CREATE TABLE or an
// ADD COLUMN, becomes a DEFAULT one on the local table (a Distributed
// table's write to its own shard refuses a MATERIALIZED column on 18.16).
func TestClusterMaterialized(t *testing.T) {
	c := clusterSchema{cluster: "c", db: "d"}
	create, _, err := c.translate(12, "CREATE TABLE IF NOT EXISTS inference_events\n(\n    tenant_id String,\n    h UInt64 MATERIALIZED cityHash64(tenant_id),\n    a Array(Nullable(String)) MATERIALIZED [],\n    ok UInt8 DEFAULT 1\n)\nENGINE = ReplacingMergeTree(ingested_at)\nORDER BY tenant_id")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(create[0], "MATERIALIZED") || !strings.Contains(create[0], "h UInt64 DEFAULT cityHash64(tenant_id)") ||
		!strings.Contains(create[0], "a Array(Nullable(String)) DEFAULT []") || !strings.Contains(create[0], "ok UInt8 DEFAULT 1") {
		t.Errorf("CREATE:\n%s", create[0])
	}
	alter, _, err := c.translate(12, "ALTER TABLE rollup_hour ADD COLUMN x Nullable(Float64) MATERIALIZED 1.5")
	if err != nil {
		t.Fatal(err)
	}
	if want := eachShard + "ALTER TABLE d.rollup_hour_local ADD COLUMN x Nullable(Float64) DEFAULT 1.5"; alter[0] != want {
		t.Errorf("ALTER %q, want %q", alter[0], want)
	}
}

func TestGlobalSubqueries(t *testing.T) {
	for in, want := range map[string]string{
		"SELECT x FROM t WHERE (b, v) IN (SELECT b, max(v) FROM t GROUP BY b)":                 "SELECT x FROM t WHERE (b, v) GLOBAL IN (SELECT b, max(v) FROM t GROUP BY b)",
		"WHERE a NOT IN (SELECT a FROM t) AND b IN (\n  select b FROM u)":                      "WHERE a GLOBAL NOT IN (SELECT a FROM t) AND b GLOBAL IN (\n  select b FROM u)",
		"WHERE a GLOBAL IN (SELECT a FROM t) AND x IN (1, 2) AND JOIN (SELECT 1) AND y IN (?)": "WHERE a GLOBAL IN (SELECT a FROM t) AND x IN (1, 2) AND JOIN (SELECT 1) AND y IN (?)",
	} {
		if got := globalSubqueries(in); got != want {
			t.Errorf("globalSubqueries(%q)\n = %q\nwant %q", in, got, want)
		}
	}
}
