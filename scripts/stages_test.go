package scripts

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestStagesRunAllAndFailAtEnd runs test-stages.sh (what `make test` runs)
// over a Makefile of fake stages: a failing stage does not stop the ones
// after it, each stage prints its result, the summary lists every stage,
// and the exit status is 1.
func TestStagesRunAllAndFailAtEnd(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make not installed")
	}
	cases := []struct {
		name, makefile string
		wantExit       int
		want           []string // lines of the summary, as regexps
		ran            []string // stages whose recipe must have run
		notRan         []string
	}{
		{
			name: "a failing stage in the middle",
			makefile: "test-stage-tools:\n\t@touch ran-tools\n" +
				"test-stage-lint:\n\t@touch ran-lint; exit 3\n" +
				"test-stage-check-generated:\n\t@touch ran-check-generated\n" +
				"test-stage-unit:\n\t@touch ran-unit\n" +
				"test-stage-cluster:\n\t@touch ran-cluster; false\n" +
				"test-stage-deploy:\n\t@touch ran-deploy\n" +
				"test-stage-fuzz:\n\t@touch ran-fuzz\n",
			wantExit: 1,
			want: []string{
				`tools +ok`, `lint +FAILED \(exit 2\)`, `check-generated +ok`, `unit +ok`,
				`cluster +FAILED`, `deploy +ok`, `fuzz +ok`, `total +FAILED`,
			},
			ran: []string{"tools", "lint", "check-generated", "unit", "cluster", "deploy", "fuzz"},
		},
		{
			name: "the generators fail",
			makefile: "test-stage-tools:\n\t@false\n" +
				"test-stage-lint:\n\t@touch ran-lint\n" +
				"test-stage-check-generated:\n\t@touch ran-check-generated\n" +
				"test-stage-unit:\n\t@touch ran-unit\n" +
				"test-stage-cluster:\n\t@touch ran-cluster\n" +
				"test-stage-deploy:\n\t@touch ran-deploy\n" +
				"test-stage-fuzz:\n\t@touch ran-fuzz\n",
			wantExit: 1,
			want:     []string{`tools +FAILED`, `lint +not run \(tools failed\)`, `check-generated +not run`, `unit +ok`, `total +FAILED`},
			ran:      []string{"unit", "cluster", "deploy", "fuzz"},
			notRan:   []string{"lint", "check-generated"},
		},
		{
			name: "all pass",
			makefile: "test-stage-tools test-stage-lint test-stage-check-generated test-stage-unit " +
				"test-stage-cluster test-stage-deploy test-stage-fuzz:\n\t@touch ran-$@\n",
			wantExit: 0,
			want:     []string{`unit +ok`, `fuzz +ok`, `total +ok`},
		},
	}
	script, err := os.ReadFile("test-stages.sh")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.Mkdir(filepath.Join(dir, "scripts"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "scripts", "test-stages.sh"), script, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "Makefile"), []byte(c.makefile), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("bash", filepath.Join(dir, "scripts", "test-stages.sh"))
			cmd.Env = append(os.Environ(), "STAGES=", "MAKEFLAGS=")
			out, err := cmd.CombinedOutput()
			exit := 0
			if ee, ok := err.(*exec.ExitError); ok {
				exit = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if exit != c.wantExit {
				t.Errorf("exit %d, want %d\n%s", exit, c.wantExit, out)
			}
			summary := string(out)
			if i := strings.Index(summary, "=== make test summary"); i >= 0 {
				summary = summary[i:]
			} else {
				t.Fatalf("no summary:\n%s", out)
			}
			for _, w := range c.want {
				if !regexp.MustCompile(`(?m)^  ` + w).MatchString(summary) {
					t.Errorf("summary has no line %q:\n%s", w, summary)
				}
			}
			if !regexp.MustCompile(`(?m)^  total +\S+ +\d+m\d\ds$`).MatchString(summary) {
				t.Errorf("summary has no total time:\n%s", summary)
			}
			for _, s := range c.ran {
				if _, err := os.Stat(filepath.Join(dir, "ran-"+s)); err != nil {
					t.Errorf("stage %s did not run:\n%s", s, out)
				}
			}
			for _, s := range c.notRan {
				if _, err := os.Stat(filepath.Join(dir, "ran-"+s)); err == nil {
					t.Errorf("stage %s ran after the tools failed", s)
				}
			}
		})
	}
}
