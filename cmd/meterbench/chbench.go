package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/devenv"
)

// benchClickHouse is a private ClickHouse for a benchmark: a migrated store
// and a plain connection on one database.
type benchClickHouse struct {
	store *chstore.Store
	conn  driver.Conn
	pid   int    // ClickHouse's process
	addr  string // its native address
	stops []func()
}

// startClickHouse starts ClickHouse on the folder dir (a new temporary
// one, removed by close, when dir is "") and opens database db on it: the
// store without compression (loopback), conn with opts.
func startClickHouse(ctx context.Context, logger *slog.Logger, dir, db string, opts clickhouse.Options) (b *benchClickHouse, err error) {
	b = &benchClickHouse{}
	defer func() {
		if err != nil {
			b.close()
		}
	}()
	if dir == "" {
		tmp, err := os.MkdirTemp("", "meterbench-"+db+"-")
		if err != nil {
			return nil, err
		}
		b.stops = append(b.stops, func() { os.RemoveAll(tmp) })
		dir = filepath.Join(tmp, "clickhouse")
	}
	ch, err := devenv.StartClickHouse(ctx, devenv.ClickHouseConfig{Dir: dir, Logger: logger})
	if err != nil {
		return nil, err
	}
	b.stops = append(b.stops, func() { ch.Stop(context.WithoutCancel(ctx)) })
	b.pid, b.addr = ch.Pid(), ch.Addr()
	if b.store, err = chstore.Open(chstore.Config{Addr: []string{ch.Addr()}, Database: db, Compression: "none"}, logger); err != nil {
		return nil, err
	}
	b.stops = append(b.stops, func() { b.store.Close() })
	if _, err := b.store.Migrate(ctx); err != nil {
		return nil, err
	}
	opts.Addr, opts.Auth = []string{ch.Addr()}, clickhouse.Auth{Database: db}
	if b.conn, err = clickhouse.Open(&opts); err != nil {
		return nil, err
	}
	b.stops = append(b.stops, func() { b.conn.Close() })
	return b, nil
}

// close closes the connections, stops ClickHouse and removes a temporary
// folder, in that order.
func (b *benchClickHouse) close() {
	for i := len(b.stops) - 1; i >= 0; i-- {
		b.stops[i]()
	}
	b.stops = nil
}

// newFolder checks that the folder a --keep flag names does not exist yet.
func newFolder(flag, dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return fmt.Errorf("--%s %s: already exists", flag, dir)
	}
	return nil
}

// startCPUProfile writes a CPU profile to path until stop is called; with
// path "" it does nothing.
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// writeAllocProfile writes the profile of the memory allocated so far to
// path (pprof's "allocs"; read it with -sample_index=alloc_space).
func writeAllocProfile(path string, stderr io.Writer) {
	f, err := os.Create(path)
	if err == nil {
		err = pprof.Lookup("allocs").WriteTo(f, 0)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "meterbench: memory profile: %v\n", err)
	}
}

// processCPU returns the CPU time (user and system) process pid has used
// so far, and its minor page faults, from /proc (Linux only).
func processCPU(pid int) (time.Duration, int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// The fields after the command name (in parentheses, which may hold
	// spaces): minflt is the 10th, utime and stime are the 12th and 13th,
	// in clock ticks (USER_HZ, 100 on Linux).
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("%d/stat: unexpected format", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("%d/stat: unexpected format", pid)
	}
	var n [3]int64
	for j, s := range []string{f[7], f[11], f[12]} {
		if n[j], err = strconv.ParseInt(s, 10, 64); err != nil {
			return 0, 0, fmt.Errorf("%d/stat: %w", pid, err)
		}
	}
	return time.Duration(n[1]+n[2]) * 10 * time.Millisecond, n[0], nil
}

// cpuMeter measures the CPU time and minor page faults of this process
// and of ClickHouse between its calls (zero where /proc cannot be read).
type cpuMeter struct {
	pids   [2]int
	last   [2]time.Duration
	faults [2]int64
}

func newCPUMeter(chPid int) *cpuMeter {
	m := &cpuMeter{pids: [2]int{os.Getpid(), chPid}}
	m.lap()
	return m
}

// cpuLap is what this process ([0]) and ClickHouse ([1]) used in a lap.
type cpuLap struct {
	cpu    [2]time.Duration
	faults [2]int64
}

// lap returns what this process and ClickHouse used since the last call.
func (m *cpuMeter) lap() cpuLap {
	var l cpuLap
	for i, pid := range m.pids {
		if t, f, err := processCPU(pid); err == nil && pid > 0 {
			l.cpu[i], m.last[i] = t-m.last[i], t
			l.faults[i], m.faults[i] = f-m.faults[i], f
		}
	}
	return l
}
