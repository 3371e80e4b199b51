package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"tokenmeter/ingest/gpu"
)

// TestRunNVMLUnavailable runs --source nvml where there is no NVIDIA driver
// (this machine, CI): a clean error that says what is missing and what to
// use instead, never a crash.
func TestRunNVMLUnavailable(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"--source", "nvml", "--once"}, noEnv, &stdout, &stderr)
	if err == nil {
		t.Skip("NVML is available on this machine")
	}
	if !errors.Is(err, gpu.ErrNVMLUnavailable) {
		t.Errorf("got %v, want an error wrapping gpu.ErrNVMLUnavailable", err)
	}
	for _, s := range []string{"NVML not available", "libnvidia-ml.so.1", "; use --source dcgm-exporter or replay"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
	if stdout.Len() != 0 {
		t.Errorf("printed samples without a source: %q", stdout.String())
	}
}

// TestMainNVMLUnavailableExits runs the binary's main in a child process:
// without the driver, gpu-agent --source nvml --once exits 1 and says why
// on stderr.
func TestMainNVMLUnavailableExits(t *testing.T) {
	if os.Getenv("GPU_AGENT_RUN_MAIN") == "1" {
		os.Args = []string{"gpu-agent", "--source", "nvml", "--once", "--http-addr", ""}
		main()
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestMainNVMLUnavailableExits$")
	cmd.Env = append(os.Environ(), "GPU_AGENT_RUN_MAIN=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err == nil {
		t.Skip("NVML is available on this machine")
	}
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("got %v, want exit status 1\nstderr: %s", err, stderr.String())
	}
	want := "gpu-agent: NVML not available: "
	if !strings.HasPrefix(stderr.String(), want) || !strings.Contains(stderr.String(), "; use --source dcgm-exporter or replay\n") {
		t.Errorf("stderr %q, want %q ... %q", stderr.String(), want, "; use --source dcgm-exporter or replay")
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout %q, want nothing", stdout.String())
	}
}
