package deploy

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/linter"
	dfparser "github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
	"golang.org/x/mod/modfile"
	"golang.org/x/mod/semver"
)

// dockerfile is deploy/Dockerfile parsed by BuildKit's own parser, with
// the warnings of BuildKit's linter (docker build --check).
type dockerfile struct {
	stages   []instructions.Stage
	metaArgs map[string]string
	warnings []string
}

func parseDockerfile(t *testing.T, path string) dockerfile {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ast, err := dfparser.Parse(f)
	if err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	var df dockerfile
	for _, w := range ast.Warnings {
		df.warnings = append(df.warnings, w.Short)
	}
	lint := linter.New(&linter.Config{Warn: func(rule, _, _, msg string, loc []dfparser.Range) {
		df.warnings = append(df.warnings, rule+": "+msg)
	}})
	stages, metaArgs, err := instructions.Parse(ast.AST, lint)
	if err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	df.stages = stages
	df.metaArgs = map[string]string{}
	for _, a := range metaArgs {
		for _, kv := range a.Args {
			df.metaArgs[kv.Key] = kv.ValueString()
		}
	}
	return df
}

// expand replaces ${NAME} and $NAME by the global ARGs' defaults.
func (df dockerfile) expand(t *testing.T, s string) string {
	t.Helper()
	lex := shell.NewLex('\\')
	res, err := lex.ProcessWordWithMatches(s, shell.EnvsFromSlice(envSlice(df.metaArgs)))
	if err != nil {
		t.Fatalf("expand %q: %v", s, err)
	}
	return res.Result
}

func envSlice(m map[string]string) []string {
	var s []string
	for k, v := range m {
		s = append(s, k+"="+v)
	}
	return s
}

// TestDockerfile checks deploy/Dockerfile without building it: a builder
// stage on a Go at least as new as the modules ask, which builds the real
// commands (meterd and meterctl without cgo, gpu-agent with it); runtime
// stages that run as a numeric non-root user from an exec-form ENTRYPOINT
// (no shell), carry OCI labels, copy only what the builder made, and add
// nothing from URLs; meterd's stage is last (the default target).
func TestDockerfile(t *testing.T) {
	df := parseDockerfile(t, "Dockerfile")
	for _, w := range df.warnings {
		t.Errorf("BuildKit lint: %s", w)
	}
	if len(df.stages) < 3 {
		t.Fatalf("got %d stages, want a builder and the runtime stages", len(df.stages))
	}
	builder := df.stages[0]
	base := df.expand(t, builder.BaseName)
	m := regexp.MustCompile(`^golang:(\d+\.\d+(?:\.\d+)?)-([a-z]+)$`).FindStringSubmatch(base)
	if m == nil {
		t.Fatalf("builder stage FROM %s: want golang:<version>-<debian release>", base)
	}
	goVersion, release := m[1], m[2]
	for _, mod := range []string{"../go.mod", "go.mod"} {
		data, err := os.ReadFile(mod)
		if err != nil {
			t.Fatal(err)
		}
		f, err := modfile.ParseLax(mod, data, nil)
		if err != nil {
			t.Fatal(err)
		}
		if semver.Compare("v"+goVersion, "v"+f.Go.Version) < 0 {
			t.Errorf("builder Go %s is older than %s's go %s (GOTOOLCHAIN=local would refuse to build)", goVersion, mod, f.Go.Version)
		}
	}

	// What the builder builds, and how.
	built := map[string]string{} // output binary -> CGO_ENABLED
	for _, cmd := range builder.Commands {
		run, ok := cmd.(*instructions.RunCommand)
		if !ok {
			continue
		}
		line := strings.Join(run.CmdLine, " ")
		for _, b := range goBuilds(t, line) {
			built[b.binary] = b.cgo
		}
	}
	wantCgo := map[string]string{"meterd": "0", "meterctl": "0", "gpu-agent": "1", "httpcheck": "0"}
	for bin, cgo := range wantCgo {
		got, ok := built[bin]
		if !ok {
			t.Errorf("the builder does not build %s (built: %v)", bin, built)
			continue
		}
		if got != cgo {
			t.Errorf("%s is built with CGO_ENABLED=%q, want %s", bin, got, cgo)
		}
	}

	runtime := map[string]instructions.Stage{}
	for _, s := range df.stages[1:] {
		runtime[s.Name] = s
	}
	if last := df.stages[len(df.stages)-1].Name; last != "meterd" {
		t.Errorf("the last stage (what a build without --target makes) is %q, want meterd", last)
	}
	for name, wantEntry := range map[string]string{"meterd": "meterd", "gpu-agent": "gpu-agent"} {
		s, ok := runtime[name]
		if !ok {
			t.Errorf("no stage %s", name)
			continue
		}
		checkRuntimeStage(t, df, s, wantEntry, release)
	}

	// No ADD of a URL (or at all) in any stage.
	for _, s := range df.stages {
		for _, cmd := range s.Commands {
			if add, ok := cmd.(*instructions.AddCommand); ok {
				t.Errorf("stage %s: ADD %v: use COPY (ADD fetches URLs and unpacks archives)", s.Name, add.SourcePaths)
			}
		}
	}
}

