package api_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"tokenmeter/internal/testkit/browsertest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// dashboardWidths are the window widths the layout is held at: a laptop,
// the width the finance table was cut at, a desktop.
var dashboardWidths = []int64{1280, 1400, 1920}

// moneyCharts are the charts, by tab, whose value axis is money.
var moneyCharts = map[string][]string{
	"metrics":  {"cost-busy-idle"},
	"finance":  {"finance-cost-by-tenant", "finance-cost-over-time", "finance-idle-by-deployment"},
	"capacity": {"capacity-cost-days"},
}

// dashboardLayout opens every tab (an admin key; the metrics and finance
// tabs over the last 7 days, the capacity tab over all the data) at each
// of dashboardWidths and holds what a person sees: every card's text
// inside its card, every table's last column inside its box, every axis
// label its tick's value exactly and unrepeated, money axes in the API's
// currency; at 1280 px also every time chart of the range on one time
// axis, the hour in progress marked partial, and cards with the longest
// values still fitting. It writes artifacts/dashboard-<tab>-<width>.png at
// 1280 and 1920 px. last is the end of the data (fillDashboard).
func dashboardLayout(t *testing.T, b *browsertest.Browser, base string, first, last time.Time) {
	end := time.Now().UTC().Truncate(time.Hour).Add(time.Hour)
	views := []struct{ tab, hash string }{
		{"metrics", "#tab=metrics&range=7d"},
		{"finance", "#tab=finance&range=7d"},
		{"capacity", "#tab=capacity&range=custom&start=" + first.Format(time.RFC3339) + "&end=" + end.Format(time.RFC3339)},
	}
	p := b.Open(t, base+"/ui/"+views[0].hash)
	signIn(t, p, testKeys["admin"])
	waitReady(t, p)
	var cost meterv1.GetCostResponse
	apiGet(t, base, testKeys["admin"], "/v1/cost", pageRange(t, p).hours(), &cost)
	if cost.GetCurrency() != "USD" {
		t.Fatalf("the API's currency is %q, want the fixture's USD", cost.GetCurrency())
	}
	for _, w := range dashboardWidths {
		p.Run(t, chromedp.EmulateViewport(w, 900))
		for _, v := range views {
			browsertest.Value(t, p, chromedp.Evaluate[bool](fmt.Sprintf(`location.hash = %q; true`, v.hash)))
			p.Run(t, chromedp.Reload())
			waitReady(t, p)
			where := fmt.Sprintf("%s tab at %d px", v.tab, w)
			if got := browsertest.Value(t, p, chromedp.Evaluate[float64](`window.innerWidth`)); got != float64(w) {
				t.Fatalf("%s: window is %v px wide", where, got)
			}
			for _, problem := range browsertest.Value(t, p, chromedp.Evaluate[[]string](layoutProblems)) {
				t.Errorf("%s: %s", where, problem)
			}
			checkMoneyAxes(t, p, where, moneyCharts[v.tab], "$", cost.GetCurrency())
			checkLongValues(t, p, where)
			if v.tab == "metrics" && w == 1280 {
				checkTimeAxes(t, p, where)
				checkPartial(t, p, where, last)
			}
			noErrors(t, p)
			if w != 1400 {
				p.Screenshot(t, fmt.Sprintf("dashboard-%s-%d", v.tab, w))
			}
		}
	}
	// The other ranges: minute steps under hourly charts (clipped to the
	// range), day steps.
	p.Run(t, chromedp.EmulateViewport(1280, 900))
	for _, rg := range []string{"1h", "30d"} {
		browsertest.Value(t, p, chromedp.Evaluate[bool](fmt.Sprintf(`location.hash = "#tab=metrics&range=%s"; true`, rg)))
		p.Run(t, chromedp.Reload())
		waitReady(t, p)
		where := "metrics tab, range " + rg
		for _, problem := range browsertest.Value(t, p, chromedp.Evaluate[[]string](layoutProblems)) {
			t.Errorf("%s: %s", where, problem)
		}
		checkTimeAxes(t, p, where)
		noErrors(t, p)
		p.Screenshot(t, "dashboard-metrics-"+rg+"-1280")
	}
	checkAxisTicks(t, p)
}

