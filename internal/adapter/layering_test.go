package adapter_test

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// TestDomainDependsOnNoStore holds the direction of the import graph: the
// packages of the domain (ingest, query, rollup, billing and their
// subpackages) declare the ports they need and the adapters implement
// them, so no domain package depends on the ClickHouse adapter, on the dev
// engines, or on a test kit, directly or through another package. A
// domain package's tests may (they open a real store); `go list` without
// -test leaves them out.
func TestDomainDependsOnNoStore(t *testing.T) {
	deps := listDeps(t, "tokenmeter/ingest/...", "tokenmeter/query/...", "tokenmeter/rollup/...", "tokenmeter/billing/...")
	forbid(t, deps, "tokenmeter/internal/adapter/chstore", "tokenmeter/internal/adapter/devenv", "tokenmeter/internal/testkit")
	// The patterns matched the domain, not nothing.
	for _, pkg := range []string{"tokenmeter/ingest", "tokenmeter/ingest/sink", "tokenmeter/query", "tokenmeter/rollup", "tokenmeter/billing", "tokenmeter/billing/closing"} {
		if _, ok := deps[pkg]; !ok {
			t.Errorf("go list did not list %s", pkg)
		}
	}
}

// TestServicesDependOnNoTestKit: the binaries that run in production
// (meterd, meterctl, gpu-agent) depend on no test kit; meterbench may.
func TestServicesDependOnNoTestKit(t *testing.T) {
	deps := listDeps(t, "tokenmeter/cmd/meterd", "tokenmeter/cmd/meterctl", "tokenmeter/cmd/gpu-agent")
	forbid(t, deps, "tokenmeter/internal/testkit", "tokenmeter/internal/adapter/chstore/chstoretest")
	if len(deps) != 3 {
		t.Errorf("go list listed %d packages, want the 3 binaries", len(deps))
	}
}

// listDeps is every package the patterns match, with what it depends on
// (its imports, theirs, and so on; tests left out).
func listDeps(t *testing.T, patterns ...string) map[string][]string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list", "-f", "{{.ImportPath}}{{range .Deps}} {{.}}{{end}}"}, patterns...)...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	deps := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		deps[fields[0]] = fields[1:]
	}
	return deps
}

// forbid reports every package of deps that depends on one of the
// forbidden packages or on a package below one.
func forbid(t *testing.T, deps map[string][]string, forbidden ...string) {
	t.Helper()
	for pkg, ds := range deps {
		for _, dep := range ds {
			for _, f := range forbidden {
				if dep == f || strings.HasPrefix(dep, f+"/") {
					t.Errorf("%s depends on %s", pkg, dep)
				}
			}
		}
	}
}