// checkRuntimeStage checks one runtime stage: a distroless base (static for
// a static binary, base with glibc of the builder's Debian release for
// gpu-agent), a numeric non-root USER, an exec-form ENTRYPOINT of a binary
// it copied from the builder, and the OCI labels.
func checkRuntimeStage(t *testing.T, df dockerfile, s instructions.Stage, binary, release string) {
	t.Helper()
	base := df.expand(t, s.BaseName)
	debian := map[string]string{"bookworm": "debian12", "trixie": "debian13"}[release]
	switch binary {
	case "gpu-agent":
		// cgo: dynamically linked to glibc; the base must have it, from the same
		// (or a newer) Debian release as the builder's.
		if !strings.Contains(base, "distroless/base-"+debian) && !strings.Contains(base, "distroless/cc-"+debian) {
			t.Errorf("stage %s FROM %s: want distroless/base-%s (glibc of the builder's %s)", s.Name, base, debian, release)
		}
	default:
		if !strings.Contains(base, "distroless/static") {
			t.Errorf("stage %s FROM %s: want distroless/static for a static binary", s.Name, base)
		}
	}
	var user string
	var entry []string
	var copied []string
	labels := map[string]string{}
	for _, cmd := range s.Commands {
		switch c := cmd.(type) {
		case *instructions.UserCommand:
			user = c.User
		case *instructions.EntrypointCommand:
			if c.PrependShell {
				t.Errorf("stage %s: ENTRYPOINT in shell form needs /bin/sh, which the image lacks: use the JSON form", s.Name)
			}
			entry = c.CmdLine
		case *instructions.CopyCommand:
			if c.From != "build" {
				t.Errorf("stage %s: COPY %v from %q: want only the builder's outputs", s.Name, c.SourcePaths, c.From)
			}
			for _, p := range c.SourcePaths {
				copied = append(copied, filepath.Base(p))
			}
		case *instructions.LabelCommand:
			for _, kv := range c.Labels {
				labels[kv.Key] = kv.Value
			}
		case *instructions.RunCommand:
			t.Errorf("stage %s: RUN %v: the runtime image has no shell to run it", s.Name, c.CmdLine)
		}
	}
	uid, gid, _ := strings.Cut(user, ":")
	if n, err := strconv.Atoi(uid); err != nil || n == 0 {
		t.Errorf("stage %s: USER %q: want a numeric non-root UID (runAsNonRoot checks it without /etc/passwd)", s.Name, user)
	}
	if gid != "" {
		if _, err := strconv.Atoi(gid); err != nil {
			t.Errorf("stage %s: USER %q: want a numeric GID", s.Name, user)
		}
	}
	if len(entry) != 1 || filepath.Base(entry[0]) != binary || !slices.Contains(copied, binary) {
		t.Errorf("stage %s: ENTRYPOINT %v, copied %v: want [/usr/local/bin/%s], a binary the stage copied", s.Name, entry, copied, binary)
	}
	if !slices.Contains(copied, "httpcheck") {
		t.Errorf("stage %s: does not copy httpcheck, the health check of compose.yaml", s.Name)
	}
	for _, k := range []string{"org.opencontainers.image.title", "org.opencontainers.image.description", "org.opencontainers.image.version", "org.opencontainers.image.revision"} {
		if strings.Trim(labels[k], `"`) == "" {
			t.Errorf("stage %s: no label %s", s.Name, k)
		}
	}
}

