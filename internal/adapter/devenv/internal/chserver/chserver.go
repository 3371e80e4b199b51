// Package chserver runs a private ClickHouse server process on loopback, for
// meterd --dev and for tests that need a real ClickHouse.
//
// A server owns one directory: the config file it writes there on every
// start, the data, the logs (log/server.log, log/err.log, and the process's
// own output in log/stdout.log), the ports it picked (ports.json) and a pid
// file (clickhouse.pid). Starting again on the same directory gets the same
// ports and the same data, and first stops a server that an earlier, killed
// run left behind.
//
// The package does not create databases or tables (chstore does), does not
// manage external servers, and does not install ClickHouse: when no binary
// is found, Start and FindBinary return an error wrapping ErrNotInstalled.
package chserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"tokenmeter/internal/childproc"

	"github.com/ClickHouse/clickhouse-go/v2"
)

const (
	// defaultStartTimeout bounds a start. ClickHouse loads every part of
	// its data directory before it answers: thousands of parts (a data
	// directory that lived through merges falling behind) took over 60 s.
	// While it loads, the wait logs its progress every startProgressEvery.
	defaultStartTimeout = 5 * time.Minute
	startProgressEvery  = 15 * time.Second
	// stopGrace is how long Stop, and Start for a leftover server, wait after
	// SIGTERM before sending SIGKILL.
	stopGrace = 20 * time.Second
	// portAttempts bounds the retries when freshly picked ports turn out to
	// be taken by the time ClickHouse binds them.
	portAttempts = 3
	// logTailBytes is how much of the logs a startup error quotes.
	logTailBytes = 4 << 10
)

// Config configures a private server.
type Config struct {
	// Dir holds the server's config, data and logs. It is created if
	// missing. Required.
	Dir string
	// Binary is the server binary: clickhouse-server, or the multi-tool
	// clickhouse binary (run with the server subcommand). Empty means
	// whatever FindBinary finds.
	Binary string
	// TCPPort is the native protocol port on 127.0.0.1, and HTTPPort the HTTP
	// one. Zero picks a free port the first time and persists it in Dir, so
	// that later starts on the same Dir reuse it.
	TCPPort, HTTPPort int
	// Logger receives start and stop events. Nil discards them.
	Logger *slog.Logger
	// StartTimeout bounds how long Start waits for the server to answer.
	// Zero means 5 minutes.
	StartTimeout time.Duration
	// Users are users with passwords, besides the password-less "default".
	Users []User
	// TLS, when set, opens a native protocol port with TLS too (SecureAddr),
	// on a free port picked at each Start.
	TLS *TLS
	// Lean sizes the server for a laptop, as meterd --dev runs it: its
	// jemalloc hands freed memory back to the kernel within a second
	// (leanMallocConf) and its mark cache is 64 MiB. Without it the server
	// keeps freed memory for five minutes (mallocConf), which makes the
	// tests' and benchmarks' loads and rollups faster and its idle memory
	// what the last minutes needed: 1-3 GB after a make run demo, 200-300 MB
	// lean.
	Lean bool
}

// Server is a private ClickHouse server process. Its methods are safe for
// concurrent use.
type Server struct {
	cfg    Config // Dir absolute, Binary resolved, defaults applied
	layout layout
	ports  ports
	logger *slog.Logger

	mu      sync.Mutex
	proc    *process      // nil when not started, stopped or killed
	started chan struct{} // closed, and replaced, when a start succeeds
}

// process is one run of the server binary.
type process struct {
	*childproc.Proc
	marks   logMarks  // the logs' sizes before this run
	readyAt time.Time // when it first answered
}

