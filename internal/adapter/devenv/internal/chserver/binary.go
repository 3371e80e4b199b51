package chserver

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// ErrNotInstalled reports that no ClickHouse server binary could be found.
// Callers that can do without a private server (tests on a laptop) check for
// it with errors.Is.
var ErrNotInstalled = errors.New("clickhouse server not installed")

// FindBinary returns the path of a ClickHouse server binary: clickhouse-server
// on PATH, then in /usr/sbin, /usr/bin and /usr/local/bin (Debian's
// clickhouse-server package installs it in /usr/sbin, which is often not on
// a non-root PATH), then the single clickhouse binary of current releases.
// The error wraps ErrNotInstalled and says how to install ClickHouse.
func FindBinary() (string, error) {
	// A bare name is looked up on PATH, an absolute path is used as is. The
	// multi-tool "clickhouse" binary needs the "server" subcommand; see
	// serverArgs.
	candidates := []string{
		"clickhouse-server",
		"/usr/sbin/clickhouse-server",
		"/usr/bin/clickhouse-server",
		"/usr/local/bin/clickhouse-server",
		"clickhouse",
		"/usr/bin/clickhouse",
		"/usr/local/bin/clickhouse",
	}
	for _, c := range candidates {
		if filepath.IsAbs(c) {
			if isExecutable(c) {
				return c, nil
			}
			continue
		}
		if p, err := exec.LookPath(c); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("look for clickhouse-server on PATH and in /usr/sbin, /usr/bin, /usr/local/bin"+
		" (install it with `apt-get install -y clickhouse-server clickhouse-client`,"+
		" or use an external ClickHouse server): %w", ErrNotInstalled)
}

// resolveBinary returns the binary to run for cfg: cfg.Binary when set,
// otherwise whatever FindBinary finds.
func resolveBinary(binary string) (string, error) {
	if binary == "" {
		return FindBinary()
	}
	if p, err := exec.LookPath(binary); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("clickhouse server binary %q not found or not executable: %w", binary, ErrNotInstalled)
}

// serverArgs returns the command line arguments that start the server binary
// bin with the given config file. The multi-tool "clickhouse" binary picks
// the tool by its first argument; clickhouse-server (a binary or a symlink to
// the multi-tool) by its own name.
func serverArgs(bin, configPath string) []string {
	args := []string{"--config-file=" + configPath}
	if filepath.Base(bin) == "clickhouse" {
		args = append([]string{"server"}, args...)
	}
	return args
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}