// layoutProblems lists, on the shown tab: text of a card past its card's
// border, a table wider than its box (its last column cut), and axis tick
// labels that repeat or do not read as their tick's value (data-v).
const layoutProblems = `(() => {
	const out = [];
	const shown = (e) => e.getClientRects().length > 0;
	const px = (v) => parseFloat(v) || 0;
	for (const card of document.querySelectorAll("main .card")) {
		if (!shown(card)) continue;
		const r = card.getBoundingClientRect();
		const cs = getComputedStyle(card);
		const left = r.left + px(cs.borderLeftWidth), right = r.right - px(cs.borderRightWidth);
		const name = card.querySelector("h3").textContent;
		if (card.scrollWidth > card.clientWidth) out.push("card " + name + ": content " + card.scrollWidth + " px wide in " + card.clientWidth + " px");
		const walk = document.createTreeWalker(card, NodeFilter.SHOW_TEXT);
		for (let n = walk.nextNode(); n; n = walk.nextNode()) {
			if (!n.textContent.trim()) continue;
			const range = document.createRange();
			range.selectNodeContents(n);
			for (const b of range.getClientRects()) {
				if (b.right > right + 0.5 || b.left < left - 0.5) {
					out.push("card " + name + ": " + JSON.stringify(n.textContent.trim()) + " spans " + b.left.toFixed(1) + "-" + b.right.toFixed(1) +
						" px, past the card's inside " + left.toFixed(1) + "-" + right.toFixed(1) + " px");
				}
			}
		}
	}
	for (const wrap of document.querySelectorAll("main .table-wrap")) {
		if (!shown(wrap)) continue;
		const name = wrap.querySelector("caption").textContent;
		if (wrap.scrollWidth > wrap.clientWidth) out.push("table " + name + ": " + wrap.scrollWidth + " px wide in a box of " + wrap.clientWidth + " px (its last columns cut)");
		const box = wrap.getBoundingClientRect();
		const th = wrap.querySelector("thead th:last-child").getBoundingClientRect();
		if (th.right > box.right + 0.5) out.push("table " + name + ": last column ends at " + th.right.toFixed(1) + " px, past its box at " + box.right.toFixed(1) + " px");
	}
	const parse = (s) => {
		const m = /^(-?)[^\d]*([\d,]*\.?\d+)\s*([kMGT]?)\s*(%?)/.exec(s);
		if (!m) return NaN;
		let v = Number(m[2].replaceAll(",", "")) * {"": 1, k: 1e3, M: 1e6, G: 1e9, T: 1e12}[m[3]];
		if (m[4]) v /= 100;
		return m[1] ? -v : v;
	};
	for (const fig of document.querySelectorAll("main figure.chart")) {
		if (!shown(fig)) continue;
		for (const axis of ["tick-y", "tick-x"]) {
			const ticks = [...fig.querySelectorAll("svg text.tick." + axis)];
			const labels = ticks.map((e) => e.textContent);
			if (new Set(labels).size !== labels.length) out.push("chart " + fig.dataset.chart + ": " + axis + " labels repeat: " + labels.join(" / "));
			for (const e of ticks) {
				const v = Number(e.dataset.v);
				if (!(Math.abs(parse(e.textContent) - v) <= 1e-9 * Math.max(1, Math.abs(v)))) {
					out.push("chart " + fig.dataset.chart + ": tick " + v + " reads " + JSON.stringify(e.textContent));
				}
			}
		}
	}
	return out;
})()`