// Start starts a server in cfg.Dir and returns once it answers on its native
// port. ctx bounds only the startup: the server runs until Stop or Kill (or,
// on Linux, until this process dies). A server that an earlier run left
// running on the same Dir is stopped first.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Dir == "" {
		return nil, errors.New("start clickhouse: config: Dir is required")
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("start clickhouse: resolve dir: %w", err)
	}
	cfg.Dir = dir
	if cfg.Binary, err = resolveBinary(cfg.Binary); err != nil {
		return nil, fmt.Errorf("start clickhouse: %w", err)
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = defaultStartTimeout
	}
	if cfg.TLS != nil {
		// The server runs in its directory: make the paths absolute.
		t := *cfg.TLS
		if t.CertFile, err = filepath.Abs(t.CertFile); err != nil {
			return nil, fmt.Errorf("start clickhouse: %w", err)
		}
		if t.KeyFile, err = filepath.Abs(t.KeyFile); err != nil {
			return nil, fmt.Errorf("start clickhouse: %w", err)
		}
		cfg.TLS = &t
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	l := layout{dir: dir}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("start clickhouse: %w", err)
	}
	want := ports{TCP: cfg.TCPPort, HTTP: cfg.HTTPPort}
	p, fresh, err := resolvePorts(l, want)
	if err != nil {
		return nil, fmt.Errorf("start clickhouse: %w", err)
	}
	if cfg.TLS != nil {
		if p.TCPSecure, err = freePort(p.TCP, p.HTTP); err != nil {
			return nil, fmt.Errorf("start clickhouse: %w", err)
		}
	}
	s := &Server{cfg: cfg, layout: l, ports: p, logger: logger.With("component", "clickhouse"), started: make(chan struct{})}
	for attempt := 1; ; attempt++ {
		err = s.Start(ctx)
		if err == nil || !fresh || attempt == portAttempts || !clashOnPicked(err, want, s.ports) {
			break
		}
		s.logger.Warn("freshly picked port taken; picking others", "tcp_port", s.ports.TCP, "http_port", s.ports.HTTP)
		secure := s.ports.TCPSecure
		if s.ports, err = repickPorts(l, want, s.ports); err != nil {
			return nil, fmt.Errorf("start clickhouse: %w", err)
		}
		s.ports.TCPSecure = secure
	}
	if err != nil {
		return nil, err
	}
	return s, nil
}

// Start starts the server again after Stop or Kill, with the same ports and
// data. It fails if the server is running.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil && !s.proc.Exited() {
		return fmt.Errorf("start clickhouse in %s: %w as pid %d", s.cfg.Dir, errRunning, s.proc.Pid)
	}
	s.proc = nil
	if err := stopLeftover(ctx, s.logger, s.layout, stopGrace); err != nil {
		return fmt.Errorf("start clickhouse in %s: %w", s.cfg.Dir, err)
	}
	if err := s.writeConfig(); err != nil {
		return fmt.Errorf("start clickhouse in %s: %w", s.cfg.Dir, err)
	}
	marks := s.logMarks()
	p, err := s.spawn()
	if err != nil {
		return fmt.Errorf("start clickhouse in %s: %w", s.cfg.Dir, err)
	}
	if err := s.waitReady(ctx, p, marks); err != nil {
		_ = kill(p) // startup failed; the error that matters is err
		removePIDFile(s.layout.pidFile(), p.Pid)
		return fmt.Errorf("start clickhouse in %s: %w", s.cfg.Dir, err)
	}
	p.marks, p.readyAt = marks, time.Now()
	s.proc = p
	close(s.started)
	s.started = make(chan struct{})
	s.logger.Info("ClickHouse started", "addr", s.Addr(), "http_addr", s.HTTPAddr(), "pid", p.Pid, "dir", s.cfg.Dir)
	return nil
}

// Restart stops the server and starts it again with the same ports and data.
func (s *Server) Restart(ctx context.Context) error {
	if err := s.Stop(ctx); err != nil {
		return err
	}
	return s.Start(ctx)
}

// Stop stops the server: SIGTERM, then SIGKILL if it has not exited after
// 20s or when ctx is done. Stopping a server that is not running is a no-op.
func (s *Server) Stop(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.proc
	if p == nil {
		return nil
	}
	s.proc = nil
	defer removePIDFile(s.layout.pidFile(), p.Pid)
	if p.Exited() {
		s.logger.Warn("ClickHouse had already exited", "pid", p.Pid, "status", p.Err())
		return nil
	}
	if err := signalServer(p.Pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("stop clickhouse: %w", err)
	}
	t := time.NewTimer(stopGrace)
	defer t.Stop()
	select {
	case <-p.Done():
		s.logger.Info("ClickHouse stopped", "pid", p.Pid)
		return nil
	case <-ctx.Done():
	case <-t.C:
	}
	s.logger.Warn("ClickHouse did not stop in time; killing it", "pid", p.Pid)
	if err := kill(p); err != nil {
		return fmt.Errorf("stop clickhouse: %w", err)
	}
	return nil
}

// Kill kills the server with SIGKILL, as a crash would, and waits for it to
// exit. Start brings it back on the same data.
func (s *Server) Kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.proc
	if p == nil {
		return nil
	}
	s.proc = nil
	defer removePIDFile(s.layout.pidFile(), p.Pid)
	if err := kill(p); err != nil {
		return fmt.Errorf("kill clickhouse: %w", err)
	}
	return nil
}

