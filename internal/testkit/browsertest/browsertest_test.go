package browsertest_test

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"tokenmeter/internal/testkit/browsertest"
)

// page serves the pages of the harness's tests: "/bad" logs console.error,
// fails an assertion, fetches a missing file and throws; "/good" does
// nothing wrong.
func pages(t *testing.T) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /bad", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, `<!doctype html><html><head><title>bad</title><link rel="icon" href="data:,"></head><body>
<p id="p">bad page</p>
<script>
console.error("boom from console.error", 42);
console.assert(1 === 2, "one is not two");
console.log("a log line is no error");
fetch("/missing").then(function () { document.body.dataset.fetched = "yes"; });
throw new Error("boom thrown");
</script></body></html>`)
	})
	mux.HandleFunc("GET /good", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, `<!doctype html><html><head><title>good</title><link rel="icon" href="data:,"></head><body>
<p id="p" style="height:2000px">good page</p>
<script>console.log("fine"); console.warn("a warning is no error");</script></body></html>`)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func TestErrorsReportsConsoleExceptionsAndHTTP(t *testing.T) {
	srv := pages(t)
	b := browsertest.New(t)

	p := b.Open(t, srv.URL+"/bad")
	browsertest.Value(t, p, chromedp.Poll[bool](`document.body.dataset.fetched === "yes"`))
	got := p.Errors()
	want := []string{
		"console.error: boom from console.error 42",
		"console.assert: one is not two",
		"uncaught exception: ",
		"Error: boom thrown",
		"HTTP 404 Not Found: GET " + srv.URL + "/missing",
	}
	all := strings.Join(got, "\n")
	for _, w := range want {
		if !strings.Contains(all, w) {
			t.Errorf("Errors() lacks %q; got:\n%s", w, all)
		}
	}
	if strings.Contains(all, "log line") {
		t.Errorf("Errors() holds a console.log line; got:\n%s", all)
	}

	good := b.Open(t, srv.URL+"/good")
	if got := good.Errors(); len(got) != 0 {
		t.Errorf("Errors() of a good page = %q, want none", got)
	}
	if title := browsertest.Value(t, good, chromedp.Title()); title != "good" {
		t.Errorf("title = %q, want %q", title, "good")
	}
}

func TestErrorsReportsFailedRequests(t *testing.T) {
	srv := pages(t)
	closed := httptest.NewServer(http.NotFoundHandler())
	deadURL := closed.URL
	closed.Close() // nothing listens there any more

	b := browsertest.New(t)
	p := b.Open(t, srv.URL+"/good")
	browsertest.Value(t, p, chromedp.Evaluate[bool](`fetch(`+fmt.Sprintf("%q", deadURL+"/x")+`).then(() => true, () => true)`, chromedp.EvalAwaitPromise))
	all := strings.Join(p.Errors(), "\n")
	if !strings.Contains(all, "request failed (net::ERR_CONNECTION_REFUSED): GET "+deadURL+"/x") {
		t.Errorf("Errors() lacks the refused request; got:\n%s", all)
	}
}

func TestScreenshot(t *testing.T) {
	t.Setenv(browsertest.EnvArtifacts, t.TempDir())
	srv := pages(t)
	b := browsertest.New(t)
	p := b.Open(t, srv.URL+"/good")

	path := p.Screenshot(t, "good page/1")
	if !strings.HasSuffix(path, "good_page_1.png") {
		t.Errorf("path = %q, want it to end in good_page_1.png", path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(data, []byte("\x89PNG\r\n\x1a\n")) {
		t.Errorf("%s is no PNG (starts %q)", path, data[:min(8, len(data))])
	}
}

func TestAllowDownloads(t *testing.T) {
	srv := pages(t)
	b := browsertest.New(t)
	p := b.Open(t, srv.URL+"/good")
	dir := p.AllowDownloads(t)
	browsertest.Value(t, p, chromedp.Evaluate[bool](`(() => {
		const a = document.createElement("a");
		a.href = URL.createObjectURL(new Blob(["a,b\n1,2\n"], {type: "text/csv"}));
		a.download = "table.csv";
		document.body.appendChild(a);
		a.click();
		return true;
	})()`))
	path := filepath.Join(dir, "table.csv")
	deadline := time.Now().Add(20 * time.Second)
	for {
		data, err := os.ReadFile(path)
		if err == nil && string(data) == "a,b\n1,2\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("download %s: %q, %v; want the blob's text", path, data, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if errs := p.Errors(); len(errs) > 0 {
		t.Errorf("page errors: %q", errs)
	}
}

func TestNewSkipsOrFailsWithoutChromium(t *testing.T) {
	if os.Getenv("CI") == "true" {
		t.Skip("under CI=true New fails without chromium; checked by running this test without CI")
	}
	t.Setenv(browsertest.EnvChromium, "/nonexistent/chromium")
	var skipped bool
	t.Run("inner", func(t *testing.T) {
		defer func() { skipped = t.Skipped() }()
		browsertest.New(t)
	})
	if !skipped {
		t.Errorf("New without chromium did not skip")
	}
}
