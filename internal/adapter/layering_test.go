package adapter_test

import (
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
	domain := []string{"tokenmeter/ingest/...", "tokenmeter/query/...", "tokenmeter/rollup/...", "tokenmeter/billing/..."}
	forbidden := []string{"tokenmeter/internal/adapter/chstore", "tokenmeter/internal/adapter/devenv", "tokenmeter/internal/testkit/"}

	cmd := exec.Command("go", append([]string{"list", "-f", "{{.ImportPath}}{{range .Deps}} {{.}}{{end}}"}, domain...)...)
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	listed := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, deps, _ := strings.Cut(line, " ")
		listed[pkg] = true
		for _, dep := range strings.Fields(deps) {
			for _, f := range forbidden {
				if dep == f || strings.HasPrefix(dep, f+"/") || strings.HasSuffix(f, "/") && strings.HasPrefix(dep, f) {
					t.Errorf("%s depends on %s", pkg, dep)
				}
			}
		}
	}
	// The patterns matched the domain, not nothing.
	for _, pkg := range []string{"tokenmeter/ingest", "tokenmeter/ingest/sink", "tokenmeter/query", "tokenmeter/rollup", "tokenmeter/billing", "tokenmeter/billing/closing"} {
		if !listed[pkg] {
			t.Errorf("go list did not list %s", pkg)
		}
	}
}
