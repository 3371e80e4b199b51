// Package browsertest drives a real headless Chromium from tests, through
// chromedp: it starts the browser, opens pages in fresh browser contexts,
// records what went wrong on a page (console errors, uncaught exceptions,
// failed requests and HTTP errors) and writes screenshots as test artifacts.
//
// A test that needs the browser calls New; without Chromium it skips, except
// under CI=true, where it fails: CI must never go green by skipping.
//
//	b := browsertest.New(t)
//	p := b.Open(t, srv.URL+"/ui/")
//	p.Run(t, chromedp.WaitVisible(chromedp.CSS("#main")))
//	if errs := p.Errors(); len(errs) > 0 {
//		t.Errorf("page errors: %q", errs)
//	}
//	p.Screenshot(t, "main")
//
// It owns no test data and starts no servers: the test serves its pages.
package browsertest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

const (
	// EnvChromium names the environment variable that points at the
	// Chromium binary; the default is DefaultChromium.
	EnvChromium = "CHROMIUM"
	// DefaultChromium is where Debian installs Chromium.
	DefaultChromium = "/usr/bin/chromium"
	// EnvArtifacts names the environment variable of the directory that
	// screenshots are written to; the default is <repo root>/artifacts.
	EnvArtifacts = "TOKENMETER_ARTIFACTS"

	// Width and Height are the size of the browser window.
	Width, Height = 1280, 800

	startTimeout  = time.Minute
	actionTimeout = time.Minute
)

// Browser is one headless Chromium with a private profile, shared by the
// pages a test opens; the test's cleanup stops it.
type Browser struct {
	ctx context.Context // the browser's chromedp context
}

// New starts a headless Chromium ($CHROMIUM or /usr/bin/chromium) with a
// fresh profile and --no-sandbox (the tests may run as root). Without
// Chromium the test skips, or fails under CI=true.
func New(t testing.TB) *Browser {
	t.Helper()
	path, err := Chromium()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("browsertest: %v (CI=true: tests that need a browser must not skip)", err)
		}
		t.Skipf("browsertest: %v", err)
	}
	profile := t.TempDir() // removed after the browser has stopped (cleanups run last-in first-out)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox,
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(Width, Height),
		chromedp.Flag("disable-gpu", true),
	)
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, bcancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		bcancel()
		acancel()
	})
	// The browser lives as long as the context of the first Run.
	start(t, bctx, "start "+path)
	return &Browser{ctx: bctx}
}

// Chromium returns the browser binary: $CHROMIUM when set, else
// DefaultChromium; an error when it is not an executable file. Benchmarks
// that drive the browser outside a test use it too.
func Chromium() (string, error) {
	path := os.Getenv(EnvChromium)
	if path == "" {
		path = DefaultChromium
	}
	p, err := exec.LookPath(path)
	if err != nil {
		return "", fmt.Errorf("no chromium (set $%s): %w", EnvChromium, err)
	}
	return p, nil
}

// Page is one tab, in a browser context of its own (no cookies or storage
// shared with other pages). It records the page's errors from the moment it
// opens; the test's cleanup closes it.
type Page struct {
	ctx context.Context // the tab's chromedp context

	mu     sync.Mutex
	errs   []string
	urls   map[network.RequestID]string // request id -> "METHOD URL"
	closed bool
}

// Open opens url in a new tab of a fresh browser context, waits for the
// page's load event and returns the page. From the start it records as
// errors: console.error and console.assert messages, uncaught exceptions,
// browser log entries of level error, requests that fail, and responses
// with an HTTP status of 400 or more.
func (b *Browser) Open(t testing.TB, url string) *Page {
	t.Helper()
	p := &Page{urls: map[network.RequestID]string{}}
	ctx, cancel := chromedp.NewContext(b.ctx,
		chromedp.WithNewBrowserContext(),
		chromedp.WithListener(p.record),
	)
	p.ctx = ctx
	t.Cleanup(func() {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		cancel()
	})
	// The tab lives as long as the context of its first Run: open it with
	// the page's own context, bounded by a timer.
	start(t, ctx, "open a tab")
	p.Run(t, chromedp.Navigate(url))
	return p
}

// start runs no action on ctx, which makes chromedp start the browser or
// open the tab that ctx stands for; the browser or tab lives as long as ctx.
// The test fails when that takes longer than startTimeout.
func start(t testing.TB, ctx context.Context, what string) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- chromedp.Do(ctx) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("browsertest: %s: %v", what, err)
		}
	case <-time.After(startTimeout):
		t.Fatalf("browsertest: %s: no answer after %v", what, startTimeout)
	}
}

// Run runs the actions on the page, in order; the test fails at the first
// error (and the message lists the page's errors so far).
func (p *Page) Run(t testing.TB, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, actionTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatalf("browsertest: %v (page errors: %q)", err, p.Errors())
	}
}

// Value runs one action on the page and returns its value; the test fails
// on an error. It reads what Run cannot, e.g.
// Value(t, p, chromedp.Evaluate[int]("document.images.length")).
func Value[T any](t testing.TB, p *Page, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, actionTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatalf("browsertest: %v (page errors: %q)", err, p.Errors())
	}
	return v
}