type goBuild struct{ binary, cgo string }

// goBuilds finds the `go build` commands of a RUN line, in the folder each
// runs in (after a `cd DIR &&`) and with its CGO_ENABLED, and checks that
// each package it names is a main package of the repository; it returns
// the binaries.
func goBuilds(t *testing.T, line string) []goBuild {
	t.Helper()
	var out []goBuild
	dir := "."
	for _, part := range strings.Split(line, "&&") {
		fields := strings.Fields(part)
		cgo := ""
		for len(fields) > 0 && strings.Contains(fields[0], "=") {
			if v, ok := strings.CutPrefix(fields[0], "CGO_ENABLED="); ok {
				cgo = v
			}
			fields = fields[1:]
		}
		if len(fields) == 2 && fields[0] == "cd" {
			dir = filepath.Join(dir, fields[1])
			continue
		}
		if len(fields) < 2 || fields[0] != "go" || fields[1] != "build" {
			continue
		}
		var pkgs []string
		output := ""
		for i := 2; i < len(fields); i++ {
			switch f := fields[i]; {
			case f == "-o" && i+1 < len(fields):
				i++
				output = fields[i]
			case strings.HasPrefix(f, "-"):
			default:
				pkgs = append(pkgs, f)
			}
		}
		if len(pkgs) == 0 {
			t.Errorf("RUN %s: go build without packages", part)
		}
		for _, p := range pkgs {
			checkMainPackage(t, filepath.Join(repoRoot, dir, filepath.FromSlash(p)))
			name := filepath.Base(p)
			if len(pkgs) == 1 && output != "" && !strings.HasSuffix(output, "/") {
				name = filepath.Base(output)
			}
			out = append(out, goBuild{binary: name, cgo: cgo})
		}
	}
	return out
}

// checkMainPackage checks that dir holds a Go main package.
func checkMainPackage(t *testing.T, dir string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(files) == 0 {
		t.Errorf("go build %s: no Go files there", dir)
		return
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.PackageClauseOnly)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			return
		}
		if af.Name.Name != "main" {
			t.Errorf("go build %s: package %s, want main", dir, af.Name.Name)
		}
		return
	}
	t.Errorf("go build %s: only test files there", dir)
}

// TestDockerignore checks that .dockerignore keeps what the build needs in
// the context (the modules, the commands, embedded files) and leaves out
// the repository's history, build outputs and data.
func TestDockerignore(t *testing.T) {
	f, err := os.Open(filepath.Join(repoRoot, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		t.Fatal(err)
	}
	// Everything a build needs, found in the working tree: Go files that are
	// not tests, go.mod/go.sum, and what //go:embed takes.
	var needed []string
	for _, g := range []string{"go.mod", "go.sum", "deploy/go.mod", "deploy/go.sum", "deploy/Dockerfile"} {
		needed = append(needed, g)
	}
	embeds := regexp.MustCompile(`(?m)^//go:embed (.+)$`)
	err = filepath.WalkDir(repoRoot, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(repoRoot, path)
		if d.IsDir() {
			if slices.Contains([]string{".git", ".bin", "bin", "data", "testdata", "node_modules"}, d.Name()) || strings.HasPrefix(rel, "deploy/helm") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") || strings.HasPrefix(rel, "tools/") {
			return nil
		}
		needed = append(needed, rel)
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range embeds.FindAllStringSubmatch(string(src), -1) {
			for _, pat := range strings.Fields(m[1]) {
				matches, _ := filepath.Glob(filepath.Join(filepath.Dir(path), pat))
				for _, mm := range matches {
					r, _ := filepath.Rel(repoRoot, mm)
					needed = append(needed, r)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range needed {
		if ex, err := pm.MatchesOrParentMatches(filepath.ToSlash(p)); err != nil || ex {
			t.Errorf(".dockerignore leaves %s out of the build context (err %v)", p, err)
		}
	}
	for _, p := range []string{".git/HEAD", "bin/meterd", "data/keys/dev.json", "deploy/helm/tokenmeter/values.yaml"} {
		if ex, err := pm.MatchesOrParentMatches(p); err != nil || !ex {
			t.Errorf(".dockerignore keeps %s in the build context", p)
		}
	}
}
