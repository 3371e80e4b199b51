// Package chserver runs a private ClickHouse server process from the
// clickhouse-server binary: a generated config, data and logs in one
// directory, loopback ports that stay the same across restarts. meterd --dev
// and the tests use it; production points at a real ClickHouse deployment.
package chserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
)

// ErrNotInstalled means no ClickHouse server binary was found.
var ErrNotInstalled = errors.New("clickhouse-server not installed (Debian/Ubuntu: apt-get install -y clickhouse-server clickhouse-client), or point tokenmeter at an existing server")

// Config describes a private server.
type Config struct {
	// Dir holds config, data, logs and the pid file.
	Dir string
	// Binary is the server executable; default FindBinary().
	Binary string
	// TCPPort and HTTPPort are the loopback ports; 0 picks free ones, which
	// are kept in Dir/ports.json so that a restart reuses them.
	TCPPort, HTTPPort int
	// StartTimeout bounds the wait for the server to answer. Default 60s.
	StartTimeout time.Duration
	Logger       *slog.Logger
}

// Server is a running ClickHouse server process.
type Server struct {
	cfg  Config
	cmd  *exec.Cmd
	done chan struct{}
}

// FindBinary looks for clickhouse-server on the PATH and in the usual places,
// then for the single `clickhouse` binary (run as `clickhouse server`).
func FindBinary() (string, error) {
	for _, name := range []string{"clickhouse-server", "/usr/sbin/clickhouse-server", "/usr/bin/clickhouse-server", "clickhouse", "/usr/bin/clickhouse"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", ErrNotInstalled
}

type ports struct {
	TCP  int `json:"tcp"`
	HTTP int `json:"http"`
}

// Start starts the server and waits until it answers a query. A server left
// running from an earlier process on the same Dir is stopped first.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Dir == "" {
		return nil, errors.New("chserver: no directory")
	}
	if cfg.Binary == "" {
		bin, err := FindBinary()
		if err != nil {
			return nil, err
		}
		cfg.Binary = bin
	}
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = 60 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("chserver: %w", err)
	}
	cfg.Dir = dir
	for _, d := range []string{"data", "tmp", "user_files", "format_schemas", "log"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("chserver: %w", err)
		}
	}
	if err := cfg.loadPorts(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg}
	s.stopStale()
	if err := os.WriteFile(s.path("config.xml"), []byte(s.configXML()), 0o644); err != nil {
		return nil, fmt.Errorf("chserver: write config: %w", err)
	}
	if err := s.Start(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

func (c *Config) loadPorts() error {
	path := filepath.Join(c.Dir, "ports.json")
	var p ports
	if b, err := os.ReadFile(path); err == nil {
		if err := json.Unmarshal(b, &p); err != nil {
			return fmt.Errorf("chserver: %s: %w", path, err)
		}
	}
	if c.TCPPort == 0 {
		c.TCPPort = p.TCP
	}
	if c.HTTPPort == 0 {
		c.HTTPPort = p.HTTP
	}
	var err error
	if c.TCPPort == 0 {
		if c.TCPPort, err = freePort(); err != nil {
			return err
		}
	}
	if c.HTTPPort == 0 {
		if c.HTTPPort, err = freePort(); err != nil {
			return err
		}
	}
	b, _ := json.Marshal(ports{TCP: c.TCPPort, HTTP: c.HTTPPort})
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("chserver: %w", err)
	}
	return nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("chserver: pick a port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) path(name string) string { return filepath.Join(s.cfg.Dir, name) }

// configXML is the smallest configuration 18.16 and current releases accept:
// loopback only, one passwordless default user.
func (s *Server) configXML() string {
	d := s.cfg.Dir
	return fmt.Sprintf(`<?xml version="1.0"?>
<yandex>
  <logger><level>warning</level><log>%[1]s/log/server.log</log><errorlog>%[1]s/log/err.log</errorlog><console>0</console></logger>
  <listen_host>127.0.0.1</listen_host>
  <tcp_port>%[2]d</tcp_port>
  <http_port>%[3]d</http_port>
  <path>%[1]s/data/</path>
  <tmp_path>%[1]s/tmp/</tmp_path>
  <user_files_path>%[1]s/user_files/</user_files_path>
  <format_schema_path>%[1]s/format_schemas/</format_schema_path>
  <mark_cache_size>268435456</mark_cache_size>
  <max_concurrent_queries>100</max_concurrent_queries>
  <users>
    <default>
      <password></password>
      <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
      <profile>default</profile>
      <quota>default</quota>
    </default>
  </users>
  <profiles><default></default></profiles>
  <quotas><default></default></quotas>
  <default_profile>default</default_profile>
  <default_database>default</default_database>
</yandex>
`, d, s.cfg.TCPPort, s.cfg.HTTPPort)
}

// stopStale kills a server an earlier process started on this Dir and left
// behind (the parent was killed), so that its ports and data lock are free.
func (s *Server) stopStale() {
	b, err := os.ReadFile(s.path("clickhouse.pid"))
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return
	}
	if !isClickHouse(pid) {
		return
	}
	s.cfg.Logger.Warn("stopping a ClickHouse server left running on this data dir", "pid", pid)
	_ = syscall.Kill(pid, syscall.SIGTERM)
	for i := 0; i < 200 && alive(pid); i++ {
		time.Sleep(100 * time.Millisecond)
	}
	if alive(pid) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		for i := 0; i < 50 && alive(pid); i++ {
			time.Sleep(100 * time.Millisecond)
		}
	}
}