// AllowDownloads lets the page download files (a link with a download
// attribute, an attachment) into a fresh temporary directory, which it
// returns; downloads are refused otherwise.
func (p *Page) AllowDownloads(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	p.Run(t, chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		_, err := chromedp.CallBrowser(ctx, browser.SetDownloadBehavior, browser.SetDownloadBehaviorParams{
			Behavior:         browser.SetDownloadBehaviorBehaviorAllow,
			BrowserContextID: chromedp.FromContext(ctx).BrowserContextID,
			DownloadPath:     dir,
		})
		return err
	}))
	return dir
}

// Errors returns the errors recorded on the page so far, in order.
func (p *Page) Errors() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.errs...)
}

// Screenshot writes a PNG of the whole page (not only the window) to
// ArtifactDir()/name.png, logs its path and returns it.
func (p *Page) Screenshot(t testing.TB, name string) string {
	t.Helper()
	png := Value(t, p, chromedp.FullScreenshot(100))
	dir := ArtifactDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("browsertest: screenshot %s: %v", name, err)
	}
	path := filepath.Join(dir, fileName(name)+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatalf("browsertest: screenshot %s: %v", name, err)
	}
	t.Logf("screenshot: %s", path)
	return path
}

// fileName makes a test or subtest name safe as a file name.
func fileName(name string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			return r
		}
		return '_'
	}, name)
}

// ArtifactDir is the directory test artifacts are written to:
// $TOKENMETER_ARTIFACTS, or the artifacts directory at the root of the
// repository (the directory holding go.mod above the working directory).
// It creates the directory; a failure shows when a file is written there.
func ArtifactDir() string {
	dir := os.Getenv(EnvArtifacts)
	if dir == "" {
		dir = filepath.Join(repoRoot(), "artifacts")
	}
	_ = os.MkdirAll(dir, 0o755) // the write into it reports any error
	return dir
}

// repoRoot is the nearest directory above the working directory that
// holds go.mod (the working directory itself when none does).
func repoRoot() string {
	wd, err := os.Getwd()
	if err != nil {
		return "."
	}
	for dir := wd; ; {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return wd
		}
		dir = parent
	}
}

// record is the tab's event listener. It runs on chromedp's reading
// goroutine, so it only formats and appends.
func (p *Page) record(ev any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	switch ev := ev.(type) {
	case *runtime.EventConsoleAPICalled:
		if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeAssert {
			p.errs = append(p.errs, fmt.Sprintf("console.%s: %s", ev.Type, consoleText(ev.Args)))
		}
	case *runtime.EventExceptionThrown:
		p.errs = append(p.errs, "uncaught exception: "+exceptionText(ev.ExceptionDetails))
	case *log.EventEntryAdded:
		// Network entries ("Failed to load resource") repeat what the
		// network events below report with the method and URL.
		if e := ev.Entry; e != nil && e.Level == log.EntryLevelError && e.Source != log.EntrySourceNetwork {
			p.errs = append(p.errs, fmt.Sprintf("browser log (%s): %s %s", e.Source, e.Text, e.URL))
		}
	case *network.EventRequestWillBeSent:
		if ev.Request != nil {
			p.urls[ev.RequestID] = ev.Request.Method + " " + ev.Request.URL
		}
	case *network.EventResponseReceived:
		if r := ev.Response; r != nil && r.Status >= 400 {
			p.errs = append(p.errs, fmt.Sprintf("HTTP %d %s: %s", r.Status, r.StatusText, p.request(ev.RequestID, r.URL)))
		}
	case *network.EventLoadingFailed:
		if !ev.Canceled {
			p.errs = append(p.errs, fmt.Sprintf("request failed (%s): %s", ev.ErrorText, p.request(ev.RequestID, "")))
		}
	}
}

// request names a request by its method and URL, as far as they are known.
func (p *Page) request(id network.RequestID, url string) string {
	if s, ok := p.urls[id]; ok {
		return s
	}
	if url != "" {
		return url
	}
	return "request " + string(id)
}

// consoleText joins a console call's arguments the way the console shows
// them: strings as they are, other values by their description.
func consoleText(args []*runtime.RemoteObject) string {
	parts := make([]string, 0, len(args))
	for _, a := range args {
		parts = append(parts, remoteText(a))
	}
	return strings.Join(parts, " ")
}

func remoteText(o *runtime.RemoteObject) string {
	switch {
	case o == nil:
		return "undefined"
	case o.Type == runtime.RemoteObjectTypeString && len(o.Value) > 0:
		var s string
		if err := json.Unmarshal(o.Value, &s); err == nil {
			return s
		}
		return string(o.Value)
	case o.Description != "":
		return o.Description
	case len(o.Value) > 0:
		return string(o.Value)
	case o.UnserializableValue != "":
		return string(o.UnserializableValue)
	}
	return string(o.Type)
}

// exceptionText is an uncaught exception's message and place.
func exceptionText(d *runtime.ExceptionDetails) string {
	if d == nil {
		return "(no details)"
	}
	msg := d.Text
	if d.Exception != nil && d.Exception.Description != "" {
		msg += " " + d.Exception.Description
	}
	if d.URL != "" {
		msg += fmt.Sprintf(" (%s:%d:%d)", d.URL, d.LineNumber+1, d.ColumnNumber+1)
	}
	return msg
}
