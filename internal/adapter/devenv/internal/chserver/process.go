package chserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// stopLeftover stops a server that an earlier run left running on the same
// directory, for example when meterd --dev was killed with SIGKILL. It finds
// it through the pid file this package writes and through ClickHouse's own
// status file (which also covers a crash between starting the process and
// writing the pid file), and only touches a process whose command line names
// this directory's config file, so a recycled PID is never signalled.
func stopLeftover(ctx context.Context, logger *slog.Logger, l layout, grace time.Duration) error {
	var pids []int
	if pid, err := readPIDFile(l.pidFile()); err == nil {
		pids = append(pids, pid)
	}
	if pid, err := readStatusPID(l.statusFile()); err == nil && !slices.Contains(pids, pid) {
		pids = append(pids, pid)
	}
	for _, pid := range pids {
		if !processAlive(pid) || !runsConfig(pid, l.config()) {
			continue
		}
		logger.Warn("stopping ClickHouse left running by an earlier run", "pid", pid, "dir", l.dir)
		if err := terminate(ctx, pid, grace); err != nil {
			return fmt.Errorf("stop leftover clickhouse pid %d: %w", pid, err)
		}
	}
	return nil
}

// terminate sends SIGTERM to a process that is not our child, waits up to
// grace (or until ctx is done) for it to go, then sends SIGKILL.
func terminate(ctx context.Context, pid int, grace time.Duration) error {
	if err := signalServer(pid, syscall.SIGTERM); err != nil {
		return err
	}
	gctx, cancel := context.WithTimeout(ctx, grace)
	defer cancel()
	if waitGone(gctx, pid) {
		return nil
	}
	if err := signalServer(pid, syscall.SIGKILL); err != nil {
		return err
	}
	// Shutdown work that must finish even when ctx is done: a killed
	// process goes within milliseconds.
	kctx, kcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer kcancel()
	if !waitGone(kctx, pid) {
		return errors.New("still running after SIGKILL")
	}
	return nil
}

// waitGone polls until pid has exited or ctx is done, and reports whether it
// exited.
func waitGone(ctx context.Context, pid int) bool {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for processAlive(pid) {
		select {
		case <-ctx.Done():
			return !processAlive(pid)
		case <-t.C:
		}
	}
	return true
}

// signalServer signals pid, and its whole process group when pid leads one
// (servers started by this package do), so that helpers it may have forked
// go too. It never signals a group it does not lead, such as our own.
func signalServer(pid int, sig syscall.Signal) error {
	target := pid
	if pgid, err := syscall.Getpgid(pid); err == nil && pgid == pid && pgid != syscall.Getpgrp() {
		target = -pid
	}
	err := syscall.Kill(target, sig)
	if errors.Is(err, syscall.ESRCH) {
		return nil // already gone
	}
	if err != nil {
		return fmt.Errorf("send %v to pid %d: %w", sig, pid, err)
	}
	return nil
}

// processAlive reports whether pid exists and is not a zombie.
func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !errors.Is(err, fs.ErrNotExist) || !procMounted()
	}
	// The state follows the command name, which is in parentheses and may
	// itself contain spaces or parentheses.
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z'
	}
	return true
}

// runsConfig reports whether pid is a ClickHouse server started with the
// config file at configPath.
func runsConfig(pid int, configPath string) bool {
	var cmdline string
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline"); err == nil {
		cmdline = string(bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
	} else if procMounted() {
		return false
	} else {
		out, err := exec.Command("ps", "-o", "command=", "-p", strconv.Itoa(pid)).Output()
		if err != nil {
			return false
		}
		cmdline = string(out)
	}
	return strings.Contains(cmdline, "--config-file="+configPath)
}

func procMounted() bool {
	_, err := os.Stat("/proc/self/stat")
	return err == nil
}

// readPIDFile reads a PID written by writePIDFile.
func readPIDFile(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", path, err)
	}
	return pid, nil
}

func writePIDFile(path string, pid int) error {
	if err := writeFileAtomic(path, []byte(strconv.Itoa(pid)+"\n")); err != nil {
		return fmt.Errorf("write pid file: %w", err)
	}
	return nil
}

// removePIDFile removes the pid file if it still names pid.
func removePIDFile(path string, pid int) {
	if got, err := readPIDFile(path); err == nil && got == pid {
		_ = os.Remove(path) // a stale pid file is harmless: see stopLeftover
	}
}

// readStatusPID reads the PID from ClickHouse's status file, whose lines
// look like "PID: 1234" (18.x and current releases alike).
func readStatusPID(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "PID:"); ok {
			pid, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				return 0, fmt.Errorf("parse %s: %w", path, err)
			}
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no PID line in %s", path)
}