// Addr returns the native protocol address, "127.0.0.1:PORT".
func (s *Server) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.ports.TCP))
}

// SecureAddr returns the address of the native protocol over TLS,
// "127.0.0.1:PORT", or "" without Config.TLS.
func (s *Server) SecureAddr() string {
	if s.ports.TCPSecure == 0 {
		return ""
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.ports.TCPSecure))
}

// HTTPAddr returns the HTTP interface address, "127.0.0.1:PORT".
func (s *Server) HTTPAddr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.ports.HTTP))
}

// Pid returns the server's process id, or 0 when it is not running.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil || s.proc.Exited() {
		return 0
	}
	return s.proc.Pid
}

// Dir returns the server directory as an absolute path.
func (s *Server) Dir() string { return s.cfg.Dir }

func (s *Server) writeConfig() error {
	for _, d := range s.layout.dirs() {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create server dirs: %w", err)
		}
	}
	b, err := configXML(s.cfg.Dir, s.ports, security{users: s.cfg.Users, tls: s.cfg.TLS}, s.cfg.Lean)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(s.layout.config(), b); err != nil {
		return fmt.Errorf("write config: %w", err)
	}
	return nil
}

// mallocConf is the server's jemalloc configuration unless MALLOC_CONF is
// set. The rollup job rewrites the current hour every 10 s, and with
// jemalloc's defaults ClickHouse got fresh memory from the kernel for its
// INSERT buffers on every run and took it page by page (on the development
// VM a page fault costs ~18 µs): 50–70 thousand faults per warm rollup of
// an hour of 1M events (perf, Debian's 18.16, which links the system
// jemalloc 5.3). Two settings keep that memory, at the cost of idle memory
// that stays at what the last minutes' queries needed:
//   - oversize_threshold:0: allocations of 8 MiB and more no longer come
//     from jemalloc's dedicated arena, which hands freed pages back at
//     once whatever the decay. Faults per warm run fell to 5–40 thousand,
//     the minute-row INSERTs' CPU by half, and warm rollups took 1.3–1.7 s
//     instead of 1.9–2.4 s (interleaved runs of make bench-hour).
//   - dirty_decay_ms, muzzy_decay_ms: freed pages go back to the kernel
//     over five minutes instead of 10 s. Against one minute (with the
//     threshold), warm runs took 1.42 and 1.43 s against 1.62 and 1.60 s
//     (means of two interleaved pairs); against 10 s (without it),
//     one minute had made them 11–13% faster.
const mallocConf = "dirty_decay_ms:300000,muzzy_decay_ms:300000,oversize_threshold:0"

// leanMallocConf is the jemalloc configuration of a Lean server: freed
// pages go back to the kernel after 1 s, by jemalloc's background thread
// (without it they go back only when the arena that freed them allocates
// again). With mallocConf the dev server of a make run demo reached 1 GB
// RSS and stayed there; with this, 400-520 MB at its peak, 150 MB once the demo
// settles (scripts/measure-demo.sh, the demo test's footprint).
const leanMallocConf = "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0"

// serverEnv is the server's environment, from environ (ours): MALLOC_CONF
// is conf unless environ sets it.
func serverEnv(environ []string, conf string) []string {
	env := slices.Clone(environ)
	if !slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "MALLOC_CONF=") }) {
		env = append(env, "MALLOC_CONF="+conf)
	}
	// Current releases may fork a watchdog parent; keep the server itself
	// our direct child so that its exit is seen and its pid is the one
	// signalled.
	return append(env, "CLICKHOUSE_WATCHDOG_ENABLE=0")
}

