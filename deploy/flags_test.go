package deploy

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
)

// repoRoot is the root of the main module, one level up.
const repoRoot = ".."

// binDir holds the binaries built by binaries, removed by TestMain.
var binDir string

// binaries builds meterd and gpu-agent once per test binary.
var binaries = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "tokenmeter-deploy-bin-")
	if err != nil {
		return "", err
	}
	binDir = dir
	cmd := exec.Command("go", "build", "-o", dir+string(filepath.Separator), "./cmd/meterd", "./cmd/gpu-agent")
	cmd.Dir = repoRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/meterd ./cmd/gpu-agent: %w\n%s", err, out)
	}
	return dir, nil
})

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// flagLine is a flag's first line in the usage text of Go's flag package:
// two spaces, a dash, the name.
var flagLine = regexp.MustCompile(`(?m)^  -([A-Za-z0-9][A-Za-z0-9_.-]*)`)

var (
	flagsMu    sync.Mutex
	flagsCache = map[string]map[string]bool{}
)

// binaryFlags returns the flags that `<binary> -h` lists.
func binaryFlags(t *testing.T, binary string) map[string]bool {
	t.Helper()
	flagsMu.Lock()
	defer flagsMu.Unlock()
	if f, ok := flagsCache[binary]; ok {
		return f
	}
	dir, err := binaries()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd := exec.Command(filepath.Join(dir, binary), "-h")
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Env = []string{"PATH=/usr/bin:/bin"} // no METER_* from the test's environment
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s -h: %v\n%s", binary, err, out.String())
	}
	flags := map[string]bool{}
	for _, m := range flagLine.FindAllStringSubmatch(out.String(), -1) {
		flags[m[1]] = true
	}
	if len(flags) < 10 {
		t.Fatalf("%s -h lists %d flags, want more: is the usage format the flag package's?\n%s", binary, len(flags), out.String())
	}
	flagsCache[binary] = flags
	return flags
}

// checkFlags reports every -flag or --flag in args that binary does not
// have. Flags are given as --name=value or a bare --name (a boolean); a
// value never starts with a dash.
func checkFlags(t *testing.T, where, binary string, args []string) {
	t.Helper()
	known := binaryFlags(t, binary)
	var unknown []string
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			t.Errorf("%s: argument %q is not a --flag=value: the chart and compose file give every value in the flag's argument", where, a)
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !known[name] {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		t.Errorf("%s: %s has no flag %s (%s -h)", where, binary, strings.Join(unknown, ", "), binary)
	}
}

// envFallbacks is what envflag.EnvName makes of a flag: METER_ and the name
// in upper case with "-" as "_".
func envFallback(flag string) string {
	return "METER_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// passwordEnv are the environment variables that hold passwords; they have
// no flag (a flag's value shows in ps).
var passwordEnv = map[string]bool{"METER_CLICKHOUSE_PASSWORD": true, "METER_KAFKA_SASL_PASSWORD": true}

// checkEnv reports METER_* variables that are neither a flag's fallback
// nor a password variable: meterd and gpu-agent would ignore them.
func checkEnv(t *testing.T, where, binary string, names []string) {
	t.Helper()
	fallbacks := map[string]bool{}
	for f := range binaryFlags(t, binary) {
		fallbacks[envFallback(f)] = true
	}
	for _, n := range names {
		if strings.HasPrefix(n, "METER_") && !fallbacks[n] && !passwordEnv[n] {
			t.Errorf("%s: %s reads no %s (not a flag's fallback, not a password variable)", where, binary, n)
		}
	}
}

func TestBinaryFlags(t *testing.T) {
	for _, tc := range []struct{ binary, flag string }{
		{"meterd", "kafka-brokers"}, {"meterd", "clickhouse-password-file"}, {"meterd", "auth-keys"},
		{"gpu-agent", "exporter-url"}, {"gpu-agent", "kafka-sasl-password-file"},
	} {
		if !binaryFlags(t, tc.binary)[tc.flag] {
			t.Errorf("%s -h does not list --%s: the usage parser is broken", tc.binary, tc.flag)
		}
	}
}