// checkMoneyAxes checks that the value axis of each chart reads in the
// currency: every tick label carries its symbol, the axis title its code.
func checkMoneyAxes(t *testing.T, p *browsertest.Page, where string, charts []string, symbol, code string) {
	t.Helper()
	for _, name := range charts {
		got := browsertest.Value(t, p, chromedp.Evaluate[map[string][]string](fmt.Sprintf(`(f => f ? ({
			ticks: [...f.querySelectorAll("svg text.tick")].map(e => e.textContent),
			titles: [...f.querySelectorAll("svg .axis-title")].map(e => e.textContent),
		}) : {})(document.querySelector('[data-chart=%q]'))`, name)))
		if len(got["ticks"]) == 0 {
			t.Errorf("%s: chart %s has no value axis ticks", where, name)
		}
		for _, l := range got["ticks"] {
			if !strings.HasPrefix(strings.TrimPrefix(l, "-"), symbol) {
				t.Errorf("%s: chart %s: money axis label %q has no %s", where, name, l, symbol)
			}
		}
		if !slices.ContainsFunc(got["titles"], func(s string) bool { return strings.Contains(s, code) }) {
			t.Errorf("%s: chart %s: axis titles %q do not name the currency %s", where, name, got["titles"], code)
		}
	}
}

// checkLongValues adds the longest values a page shows to the shown tab,
// checks that they stay inside their cards and tables, and removes them:
// cards (an amount in the millions, three latencies of "999.9 ms"
// abreast, a p50 of "1,234.57 s" with its p95 and p99 beneath) and, to each table, a row of a big customer (a long name,
// amounts in the millions).
func checkLongValues(t *testing.T, p *browsertest.Page, where string) {
	t.Helper()
	browsertest.Value(t, p, chromedp.Evaluate[bool](`(async () => {
		for (const body of document.querySelectorAll("main .panel:not([hidden]) .table-wrap tbody")) {
			const row = body.rows[0].cloneNode(true);
			row.classList.add("long-row");
			for (const td of row.cells) {
				const s = td.textContent;
				td.textContent = td.cellIndex === 0 ? "a-customer-with-a-long-name-0001" : s.startsWith("$") ? "$12,345,678.90" :
					s.endsWith("%") ? "100.0 %" : /^[\d,.]+$/.test(s) ? "123,456,789" : s;
			}
			body.appendChild(row);
		}
		const m = await import("./js/cards.js");
		const box = document.createElement("div");
		box.className = "cards";
		box.id = "long-cards";
		document.querySelector("main .panel:not([hidden])").prepend(box);
		m.card(box, { name: "long_cost", title: "GPU cost", raw: "", text: "$12,345,678.90", sub: "an amount in the millions" });
		m.card(box, { name: "long_rate", title: "Good output tokens/s", raw: "", text: "123,456.8", sub: "" });
		m.card(box, { name: "long_text", title: "Sustainable tokens/s per GPU", raw: "", text: "not enough data", sub: "" });
		for (const title of ["Time to first token", "Inter-token latency", "End-to-end latency"]) {
			m.stat(box, { title, main: { name: "long_p50", label: "p50", raw: "", text: "1,234.57 s" },
				more: [{ name: "long_p95", label: "p95", raw: "", text: "1,234.57 s" }, { name: "long_p99", label: "p99", raw: "", text: "12,345.68 s" }], sub: "1,234,567 requests measured" });
			m.trio(box, { title, items: ["p50", "p95", "p99"].map((p, i) => ({ name: "long_" + p, label: p, raw: "", text: ["999.9 ms", "999.9 ms", "1,234.57 s"][i] })), sub: "1,234,567 requests measured" });
		}
		if (m.fitValues) m.fitValues(box);
		return true;
	})()`, chromedp.EvalAwaitPromise))
	for _, problem := range browsertest.Value(t, p, chromedp.Evaluate[[]string](layoutProblems)) {
		t.Errorf("%s, with the longest values: %s", where, problem)
	}
	browsertest.Value(t, p, chromedp.Evaluate[bool](`document.getElementById("long-cards").remove();
		document.querySelectorAll(".long-row").forEach((r) => r.remove()); true`))
}

