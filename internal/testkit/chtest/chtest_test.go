package chtest_test

import (
	"context"
	"testing"

	"github.com/ClickHouse/clickhouse-go/v2"

	"tokenmeter/internal/testkit/chtest"
)

func TestMain(m *testing.M) { chtest.Main(m) }

// databaseExists reports whether database is on the server at addr.
func databaseExists(t *testing.T, addr, database string) bool {
	t.Helper()
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var n uint64
	if err := conn.QueryRow(context.Background(), "SELECT count() FROM system.databases WHERE name = ?", database).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 1
}

func TestNewDB(t *testing.T) {
	tests := []string{
		"plain",
		"Mixed Case and spaces/with-slash",
		"a very long test name that goes on and on well past forty characters",
	}
	var addr string
	seen := map[string]bool{}
	for _, name := range tests {
		t.Run(name, func(t *testing.T) {
			var db string
			addr, db = chtest.NewDB(t)
			if seen[db] {
				t.Errorf("database %s handed out twice", db)
			}
			seen[db] = true
			if !databaseExists(t, addr, db) {
				t.Fatalf("database %s not created", db)
			}
			conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{addr}, Auth: clickhouse.Auth{Database: db}})
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx := context.Background()
			if err := conn.Exec(ctx, "CREATE TABLE t (n UInt64) ENGINE = MergeTree ORDER BY n"); err != nil {
				t.Fatal(err)
			}
			if err := conn.Exec(ctx, "INSERT INTO t SELECT number FROM system.numbers LIMIT 10"); err != nil {
				t.Fatal(err)
			}
		})
	}
	for db := range seen {
		if databaseExists(t, addr, db) {
			t.Errorf("database %s not dropped after its test", db)
		}
	}
}

// TestStartPrivate checks that a private server is separate from the shared
// one and survives a kill and restart.
func TestStartPrivate(t *testing.T) {
	srv := chtest.StartPrivate(t)
	if srv.Addr() == chtest.Addr(t) {
		t.Fatalf("private server shares address %s with the shared one", srv.Addr())
	}
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !databaseExists(t, srv.Addr(), "default") {
		t.Error("database default missing after restart")
	}
}
