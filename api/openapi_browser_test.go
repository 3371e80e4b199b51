package api_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"tokenmeter/internal/testkit/browsertest"
)

// TestAPIReferencePage opens the dashboard's API reference (/ui/api/,
// Swagger UI vendored from npm over /openapi.json) in a real headless
// Chromium: every operation of the document is listed, the page makes no
// request that fails and logs no error (its Content-Security-Policy
// included), and with a key signed in to the dashboard in the same tab
// "Try it out" calls the API with that key and shows the answer.
func TestAPIReferencePage(t *testing.T) {
	b := browsertest.New(t)
	s := newStack(t, false)
	base := "http://" + s.server.HTTPAddr()

	// The document this server serves: the services it offers.
	code, served := s.rest(t, "GET", "/openapi.json", "", nil)
	var doc struct {
		Info struct {
			Title string `json:"title"`
		} `json:"info"`
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(served, &doc); code != 200 || err != nil {
		t.Fatalf("GET /openapi.json: %d %v", code, err)
	}
	ops := 0
	for _, byMethod := range doc.Paths {
		ops += len(byMethod)
	}

	// The 1.9 MB renderer is revalidated, not downloaded again.
	for _, path := range []string{"/ui/vendor/swagger-ui/swagger-ui-bundle.js", "/ui/api/"} {
		_, header, _ := get(t, base+path, "")
		etag := header.Get("ETag")
		req, _ := http.NewRequest("GET", base+path, nil)
		req.Header.Set("If-None-Match", etag)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if etag == "" || resp.StatusCode != http.StatusNotModified {
			t.Errorf("GET %s: ETag %q, revalidation %d, want an ETag and 304", path, etag, resp.StatusCode)
		}
	}

	t.Run("anonymous", func(t *testing.T) {
		p := b.Open(t, base+"/ui/api/")
		waitState(t, p, "ready")
		got := browsertest.Value(t, p, chromedp.Poll[int](`document.querySelectorAll(".opblock").length || false`,
			chromedp.WithPollingTimeout(20*time.Second)))
		if got != ops {
			t.Errorf("the page lists %d operations, the document has %d", got, ops)
		}
		title := browsertest.Value(t, p, chromedp.Evaluate[string](`document.querySelector(".info .title").textContent`))
		if !strings.Contains(title, doc.Info.Title) {
			t.Errorf("title %q, want %q", title, doc.Info.Title)
		}
		p.Screenshot(t, "api-reference")
		noErrors(t, p)
	})

	t.Run("try it out with the dashboard's key", func(t *testing.T) {
		p := b.Open(t, base+"/ui/")
		signIn(t, p, testKeys["finance"])
		waitReady(t, p)
		// The dashboard links to the reference; the same tab keeps the key.
		href := browsertest.Value(t, p, chromedp.Evaluate[string](`document.querySelector("a.api-link").href`))
		if href != base+"/ui/api/" {
			t.Errorf("the dashboard's API reference link goes to %q", href)
		}
		p.Run(t, chromedp.Navigate(href))
		waitState(t, p, "ready")
		op := `#operations-AdminService-AdminService_GetPriceBook`
		p.Run(t,
			chromedp.Click(chromedp.CSS(op+` .opblock-summary-control`)),
			chromedp.Click(chromedp.CSS(op+` .try-out__btn`)),
			chromedp.Click(chromedp.CSS(op+` .execute`)),
		)
		status := browsertest.Value(t, p, chromedp.Poll[string](
			`(e => e ? e.textContent.trim() : false)(document.querySelector("`+op+` .live-responses-table tbody .response-col_status"))`,
			chromedp.WithPollingTimeout(20*time.Second)))
		if status != "200" {
			t.Errorf("Try it out of GET /v1/admin/price-book: status %q, want 200 (the finance key sent)", status)
		}
		body := browsertest.Value(t, p, chromedp.Evaluate[string](`document.querySelector("`+op+` .live-responses-table tbody .response-col_description").textContent`))
		if !strings.Contains(body, `"version"`) {
			t.Errorf("Try it out shows %.200q, want the price book answer", body)
		}
		p.Screenshot(t, "api-reference-try-it-out")
		noErrors(t, p)
	})
}