// checkTimeAxes checks that every chart of the metrics tab spans the
// page's range, the bar chart of busy and idle cost too (it spanned only
// the hours with data), and places each point and bar at its time.
func checkTimeAxes(t *testing.T, p *browsertest.Page, where string) {
	t.Helper()
	problems := browsertest.Value(t, p, chromedp.Evaluate[[]string](`(() => {
		const out = [];
		const start = Date.parse(document.body.dataset.start), end = Date.parse(document.body.dataset.end);
		const iso = (t) => new Date(t).toISOString();
		const figs = [...document.querySelectorAll("#metric-charts figure.chart")];
		if (figs.length < 10) out.push(figs.length + " charts, want 10");
		for (const fig of figs) {
			const name = fig.dataset.chart;
			if (!fig.dataset.t0) {
				out.push(name + ": no time domain (data-t0)");
				continue;
			}
			const t0 = Number(fig.dataset.t0), t1 = Number(fig.dataset.t1);
			if (t0 !== start || t1 !== end) out.push(name + ": spans " + iso(t0) + " to " + iso(t1) + ", want the range " + iso(start) + " to " + iso(end));
			const x0 = Number(fig.dataset.x0), x1 = Number(fig.dataset.x1);
			const at = (t) => x0 + ((t - t0) / (t1 - t0)) * (x1 - x0);
			const pts = [...fig.querySelectorAll("circle.pt")];
			const bad = pts.find((c) => Math.abs(Number(c.getAttribute("cx")) - at(Number(c.dataset.t))) > 0.051);
			if (bad) out.push(name + ": point of " + iso(Number(bad.dataset.t)) + " at x " + bad.getAttribute("cx") + ", want " + at(Number(bad.dataset.t)).toFixed(2));
			const bars = [...fig.querySelectorAll("rect.bar")];
			const off = bars.find((b) => { const x = Number(b.getAttribute("x")), want = at(Number(b.dataset.t)); return !(x >= want - 0.01 && x <= want + 2.01); });
			if (off) out.push(name + ": bar of " + iso(Number(off.dataset.t)) + " at x " + off.getAttribute("x") + ", want " + at(Number(off.dataset.t)).toFixed(2));
			if (pts.length + bars.length === 0) out.push(name + ": nothing drawn");
		}
		// The range's first days have data at their peak hours only: the
		// bars lie where those hours are, not side by side.
		const bars = [...document.querySelectorAll('[data-chart="cost-busy-idle"] rect.bar')].map((b) => Number(b.dataset.t)).sort((a, b) => a - b);
		if (end - start === 7 * 24 * 3600e3 && bars.length && bars[0] - start > 24 * 3600e3) out.push("cost-busy-idle: first bar at " + iso(bars[0]) + ", more than a day after the range's start");
		return out;
	})()`))
	for _, problem := range problems {
		t.Errorf("%s: %s", where, problem)
	}
}

// partialMarks is what a chart shows of the bucket in progress.
type partialMarks struct {
	Partial string   `json:"partial"` // the figure's data-partial
	Marked  []string `json:"marked"`  // data-t of points and bars drawn as partial
	Late    []string `json:"late"`    // data-t of points and bars at or after the partial hour
	Legend  string   `json:"legend"`
	Dashed  int      `json:"dashed"` // partial segments of lines
}

