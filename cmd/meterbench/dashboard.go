package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"
	"tokenmeter/internal/testkit/browsertest"

	"github.com/chromedp/chromedp"
)

// dashboardTimes loads the dashboard (GET /ui/ of the API at httpAddr) n
// times in headless Chromium with key, each a fresh page load of the view
// fragment names (e.g. "tab=metrics&range=30d"), and returns the time from
// navigation to the page's first "ready" state (every API call of the view
// drawn), as the page measures it (body data-ready-ms).
func dashboardTimes(ctx context.Context, httpAddr, key, fragment string, n int, trace io.Writer) ([]time.Duration, error) {
	chromium, err := browsertest.Chromium()
	if err != nil {
		return nil, fmt.Errorf("%w (Debian: apt-get install chromium)", err)
	}
	actx, cancel := chromedp.NewExecAllocator(ctx, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.WindowSize(1280, 800))...)
	defer cancel()
	bctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	base := "http://" + httpAddr + "/ui/"
	// The key is entered once per browser session.
	if err := chromedp.Do(bctx, chromedp.Navigate(base)); err != nil {
		return nil, fmt.Errorf("open the dashboard: %w", err)
	}
	if _, err := chromedp.Run(bctx, chromedp.Evaluate[any](fmt.Sprintf("sessionStorage.setItem('tokenmeter.key', %q)", key))); err != nil {
		return nil, fmt.Errorf("enter the key: %w", err)
	}
	var out []time.Duration
	for i := range n + 1 {
		lctx, cancel := context.WithTimeout(bctx, time.Minute)
		err := chromedp.Do(lctx,
			chromedp.Navigate(fmt.Sprintf("%s?load=%d#%s", base, i, fragment)),
			chromedp.WaitVisible(chromedp.CSS(`body[data-state="ready"], body[data-state="error"]`)))
		var got [2]string
		if err == nil {
			got, err = chromedp.Run(lctx, chromedp.Evaluate[[2]string](`[document.body.dataset.state, document.body.dataset.readyMs || ""]`))
		}
		cancel()
		if err != nil {
			return nil, fmt.Errorf("load %d of the dashboard: %w", i, err)
		}
		state, ms := got[0], got[1]
		if state != "ready" {
			return nil, fmt.Errorf("load %d of the dashboard ended in state %q", i, state)
		}
		v, err := strconv.ParseFloat(ms, 64)
		if err != nil {
			return nil, fmt.Errorf("load %d: data-ready-ms %q: %w", i, ms, err)
		}
		if i > 0 { // the first load warms the browser's cache of the page's files
			out = append(out, time.Duration(v*float64(time.Millisecond)))
		}
	}
	if trace != nil {
		// The last load's API calls: when each started and how long it took.
		calls, err := chromedp.Run(bctx, chromedp.Evaluate[[][3]any](`performance.getEntriesByType("resource")
  .filter(e => e.name.includes("/v1/") || e.name.includes("/ui/session"))
  .map(e => [e.name.replace(location.origin, ""), Math.round(e.startTime), Math.round(e.duration)])`))
		if err != nil {
			return nil, fmt.Errorf("read the dashboard's resource timings: %w", err)
		}
		for _, c := range calls {
			fmt.Fprintf(trace, "    start %5v ms  took %5v ms  %v\n", c[1], c[2], c[0])
		}
	}
	return out, nil
}
