package chserver_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"tokenmeter/internal/adapter/devenv/internal/chserver"
	"tokenmeter/internal/testkit/chtest"
)

// syncBuffer is a log sink the test reads while the server logs.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// crash kills the server's process from outside, as the OOM killer would,
// and waits until it runs again (another pid) and answers with its data.
func crash(t *testing.T, srv *chserver.Server, logs *syncBuffer) {
	t.Helper()
	pid := srv.Pid()
	if pid == 0 {
		t.Fatal("server not running")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for p := srv.Pid(); p == 0 || p == pid; p = srv.Pid() {
		if time.Now().After(deadline) {
			t.Fatalf("server not restarted 90s after pid %d was killed; logs:\n%s", pid, logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := count(t, srv.Addr(), "default.kept"); got != 1000 {
		t.Errorf("got %d rows after the restart, want 1000", got)
	}
}

// TestSuperviseRestarts kills the supervised server twice and checks that
// it comes back each time on the same port with its data, that each exit is
// logged at ERROR with its status, and that a Stop, or a crash once
// supervision has ended, is not followed by a restart.
func TestSuperviseRestarts(t *testing.T) {
	chtest.RequireLocal(t)
	logs := &syncBuffer{}
	// Each step gets its own time: on a slow machine one deadline for the
	// whole test ran out before its last start.
	step := func() context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		t.Cleanup(cancel)
		return ctx
	}
	srv, err := chserver.Start(step(), chserver.Config{Dir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop(context.Background()) })
	addr := srv.Addr()
	execSQL(t, addr,
		"CREATE TABLE default.kept (n UInt64) ENGINE = MergeTree ORDER BY n",
		"INSERT INTO default.kept SELECT number FROM system.numbers LIMIT 1000",
	)

	sctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Supervise(sctx, chserver.Backoff{Min: 100 * time.Millisecond, Max: time.Second})
	}()
	defer func() { stop(); <-done }()

	crash(t, srv, logs)
	crash(t, srv, logs)
	if srv.Addr() != addr {
		t.Errorf("got addr %s after restarts, want %s", srv.Addr(), addr)
	}
	if got := strings.Count(logs.String(), `level=ERROR msg="ClickHouse exited unexpectedly; restarting it"`); got != 2 {
		t.Errorf("got %d exits logged at ERROR, want 2; logs:\n%s", got, logs)
	}
	if !strings.Contains(logs.String(), `status="signal: killed"`) {
		t.Errorf("exit status not logged; logs:\n%s", logs)
	}

	// Stopped on purpose: it stays stopped.
	if err := srv.Stop(step()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if pid := srv.Pid(); pid != 0 {
		t.Fatalf("server restarted (pid %d) after Stop", pid)
	}
	// Started again, it is watched again.
	if err := srv.Start(step()); err != nil {
		t.Fatal(err)
	}
	crash(t, srv, logs)

	// Supervision ended: a crash stays a crash.
	stop()
	<-done
	pid := srv.Pid()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if got := srv.Pid(); got != 0 {
		t.Errorf("server restarted (pid %d) after Supervise returned", got)
	}
}
