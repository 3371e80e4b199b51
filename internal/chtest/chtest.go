// Package chtest gives tests a real ClickHouse: one private server per test
// binary (started on first use, in a temporary directory), a fresh database
// per test, or a private server per test for tests that stop and restart it.
// METER_TEST_CLICKHOUSE=host:port uses an existing server instead.
//
// Without ClickHouse the tests skip, except under CI=true, where they fail:
// a CI run must not go green by skipping.
package chtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"tokenmeter/internal/chserver"
)

var shared struct {
	once sync.Once
	dir  string
	srv  *chserver.Server
	addr string
	err  error
}

// Main runs the tests and then stops the shared server, if one was started.
// Use it as TestMain.
func Main(m *testing.M) {
	code := m.Run()
	if shared.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_ = shared.srv.Stop(ctx)
		cancel()
	}
	if shared.dir != "" {
		os.RemoveAll(shared.dir)
	}
	os.Exit(code)
}

// unavailable skips the test, or fails it under CI=true.
func unavailable(t testing.TB, err error) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("ClickHouse is required under CI=true: %v", err)
	}
	t.Skipf("ClickHouse not available: %v", err)
}

// Addr is the native address of the shared test server.
func Addr(t testing.TB) string {
	t.Helper()
	shared.once.Do(func() {
		if a := os.Getenv("METER_TEST_CLICKHOUSE"); a != "" {
			shared.addr = a
			return
		}
		if _, err := chserver.FindBinary(); err != nil {
			shared.err = err
			return
		}
		shared.dir, shared.err = os.MkdirTemp("", "chtest-")
		if shared.err != nil {
			return
		}
		shared.srv, shared.err = chserver.Start(context.Background(), chserver.Config{Dir: shared.dir})
		if shared.err == nil {
			shared.addr = shared.srv.Addr()
		}
	})
	if shared.err != nil {
		unavailable(t, shared.err)
	}
	return shared.addr
}

// NewDB creates a database with a unique name on the shared server and drops
// it when the test ends.
func NewDB(t testing.TB) (addr, database string) {
	t.Helper()
	addr = Addr(t)
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, t.Name())
	if len(name) > 40 {
		name = name[:40]
	}
	database = fmt.Sprintf("t_%s_%08x", name, rand.Uint32())
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{addr}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := conn.Exec(ctx, "CREATE DATABASE "+database); err != nil {
		conn.Close()
		t.Fatalf("create test database: %v", err)
	}
	t.Cleanup(func() {
		defer conn.Close()
		if err := conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+database); err != nil {
			t.Logf("drop test database %s: %v", database, err)
		}
	})
	return addr, database
}

// StartPrivate starts a server for this test alone, stopped when it ends.
func StartPrivate(t testing.TB) *chserver.Server {
	t.Helper()
	if _, err := chserver.FindBinary(); err != nil {
		unavailable(t, err)
	}
	srv, err := chserver.Start(context.Background(), chserver.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatalf("start private ClickHouse: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = srv.Stop(ctx)
	})
	return srv
}
