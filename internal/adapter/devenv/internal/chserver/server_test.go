package chserver_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"tokenmeter/internal/adapter/devenv/internal/chserver"
	"tokenmeter/internal/testkit/chtest"
)

func testLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// start starts a server in dir and stops it when the test ends.
func start(t *testing.T, dir string) *chserver.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	srv, err := chserver.Start(ctx, chserver.Config{Dir: dir, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(context.Background()); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return srv
}

func execSQL(t *testing.T, addr string, queries ...string) {
	t.Helper()
	conn := open(t, addr)
	defer conn.Close()
	for _, q := range queries {
		if err := conn.Exec(context.Background(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

func count(t *testing.T, addr, table string) uint64 {
	t.Helper()
	conn := open(t, addr)
	defer conn.Close()
	var n uint64
	if err := conn.QueryRow(context.Background(), "SELECT count() FROM "+table).Scan(&n); err != nil {
		t.Fatalf("count %s: %v", table, err)
	}
	return n
}

func open(t *testing.T, addr string) clickhouse.Conn {
	t.Helper()
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{addr}})
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

func TestStartNotInstalled(t *testing.T) {
	_, err := chserver.Start(context.Background(), chserver.Config{
		Dir:    t.TempDir(),
		Binary: filepath.Join(t.TempDir(), "clickhouse-server"),
	})
	if !errors.Is(err, chserver.ErrNotInstalled) {
		t.Fatalf("got %v, want ErrNotInstalled", err)
	}
}

// TestRestartKeepsPortAndData stops the server gracefully and by SIGKILL,
// and checks that each restart on the same directory listens on the same
// port and still has the data.
func TestRestartKeepsPortAndData(t *testing.T) {
	chtest.RequireLocal(t)
	outer := t
	dir := t.TempDir()
	srv := start(t, dir)
	addr := srv.Addr()

	// The server runs with its jemalloc setting (serverEnv).
	if environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", srv.Pid())); err != nil {
		t.Errorf("server environment: %v", err)
	} else if !bytes.Contains(environ, []byte("\x00MALLOC_CONF=")) && !bytes.HasPrefix(environ, []byte("MALLOC_CONF=")) {
		t.Errorf("server environment has no MALLOC_CONF")
	}

	conn := open(t, addr)
	var one uint8
	if err := conn.QueryRow(context.Background(), "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1: got %d, %v", one, err)
	}
	conn.Close()
	execSQL(t, addr,
		"CREATE TABLE default.kept (n UInt64) ENGINE = MergeTree ORDER BY n",
		"INSERT INTO default.kept SELECT number FROM system.numbers LIMIT 1000",
	)

	restarts := []struct {
		name string
		stop func(t *testing.T, s *chserver.Server) error
		// start is what brings the server back.
		start func(t *testing.T, s *chserver.Server) *chserver.Server
	}{
		{
			name: "Stop then package Start",
			stop: func(t *testing.T, s *chserver.Server) error { return s.Stop(context.Background()) },
			start: func(_ *testing.T, _ *chserver.Server) *chserver.Server {
				return start(outer, dir) // stopped when the whole test ends
			},
		},
		{
			name: "Kill then method Start",
			stop: func(t *testing.T, s *chserver.Server) error { return s.Kill() },
			start: func(t *testing.T, s *chserver.Server) *chserver.Server {
				if err := s.Start(context.Background()); err != nil {
					t.Fatal(err)
				}
				return s
			},
		},
		{
			name: "Restart",
			stop: func(t *testing.T, s *chserver.Server) error { return nil },
			start: func(t *testing.T, s *chserver.Server) *chserver.Server {
				if err := s.Restart(context.Background()); err != nil {
					t.Fatal(err)
				}
				return s
			},
		},
	}
	for _, r := range restarts {
		t.Run(r.name, func(t *testing.T) {
			if err := r.stop(t, srv); err != nil {
				t.Fatal(err)
			}
			srv = r.start(t, srv)
			if got := srv.Addr(); got != addr {
				t.Errorf("got addr %s after restart, want %s", got, addr)
			}
			if got := count(t, srv.Addr(), "default.kept"); got != 1000 {
				t.Errorf("got %d rows after restart, want 1000", got)
			}
		})
	}
}

// TestStartStopsLeftover starts a second server on a directory whose first
// server is still running, as after meterd --dev was killed with SIGKILL:
// the leftover is found through the pid file or ClickHouse's status file and
// stopped.
func TestStartStopsLeftover(t *testing.T) {
	chtest.RequireLocal(t)
	tests := []struct {
		name   string
		remove string // file removed before the second start
	}{
		{name: "pid file"},
		{name: "status file only", remove: "clickhouse.pid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			first := start(t, dir)
			pid := readPID(t, filepath.Join(dir, "clickhouse.pid"))
			if tt.remove != "" {
				if err := os.Remove(filepath.Join(dir, tt.remove)); err != nil {
					t.Fatal(err)
				}
			}
			second := start(t, dir)
			if chserver.ProcessAlive(pid) {
				t.Errorf("leftover pid %d still running", pid)
			}
			if second.Addr() != first.Addr() {
				t.Errorf("got addr %s, want %s", second.Addr(), first.Addr())
			}
			if got := count(t, second.Addr(), "system.one"); got != 1 {
				t.Errorf("got %d rows in system.one, want 1", got)
			}
		})
	}
}

func readPID(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(string(b[:len(b)-1]))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// TestStartPortTaken checks that a server that cannot bind its port fails
// Start promptly instead of waiting for the start timeout, and leaves no
// process behind.
func TestStartPortTaken(t *testing.T) {
	chtest.RequireLocal(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	begin := time.Now()
	srv, err := chserver.Start(ctx, chserver.Config{
		Dir:          dir,
		TCPPort:      l.Addr().(*net.TCPAddr).Port,
		Logger:       testLogger(),
		StartTimeout: 60 * time.Second,
	})
	if err == nil {
		srv.Stop(context.Background())
		t.Fatal("Start succeeded on a taken port")
	}
	t.Log(err)
	if d := time.Since(begin); d > 30*time.Second {
		t.Errorf("Start took %v to fail, want it to notice the exit", d)
	}
	if _, err := os.Stat(filepath.Join(dir, "clickhouse.pid")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pid file: got %v, want it removed", err)
	}
}

// helperDirEnv tells a re-executed test binary to act as a parent that
// starts a server in that directory and then waits to be killed.
const helperDirEnv = "CHSERVER_TEST_PARENT_DIR"

// TestParentKilled kills the process that started a server with SIGKILL, as
// happens to a meterd --dev, and starts a server on the same directory again:
// it must come up on the same port with the data, and the orphan must be
// gone.
func TestParentKilled(t *testing.T) {
	if dir := os.Getenv(helperDirEnv); dir != "" {
		srv, err := chserver.Start(context.Background(), chserver.Config{Dir: dir})
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println(srv.Addr())
		select {} // until killed
	}
	chtest.RequireLocal(t)
	dir := t.TempDir()
	cmd := osexec.Command(os.Args[0], "-test.run=^TestParentKilled$")
	cmd.Env = append(os.Environ(), helperDirEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("parent: %v", err)
	}
	addr := strings.TrimSpace(line)
	pid := readPID(t, filepath.Join(dir, "clickhouse.pid"))
	execSQL(t, addr,
		"CREATE TABLE default.kept (n UInt64) ENGINE = MergeTree ORDER BY n",
		"INSERT INTO default.kept SELECT number FROM system.numbers LIMIT 100",
	)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()

	srv := start(t, dir)
	if srv.Addr() != addr {
		t.Errorf("got addr %s after the parent died, want %s", srv.Addr(), addr)
	}
	if chserver.ProcessAlive(pid) {
		t.Errorf("orphaned pid %d still running", pid)
	}
	if got := count(t, srv.Addr(), "default.kept"); got != 100 {
		t.Errorf("got %d rows, want 100", got)
	}
}

func Example() {
	ctx := context.Background()
	srv, err := chserver.Start(ctx, chserver.Config{Dir: "/tmp/meter-dev/clickhouse"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Stop(ctx)
	fmt.Println("ClickHouse at", srv.Addr())
}

// TestInactivePartsDeleted checks what keeps a dev data directory small:
// the parts that a merge replaced leave the disk within seconds, not the
// 8 minutes of ClickHouse's default or the 30 s this package had (with
// which a make run demo's directory reached 1 GB in 2,500 part folders).
// Thirty one-row INSERTs into a wide table make thirty parts, OPTIMIZE
// replaces them by one, and a trickle of INSERTs keeps the table's
// background task running as the rollup job does while events arrive;
// the thirty part folders must be gone within 20 s. The server is a Lean
// one, as meterd --dev starts it.
func TestInactivePartsDeleted(t *testing.T) {
	chtest.RequireLocal(t)
	ctx := context.Background()
	dir := t.TempDir()
	srv, err := chserver.Start(ctx, chserver.Config{Dir: dir, Logger: testLogger(), Lean: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(context.Background()); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", srv.Pid()))
	if err != nil {
		t.Fatalf("server environment: %v", err)
	}
	if !bytes.Contains(environ, []byte("MALLOC_CONF=background_thread:true")) && os.Getenv("MALLOC_CONF") == "" {
		t.Errorf("a Lean server runs without jemalloc's background thread: %q", environ)
	}

	cols := make([]string, 40)
	for i := range cols {
		cols[i] = fmt.Sprintf("c%d UInt64", i)
	}
	execSQL(t, srv.Addr(), "CREATE TABLE default.wide (k UInt64, "+strings.Join(cols, ", ")+") ENGINE = MergeTree ORDER BY k")
	conn := open(t, srv.Addr())
	defer conn.Close()
	for i := range 30 {
		if err := conn.Exec(ctx, fmt.Sprintf("INSERT INTO default.wide (k) SELECT %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := conn.Query(ctx, "SELECT name FROM system.parts WHERE database = 'default' AND table = 'wide'")
	if err != nil {
		t.Fatal(err)
	}
	var replaced []string // every part so far, active or already merged
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		replaced = append(replaced, name)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(replaced) < 2 {
		t.Fatalf("got %d parts after 30 INSERTs, want several", len(replaced))
	}
	if err := conn.Exec(ctx, "OPTIMIZE TABLE default.wide FINAL"); err != nil {
		t.Fatal(err)
	}

	tableDir := filepath.Join(dir, "data", "data", "default", "wide")
	left := func() []string {
		var on []string
		for _, name := range replaced {
			if _, err := os.Stat(filepath.Join(tableDir, name)); err == nil {
				on = append(on, name)
			}
		}
		return on
	}
	deadline := time.Now().Add(20 * time.Second)
	for k := 1000; len(left()) > 0; k++ {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d replaced part folders still in %s after 20 s: %v", len(left()), len(replaced), tableDir, left())
		}
		if err := conn.Exec(ctx, fmt.Sprintf("INSERT INTO default.wide (k) SELECT %d", k)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(250 * time.Millisecond)
	}
	if got := count(t, srv.Addr(), "default.wide"); got < 30 {
		t.Errorf("got %d rows, want at least 30", got)
	}
}

// TestMergedPartsZSTD: the tests' and benchmarks' servers (not Lean) write
// INSERTed parts and small merged ones with LZ4 and merged parts of 10 MiB
// or more with ZSTD (docs/operations.md, "ClickHouse settings for
// production"). The method is the byte after the 16-byte checksum of a
// column file's first compressed block: 0x82 LZ4, 0x90 ZSTD.
func TestMergedPartsZSTD(t *testing.T) {
	chtest.RequireLocal(t)
	ctx := context.Background()
	dir := t.TempDir()
	srv := start(t, dir)
	conn := open(t, srv.Addr())
	defer conn.Close()
	// method reads the newest active part's compression method. A part
	// that a merge retired (and removed) between the query and the read is
	// looked up again.
	method := func(table string) byte {
		t.Helper()
		for try := 0; ; try++ {
			var part string
			if err := conn.QueryRow(ctx, "SELECT name FROM system.parts WHERE active AND database = 'default' AND table = ? ORDER BY modification_time DESC, name DESC LIMIT 1", table).Scan(&part); err != nil {
				t.Fatalf("active part of %s: %v", table, err)
			}
			f, err := os.Open(filepath.Join(dir, "data", "data", "default", table, part, "v.bin"))
			if errors.Is(err, fs.ErrNotExist) && try < 10 {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			head := make([]byte, 17)
			if _, err := io.ReadFull(f, head); err != nil {
				t.Fatal(err)
			}
			return head[16]
		}
	}
	const lz4, zstd = 0x82, 0x90
	// v is 8 incompressible bytes a row: two INSERTs of 1M rows make two
	// parts of 8 MB each, merged into one of 16 MB.
	for _, tt := range []struct {
		table      string
		rows       int
		wantMerged byte
	}{
		{"big", 1_000_000, zstd},
		{"small", 1_000, lz4},
	} {
		execSQL(t, srv.Addr(), "CREATE TABLE default."+tt.table+" (k UInt64, v UInt64) ENGINE = MergeTree ORDER BY k")
		// No background merge while the INSERTed parts are checked: on a
		// slow machine one could merge the two parts before the second
		// check, which would then read the merged part.
		execSQL(t, srv.Addr(), "SYSTEM STOP MERGES default."+tt.table)
		parts := "system.parts WHERE active AND database = 'default' AND table = '" + tt.table + "'"
		for i := range 2 {
			execSQL(t, srv.Addr(), fmt.Sprintf("INSERT INTO default.%s (k, v) SELECT number, sipHash64(number) FROM system.numbers LIMIT %d OFFSET %d", tt.table, tt.rows, i*tt.rows))
			if n := count(t, srv.Addr(), parts); n != uint64(i+1) {
				t.Fatalf("%s: %d active parts after %d INSERTs with merges stopped, want %d", tt.table, n, i+1, i+1)
			}
			if got := method(tt.table); got != lz4 {
				t.Errorf("%s: INSERTed part compressed with method 0x%x, want LZ4 (0x%x)", tt.table, got, lz4)
			}
		}
		// STOP MERGES blocks OPTIMIZE too. Once merges run again a
		// background merge may take the parts first, and OPTIMIZE then does
		// nothing: wait for the single part, asking again meanwhile.
		execSQL(t, srv.Addr(), "SYSTEM START MERGES default."+tt.table)
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
			execSQL(t, srv.Addr(), "OPTIMIZE TABLE default."+tt.table+" FINAL")
			n := count(t, srv.Addr(), parts)
			if n == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d active parts 2 min after OPTIMIZE FINAL, want 1", tt.table, n)
			}
		}
		if got := method(tt.table); got != tt.wantMerged {
			t.Errorf("%s: merged part compressed with method 0x%x, want 0x%x", tt.table, got, tt.wantMerged)
		}
	}
}
