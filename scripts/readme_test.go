package scripts

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"tokenmeter/internal/testkit/browsertest"
)

// shBlocks returns the fenced ```sh blocks of a Markdown file, in order.
// Blocks fenced as ```console are shown, not run (the two commands
// themselves: make run is what the demo test runs, make test is this suite).
func shBlocks(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var blocks []string
	var cur *strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case cur == nil && strings.TrimSpace(line) == "```sh":
			cur = &strings.Builder{}
		case cur != nil && strings.TrimSpace(line) == "```":
			blocks = append(blocks, cur.String())
			cur = nil
		case cur != nil:
			cur.WriteString(line + "\n")
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil {
		t.Fatalf("%s: a ```sh block is not closed", path)
	}
	return blocks
}

// runDocBlocks runs the ```sh blocks of a Markdown file against a running
// demo, as a user would from the repository root: in a folder whose bin,
// data and deploy are the demo's binaries, its data directory and the
// repository's deploy/. Every curl fails on an HTTP error (the blocks use
// plain curl -s, which would print the error and exit 0), and every block
// runs under set -euo pipefail, so a command that fails fails the test.
// Files the blocks write must land in data/, never beside it.
func runDocBlocks(t *testing.T, doc string, d demo) {
	t.Helper()
	blocks := shBlocks(t, doc)
	if len(blocks) == 0 {
		t.Fatalf("%s has no ```sh block", doc)
	}
	root := t.TempDir()
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{"bin": d.bin, "data": d.data, "deploy": filepath.Join(repo, "deploy")} {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	env := append(os.Environ(), "METER_HTTP_ADDR="+d.http, "METER_GRPC_ADDR="+d.grpc, "METER_KAFKA_BROKERS="+d.kafka)
	prelude := "set -euo pipefail\ncurl() { command curl --fail-with-body \"$@\"; }\n"
	// The blocks of one document share their variables, as in one shell.
	var script strings.Builder
	script.WriteString(prelude)
	for i, b := range blocks {
		fmt.Fprintf(&script, "echo '>>> block %d'\n", i+1)
		script.WriteString(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script.String())
	cmd.Dir = root
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: its commands failed against the demo (%v):\n%s", doc, err, tail(out, 6000))
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if n := e.Name(); n != "bin" && n != "data" && n != "deploy" {
			t.Errorf("%s: a command wrote %s beside data/, not into it", doc, n)
		}
	}
	t.Logf("%s: %d blocks ran against the demo:\n%s", doc, len(blocks), tail(out, 4000))
}

// screenshotDashboard opens the dashboard of the running demo with the
// finance key, on each tab over the last 7 days, checks that it is ready
// with no page error, and writes screenshots as test artifacts:
// demo-dashboard.png (the window, the README's picture:
// docs/img/dashboard.png is a copy) and demo-<tab>.png (whole pages).
func screenshotDashboard(t *testing.T, d demo) {
	b := browsertest.New(t)
	key, err := os.ReadFile(filepath.Join(d.data, "keys", "finance.key"))
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + d.http + "/ui/"
	p := b.Open(t, base+"#tab=metrics&range=7d")
	p.Run(t,
		chromedp.EmulateViewport(1280, 900),
		chromedp.WaitVisible(chromedp.CSS("#key")),
		chromedp.SendKeys(chromedp.CSS("#key"), strings.TrimSpace(string(key))),
		chromedp.Click(chromedp.CSS(`#sign-in-form button[type="submit"]`)),
	)
	for _, tab := range []string{"metrics", "finance", "capacity"} {
		if tab != "metrics" {
			p.Run(t, chromedp.Click(chromedp.CSS("#tab-"+tab)))
		}
		state := browsertest.Value(t, p, chromedp.Poll[string](fmt.Sprintf(
			`(() => { const s = document.body.dataset.state; const on = location.hash.includes("tab=%s");
			  return on && (s === "ready" || s === "error") ? s : false; })()`, tab),
			chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(60*time.Second)))
		if state != "ready" {
			msg := browsertest.Value(t, p, chromedp.Evaluate[string](`document.getElementById("message").textContent`))
			t.Errorf("tab %s: the dashboard is %q: %s", tab, state, msg)
		}
		if tab == "metrics" {
			png := browsertest.Value(t, p, chromedp.CaptureScreenshot())
			if err := os.MkdirAll(browsertest.ArtifactDir(), 0o755); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(browsertest.ArtifactDir(), "demo-dashboard.png")
			if err := os.WriteFile(path, png, 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("screenshot: %s", path)
		}
		p.Screenshot(t, "demo-"+tab)
	}
	if errs := p.Errors(); len(errs) > 0 {
		t.Errorf("page errors: %q", errs)
	}
}