// spawn starts the server binary and records its pid.
func (s *Server) spawn() (*process, error) {
	out, err := os.OpenFile(s.layout.stdoutLog(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open output log: %w", err)
	}
	cmd := exec.Command(s.cfg.Binary, serverArgs(s.cfg.Binary, s.layout.config())...)
	cmd.Dir = s.cfg.Dir
	conf := mallocConf
	if s.cfg.Lean {
		conf = leanMallocConf
	}
	cmd.Env = serverEnv(os.Environ(), conf)
	cmd.Stdout, cmd.Stderr = out, out
	fmt.Fprintf(out, "--- %s: %s\n", time.Now().Format(time.RFC3339), strings.Join(cmd.Args, " "))

	// SIGTERM when this process dies: a SIGKILLed meterd or test binary
	// leaves no server running (on Linux; elsewhere the next Start on the
	// directory stops it).
	cp, err := childproc.Start(cmd, out, syscall.SIGTERM)
	if err != nil {
		return nil, fmt.Errorf("run %s: %w", s.cfg.Binary, err)
	}
	p := &process{Proc: cp}
	if err := writePIDFile(s.layout.pidFile(), p.Pid); err != nil {
		_ = kill(p) // without a pid file a later run could not find it
		return nil, err
	}
	return p, nil
}

// kill sends SIGKILL to p's process group and waits for it to be reaped.
func kill(p *process) error {
	if p.Exited() {
		return nil
	}
	if err := signalServer(p.Pid, syscall.SIGKILL); err != nil {
		return err
	}
	select {
	case <-p.Done():
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("pid %d still running 10s after SIGKILL", p.Pid)
	}
}

// waitReady waits until the server answers a ping on its native port, the
// process exits, StartTimeout passes or ctx is done.
func (s *Server) waitReady(ctx context.Context, p *process, marks logMarks) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StartTimeout)
	defer cancel()
	conn, err := clickhouse.Open(&clickhouse.Options{
		Addr:         []string{s.Addr()},
		DialTimeout:  time.Second,
		MaxOpenConns: 1,
	})
	if err != nil {
		return fmt.Errorf("open client: %w", err)
	}
	defer conn.Close()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	began := time.Now()
	progress := began.Add(startProgressEvery)
	var lastErr error
	for {
		if time.Now().After(progress) {
			s.logger.Info("ClickHouse still starting (it loads every data part before it answers)",
				"waited", time.Since(began).Round(time.Second), "limit", s.cfg.StartTimeout, "pid", p.Pid)
			progress = progress.Add(startProgressEvery)
		}
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		lastErr = conn.Ping(pctx)
		pcancel()
		if lastErr == nil {
			return nil
		}
		select {
		case <-p.Done():
			return &exitError{status: p.Err(), logs: s.logTail(marks)}
		case <-ctx.Done():
			return fmt.Errorf("not answering on %s after %v (last ping: %v; logs: %s): %w",
				s.Addr(), s.cfg.StartTimeout, lastErr, s.logTail(marks), ctx.Err())
		case <-t.C:
		}
	}
}

// exitError reports that the server exited during startup.
type exitError struct {
	status error  // the process's exit status
	logs   string // what it logged during this start
}

func (e *exitError) Error() string {
	return fmt.Sprintf("server exited during startup (%v); its logs end with:\n%s", e.status, e.logs)
}

// clashOnPicked reports whether err says the server exited because one of
// the ports picked for it (rather than asked for in want) was taken.
func clashOnPicked(err error, want, got ports) bool {
	var ee *exitError
	if !errors.As(err, &ee) || !strings.Contains(ee.logs, "Address already in use") {
		return false
	}
	// 18.x and current releases alike end the message with the address.
	for _, pp := range []struct{ want, got int }{{want.TCP, got.TCP}, {want.HTTP, got.HTTP}} {
		if pp.want == 0 && strings.Contains(ee.logs, "127.0.0.1:"+strconv.Itoa(pp.got)) {
			return true
		}
	}
	return false
}

// logMarks are the sizes of the logs before a start, so that a startup error
// quotes only what that start wrote.
type logMarks struct {
	errLog, stdoutLog int64
}

func (s *Server) logMarks() logMarks {
	return logMarks{errLog: fileSize(s.layout.errLog()), stdoutLog: fileSize(s.layout.stdoutLog())}
}

// logTail returns the end of what the error log and the process output got
// since marks were taken.
func (s *Server) logTail(marks logMarks) string {
	var b strings.Builder
	for _, f := range []struct {
		path string
		from int64
	}{{s.layout.errLog(), marks.errLog}, {s.layout.stdoutLog(), marks.stdoutLog}} {
		tail := readTail(f.path, f.from, logTailBytes)
		if strings.TrimSpace(tail) == "" {
			continue
		}
		fmt.Fprintf(&b, "==> %s <==\n%s\n", f.path, strings.TrimRight(tail, "\n"))
	}
	if b.Len() == 0 {
		return "(nothing logged; see " + s.layout.logDir() + ")"
	}
	return b.String()
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// readTail returns at most n bytes from the end of path, starting no earlier
// than offset from. A log rotated since from is read from its start.
func readTail(path string, from, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	size := fileSize(path)
	if from > size {
		from = 0
	}
	if size-from > n {
		from = size - n
	}
	b := make([]byte, size-from)
	k, _ := f.ReadAt(b, from)
	return string(b[:k])
}