// checkPartial checks that the metrics tab (hour steps) draws the hour in
// progress as partial: in the rate charts, the engines' KV cache and
// queue, the GPU utilization and memory and the busy and idle cost, and
// only that hour. last is the end of the data:
// when the page's hour is a later one (the hour turned between the data
// and the page), there is nothing in it to mark.
func checkPartial(t *testing.T, p *browsertest.Page, where string, last time.Time) {
	t.Helper()
	now := browsertest.Value(t, p, chromedp.Evaluate[float64](`Number(document.body.dataset.now || Date.now())`))
	hour := time.UnixMilli(int64(now)).UTC().Truncate(time.Hour)
	want := fmt.Sprint(hour.UnixMilli())
	got := browsertest.Value(t, p, chromedp.Evaluate[map[string]partialMarks](fmt.Sprintf(`(() => {
		const out = {};
		for (const name of ["traffic-requests", "traffic-tokens", "goodput-tokens", "engine-kv-cache", "engine-queue", "gpu-utilization", "gpu-memory", "cost-busy-idle"]) {
			const f = document.querySelector('[data-chart="' + name + '"]');
			const els = [...f.querySelectorAll("circle.pt, rect.bar")];
			out[name] = {
				partial: f.dataset.partial || "",
				marked: els.filter((e) => e.classList.contains("partial")).map((e) => e.dataset.t),
				late: els.filter((e) => Number(e.dataset.t) >= %d).map((e) => e.dataset.t),
				legend: [...f.querySelectorAll("ul.legend li")].map((li) => li.textContent).join(" | "),
				dashed: f.querySelectorAll("path.series-partial").length,
			};
		}
		return out;
	})()`, hour.UnixMilli())))
	inHour := last.Truncate(time.Hour).Equal(hour)
	if !inHour {
		t.Logf("%s: the hour turned between the data (to %v) and the page (%v): no data in the hour in progress", where, last, hour)
	}
	for name, m := range got {
		if !slices.Equal(m.Marked, m.Late) {
			t.Errorf("%s: %s marks %q as partial, want the points and bars of the hour in progress %q", where, name, m.Marked, m.Late)
		}
		if !inHour {
			continue
		}
		if len(m.Marked) == 0 || m.Partial != want {
			t.Errorf("%s: %s marks %q partial (data-partial %q), want the hour in progress %s", where, name, m.Marked, m.Partial, want)
		}
		if !strings.Contains(m.Legend, "partial hour (in progress)") {
			t.Errorf("%s: %s legend %q does not name the partial hour", where, name, m.Legend)
		}
		if name != "cost-busy-idle" && m.Dashed == 0 {
			t.Errorf("%s: %s draws no partial segment", where, name)
		}
	}
}

// checkAxisTicks checks the value axes' ticks and labels: round steps,
// each label its tick exactly, in percent and in the currency.
func checkAxisTicks(t *testing.T, p *browsertest.Page) {
	t.Helper()
	cases := []struct {
		lo, hi float64
		n      int
		kind   string
		cur    string
		want   string
	}{
		{0, 0.1, 4, "percent", "", "0 % / 2.5 % / 5 % / 7.5 % / 10 %"}, // an error rate up to 10 % read 0/3/5/8/10 %
		{0, 0.167, 4, "percent", "", "0 % / 5 % / 10 % / 15 % / 20 %"},
		{0, 1, 4, "percent", "", "0 % / 25 % / 50 % / 75 % / 100 %"},
		{0, 0.004, 4, "percent", "", "0 % / 0.1 % / 0.2 % / 0.3 % / 0.4 %"},
		{0, 1200, 5, "number", "", "0 / 250 / 500 / 750 / 1k / 1.25k"}, // 1.25k read 1.3k
		{0, 1.2e6, 5, "number", "", "0 / 250k / 500k / 750k / 1M / 1.25M"},
		{0, 0.3, 4, "number", "", "0 / 0.1 / 0.2 / 0.3"},
		{-5, 5, 4, "number", "", "-5 / -2.5 / 0 / 2.5 / 5"},
		{0, 12.5, 4, "money", "USD", "$0 / $5 / $10 / $15"},
		{0, 0.03, 4, "money", "USD", "$0 / $0.01 / $0.02 / $0.03"},
		{0, 9000, 4, "money", "EUR", "€0 / €2.5k / €5k / €7.5k / €10k"},
		{0, 10, 4, "money", "XYZ", "XYZ\u00a00 / XYZ\u00a02.5 / XYZ\u00a05 / XYZ\u00a07.5 / XYZ\u00a010"},
	}
	for _, c := range cases {
		got := browsertest.Value(t, p, chromedp.Evaluate[string](fmt.Sprintf(`(async () => {
			const c = await import("./js/charts.js");
			return c.axisTicks(%v, %v, %d, %q, %q).labels.join(" / ");
		})()`, c.lo, c.hi, c.n, c.kind, c.cur), chromedp.EvalAwaitPromise))
		if got != c.want {
			t.Errorf("axis %s over [%v, %v] %s reads %q, want %q", c.kind, c.lo, c.hi, c.cur, got, c.want)
		}
	}
}
