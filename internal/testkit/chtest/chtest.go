// Package chtest gives tests in other packages a real ClickHouse: one
// private server shared by all tests of a test binary (or an external server
// named by METER_TEST_CLICKHOUSE), a fresh database per test, and private
// servers for tests that stop or kill ClickHouse.
//
// A test binary that uses it calls Main from TestMain, which stops the
// shared server and removes its directory when the tests are done:
//
//	func TestMain(m *testing.M) { chtest.Main(m) }
//
// Without ClickHouse installed the tests that need it skip, except under
// CI=true, where they fail: CI must never go green by skipping.
//
// The package creates databases, not tables: schemas belong to chstore.
package chtest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"tokenmeter/internal/adapter/devenv"
	"tokenmeter/internal/logsetup"
	"tokenmeter/internal/testkit/chcluster"
)

// EnvCluster names the environment variable that, set to 1, makes
// chstoretest open its stores in cluster mode on a cluster shared by the
// test binary (chcluster.Shared): the tests of the packages that read and
// write through chstore then run against two shards, the first with two
// replicas.
const EnvCluster = "METER_TEST_CLUSTER"

// EnvAddr names the environment variable that points the tests at an
// external server ("host:port" of its native protocol) instead of a private
// one.
const EnvAddr = "METER_TEST_CLICKHOUSE"

const (
	startTimeout = 2 * time.Minute
	stopTimeout  = 30 * time.Second
)

// shared is the one server of a test binary, started by the first test that
// needs it and stopped by Main.
var shared struct {
	mainCalled bool // set by Main before any test runs

	once sync.Once
	dir  string // the server's parent directory, removed by Main
	srv  *devenv.ClickHouse
	err  error
}

// Main runs the tests, then stops the shared server (if a test started it)
// and removes its directory, and exits with the tests' status. Call it from
// TestMain.
func Main(m *testing.M) { os.Exit(Run(m)) }