func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	// A zombie child of ours is dead for our purposes.
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(fields) == 0 || fields[0] != "Z"
}

func isClickHouse(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(b), "clickhouse")
}

// Start (re)starts the process of a stopped Server with the same ports and data.
func (s *Server) Start(ctx context.Context) error {
	args := []string{"--config-file=" + s.path("config.xml")}
	if filepath.Base(s.cfg.Binary) == "clickhouse" {
		args = append([]string{"server"}, args...)
	}
	logf, err := os.OpenFile(s.path("log/stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("chserver: %w", err)
	}
	cmd := exec.Command(s.cfg.Binary, args...)
	cmd.Dir = s.cfg.Dir
	cmd.Stdout, cmd.Stderr = logf, logf
	// Own process group: a Ctrl-C to the parent's terminal does not reach it
	// first, and the parent stops it in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("chserver: start %s: %w", s.cfg.Binary, err)
	}
	logf.Close()
	s.cmd = cmd
	s.done = make(chan struct{})
	go func() { cmd.Wait(); close(s.done) }()
	if err := os.WriteFile(s.path("clickhouse.pid"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		s.Kill()
		return fmt.Errorf("chserver: %w", err)
	}
	if err := s.waitReady(ctx); err != nil {
		s.Kill()
		return err
	}
	s.cfg.Logger.Info("ClickHouse started", "addr", s.Addr(), "pid", cmd.Process.Pid, "dir", s.cfg.Dir)
	return nil
}

func (s *Server) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StartTimeout)
	defer cancel()
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{s.Addr()}, DialTimeout: time.Second})
	if err != nil {
		return fmt.Errorf("chserver: %w", err)
	}
	defer conn.Close()
	for {
		var one uint8
		err := conn.QueryRow(ctx, "SELECT toUInt8(1)").Scan(&one)
		if err == nil {
			return nil
		}
		select {
		case <-s.done:
			return fmt.Errorf("chserver: clickhouse-server exited at start: %s", s.logTail())
		case <-ctx.Done():
			return fmt.Errorf("chserver: not answering on %s after %s: %w; %s", s.Addr(), s.cfg.StartTimeout, err, s.logTail())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// logTail is the end of the error log and of stdout, for error messages.
func (s *Server) logTail() string {
	var parts []string
	for _, name := range []string{"log/err.log", "log/stdout.log"} {
		b, err := os.ReadFile(s.path(name))
		if err != nil || len(b) == 0 {
			continue
		}
		if len(b) > 1500 {
			b = b[len(b)-1500:]
		}
		parts = append(parts, name+": "+strings.TrimSpace(string(b)))
	}
	if len(parts) == 0 {
		return "no log output"
	}
	return strings.Join(parts, "\n")
}

// Addr is the native-protocol address.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.cfg.TCPPort)) }

// HTTPAddr is the HTTP interface's address.
func (s *Server) HTTPAddr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.cfg.HTTPPort)) }

// Dir is the server's directory.
func (s *Server) Dir() string { return s.cfg.Dir }

// Stop asks the server to shut down (SIGTERM) and waits; when ctx ends first
// it kills the process. Start can be called again afterwards.
func (s *Server) Stop(ctx context.Context) error {
	if s.cmd == nil {
		return nil
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-ctx.Done():
		s.Kill()
		return fmt.Errorf("chserver: killed after stop timed out: %w", ctx.Err())
	}
	s.cmd = nil
	return nil
}

// Kill stops the server with SIGKILL, as a crash would.
func (s *Server) Kill() {
	if s.cmd == nil {
		return
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.done
	s.cmd = nil
}