// Run is Main without the exit: it returns the tests' status (1 if the
// shared servers did not stop cleanly), for a TestMain that checks more
// after the tests have run.
func Run(m *testing.M) int {
	shared.mainCalled = true
	code := m.Run()
	if err := errors.Join(stopShared(), chcluster.StopShared()); err != nil {
		fmt.Fprintf(os.Stderr, "chtest: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

func stopShared() error {
	var errs []error
	if shared.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
		defer cancel()
		if err := shared.srv.Stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop shared clickhouse: %w", err))
		}
	}
	if shared.dir != "" {
		if err := os.RemoveAll(shared.dir); err != nil {
			errs = append(errs, fmt.Errorf("remove shared clickhouse dir: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Server returns the shared private server, starting it on first use. It
// returns nil when METER_TEST_CLICKHOUSE names an external server; use Addr
// for an address that works either way. Tests must not stop the shared
// server: those that stop or kill ClickHouse use StartPrivate.
func Server(t testing.TB) *devenv.ClickHouse {
	t.Helper()
	if os.Getenv(EnvAddr) != "" {
		return nil
	}
	if !shared.mainCalled {
		t.Fatal("chtest: the shared ClickHouse server needs chtest.Main: add `func TestMain(m *testing.M) { chtest.Main(m) }`")
	}
	shared.once.Do(func() {
		shared.dir, shared.err = os.MkdirTemp("", "chtest-")
		if shared.err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(t.Context(), startTimeout)
		defer cancel()
		shared.srv, shared.err = devenv.StartClickHouse(ctx, devenv.ClickHouseConfig{
			Dir:    filepath.Join(shared.dir, "clickhouse"),
			Logger: logger(),
		})
	})
	if shared.err != nil {
		failStart(t, shared.err)
	}
	return shared.srv
}

// Addr returns the native protocol address of the server tests share:
// METER_TEST_CLICKHOUSE if set, else the shared private server's.
func Addr(t testing.TB) string {
	t.Helper()
	if addr := os.Getenv(EnvAddr); addr != "" {
		return addr
	}
	return Server(t).Addr()
}

// NewDB creates a database with a fresh name on the shared server and drops
// it when the test ends. It returns the server's native address and the
// database name.
func NewDB(t testing.TB) (addr, database string) {
	t.Helper()
	addr = Addr(t)
	database = dbName(t.Name(), rand.Uint32())
	if err := execSQL(t.Context(), addr, "CREATE DATABASE "+database); err != nil {
		t.Fatalf("chtest: %v", err)
	}
	t.Cleanup(func() {
		// The test's context is done by now.
		ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
		defer cancel()
		if err := execSQL(ctx, addr, "DROP DATABASE IF EXISTS "+database); err != nil {
			t.Errorf("chtest: %v", err)
		}
	})
	return addr, database
}

// StartPrivate starts a server of the test's own, for tests that stop, kill
// or restart ClickHouse, and stops it when the test ends. It needs a local
// ClickHouse even when METER_TEST_CLICKHOUSE is set.
func StartPrivate(t testing.TB) *devenv.ClickHouse {
	t.Helper()
	return StartPrivateWith(t, devenv.ClickHouseConfig{})
}

// StartPrivateWith is StartPrivate for a server configured by cfg (users
// with passwords, a TLS port); Dir and Logger are the test's when empty.
func StartPrivateWith(t testing.TB, cfg devenv.ClickHouseConfig) *devenv.ClickHouse {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	if cfg.Logger == nil {
		cfg.Logger = logger()
	}
	ctx, cancel := context.WithTimeout(t.Context(), startTimeout)
	defer cancel()
	srv, err := devenv.StartClickHouse(ctx, cfg)
	if err != nil {
		failStart(t, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
		defer cancel()
		if err := srv.Stop(ctx); err != nil {
			t.Errorf("chtest: %v", err)
		}
	})
	return srv
}

// RequireLocal skips the test when clickhouse-server is not installed on
// this machine, except under CI=true, where it fails it: for tests that
// start servers of their own without StartPrivate (meterd --dev).
func RequireLocal(t testing.TB) {
	t.Helper()
	if _, err := devenv.FindClickHouse(); err != nil {
		notInstalled(t, err, "")
	}
}

// failStart skips the test when ClickHouse is not installed, unless
// CI=true, and fails it otherwise.
func failStart(t testing.TB, err error) {
	t.Helper()
	if !errors.Is(err, devenv.ErrNotInstalled) {
		t.Fatalf("chtest: %v", err)
	}
	notInstalled(t, err, fmt.Sprintf(" (or set %s=host:port to use a running server)", EnvAddr))
}

// notInstalled fails the test under CI=true and skips it otherwise, saying
// err and hint.
func notInstalled(t testing.TB, err error, hint string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("chtest: ClickHouse is required under CI=true: %v", err)
	}
	t.Skipf("chtest: skipping, ClickHouse is needed: %v%s", err, hint)
}

// logger reports the private servers' warnings (such as a leftover server
// being stopped) on stderr; the servers outlive the tests that start them,
// so t.Log cannot be used.
func logger() *slog.Logger {
	return logsetup.Warnings(os.Stderr)
}

func execSQL(ctx context.Context, addr, query string) error {
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{addr}, DialTimeout: 10 * time.Second})
	if err != nil {
		return fmt.Errorf("connect to clickhouse at %s: %w", addr, err)
	}
	defer conn.Close()
	if err := conn.Exec(ctx, query); err != nil {
		return fmt.Errorf("%s: %w", query, err)
	}
	return nil
}

// dbName returns a database name for the test called testName: "t_", the
// name lowercased with every run of other characters than [a-z0-9] turned
// into one underscore and cut to 40 characters, "_" and suffix in hex.
func dbName(testName string, suffix uint32) string {
	var b strings.Builder
	b.WriteString("t_")
	under := true // suppresses a leading underscore
	for _, r := range strings.ToLower(testName) {
		if b.Len() >= 2+40 {
			break
		}
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
			under = false
		} else if !under {
			b.WriteByte('_')
			under = true
		}
	}
	name := strings.TrimRight(b.String(), "_")
	return fmt.Sprintf("%s_%08x", name, suffix)
}
