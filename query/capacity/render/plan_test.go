package render

import (
	"bytes"
	"strings"
	"testing"

	"golang.org/x/net/html"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// planReport is the sample report with two plans: "chat" with a mix of two
// measured types (one a lower bound) and an unmeasured type, and a
// deployment with an evil name and no forecast.
func planReport() *meterv1.CapacityReport {
	r := sampleReport()
	r.Plans = []*meterv1.CapacityPlan{{
		Deployment: "chat", LoadKnown: true, LoadFor: "forecast peak 2027-02-22", LoadTokensPerSecond: 12345.67,
		Options: []*meterv1.CapacityGpuOption{
			{GpuType: "A100", Measured: true, Sustainable: &meterv1.SustainableLoad{Known: true, TokensPerSecondPerGpu: 900.25},
				Priced: true, PricePerHour: usd(1_290_000_000), CostKnown: true, CostPer_1MTokens: usd(398_038_504),
				CostArithmetic: "USD 1.29 per GPU-hour ÷ (900.3 tokens/s per GPU × 3,600 s) × 1,000,000 = USD 0.398038504 per 1M tokens",
				Gpus:           14, CostPerHour: usd(18_060_000_000), Arithmetic: "ceil(12,345.7 tokens/s ÷ 900.3 tokens/s per GPU) = ceil(13.7136) = 14 GPUs; 14 × USD 1.29 = USD 18.06 per hour"},
			{GpuType: "H100", Measured: true, Sustainable: &meterv1.SustainableLoad{Known: true, LowerBound: true, TokensPerSecondPerGpu: 2100},
				Priced: true, PricePerHour: usd(2_990_000_000), CostKnown: true, CostPer_1MTokens: usd(395_502_646),
				CostArithmetic: "USD 2.99 per GPU-hour ÷ (≥ 2,100.0 tokens/s per GPU × 3,600 s) × 1,000,000 = at most USD 0.395502646 per 1M tokens",
				Gpus:           6, CostPerHour: usd(17_940_000_000), Arithmetic: "ceil(...) = at most 6 GPUs; ..."},
			{GpuType: "B200", Priced: true, PricePerHour: usd(6_000_000_000), Sustainable: &meterv1.SustainableLoad{},
				NotEnoughData: "not enough data: chat ran no hour on B200 in the range, so its load there is not measured"},
		},
		MixKnown: true, Mix: []*meterv1.CapacityMixPart{{GpuType: "A100", Gpus: 1, CostPerHour: usd(1_290_000_000)}, {GpuType: "H100", Gpus: 5, CostPerHour: usd(14_950_000_000)}},
		MixGpus: 6, MixCostPerHour: usd(16_240_000_000), MixAtMost: true, MixArithmetic: "1 × A100 900.3 + 5 × H100 ≥ 2,100.0 tokens/s = ...",
	}, {
		Deployment: evilName, LoadReason: "not enough data: no forecast peak (growth from 2 complete weeks; a forecast needs 3)",
		MixReason: "not enough data: no forecast peak (growth from 2 complete weeks; a forecast needs 3)",
		Options:   []*meterv1.CapacityGpuOption{{GpuType: "L4", Measured: true, Sustainable: &meterv1.SustainableLoad{}, NotEnoughData: "not enough data: 3 qualifying hours"}},
	}}
	r.FleetPlan = &meterv1.CapacityFleetPlan{Parts: r.Plans[0].Mix, Gpus: 6, CostPerHour: usd(16_240_000_000), Deployments: 1, Missing: []string{evilName}, AtMost: true}
	return r
}

// TestHTMLFleetPlan: the HTML file shows each plan's GPU types with the
// report's figures (cost per 1M tokens to the nano, lower bounds marked),
// the reasons where the data supports no figure, the mix and the fleet's
// sum, with every name escaped.
func TestHTMLFleetPlan(t *testing.T) {
	d := renderHTML(t, planReport())
	sec := byID(d.root, "fleet-plan")
	if sec == nil {
		t.Fatal("no fleet-plan section")
	}
	if strings.Contains(d.raw, "<script>alert") {
		t.Fatal("an unescaped name")
	}
	plans := find(sec, "div", "plan")
	if len(plans) != 2 {
		t.Fatalf("%d plans, want 2", len(plans))
	}
	row := func(p *html.Node, typ string) []string {
		for _, tr := range find(p, "tr") {
			if v, _ := attr(tr, "data-gpu-type"); v == typ {
				var cells []string
				for _, td := range find(tr, "td") {
					cells = append(cells, textOf(td))
				}
				return cells
			}
		}
		t.Fatalf("no row %s", typ)
		return nil
	}
	a100 := row(plans[0], "A100")
	if a100[1] != "900.2" && a100[1] != "900.3" || a100[2] != "USD 1.29" || a100[3] != "USD 0.398038504" || a100[4] != "14" || a100[5] != "USD 18.06" ||
		!strings.Contains(a100[6], "= USD 0.398038504 per 1M tokens") {
		t.Errorf("A100 row %q", a100)
	}
	if h100 := row(plans[0], "H100"); h100[1] != "≥ 2,100.0" || h100[3] != "≤ USD 0.395502646" || h100[4] != "≤ 6" {
		t.Errorf("H100 row %q", h100)
	}
	if b200 := row(plans[0], "B200"); b200[1] != "-" || b200[3] != "-" || !strings.HasPrefix(b200[6], "not enough data: chat ran no hour on B200") {
		t.Errorf("B200 row %q", b200)
	}
	if mix := textOf(find(plans[0], "p", "mix")[0]); !strings.Contains(mix, "at most 1 × A100 + 5 × H100 = 6 GPUs, USD 16.24 per hour") {
		t.Errorf("mix %q", mix)
	}
	if v, _ := attr(plans[1], "data-deployment"); v != evilName {
		t.Errorf("second plan %q", v)
	}
	if mix := textOf(find(plans[1], "p", "mix")[0]); !strings.Contains(mix, "No mix: not enough data: no forecast peak") {
		t.Errorf("evil plan's mix %q", mix)
	}
	if f := textOf(find(sec, "p", "fleet-mix")[0]); !strings.Contains(f, "at most 1 × A100 + 5 × H100 = 6 GPUs for 1 deployment(s), at most USD 16.24 per hour") ||
		!strings.Contains(f, "without a mix") || !strings.Contains(f, evilName) {
		t.Errorf("fleet %q", f)
	}
	// The hot band's card.
	r := planReport()
	r.Units[0].HotBand = &meterv1.CapacityHotBand{Hours: 7, Requests: 700, GoodRequests: 630, Attainment: 0.9, OtherHours: 100, OtherRequests: 10000, OtherGoodRequests: 9990, OtherAttainment: 0.999}
	shown, raw, sub := cardValue(t, byID(renderHTML(t, r).root, "unit-1"), "hot_band")
	if shown != "90.0%" || raw != "0.9" || sub != "7 qualifying hours above 90% utilization; the other 100 hours 99.9%" {
		t.Errorf("hot band card %q %q %q", shown, raw, sub)
	}
	// A report without plans has no section.
	if byID(renderHTML(t, sampleReport()).root, "fleet-plan") != nil {
		t.Error("a fleet-plan section without plans")
	}
}

// TestPlanText: the text form has the same figures.
func TestPlanText(t *testing.T) {
	var b bytes.Buffer
	if err := PlanText(&b, planReport()); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"  chat: forecast peak 2027-02-22: 12,345.7 tokens/s\n",
		"USD 0.398038504", "≤ USD 0.395502646", "≥ 2,100.0",
		"B200: not enough data: chat ran no hour on B200",
		"cheapest mix: at most 1 × A100 + 5 × H100 = 6 GPUs, USD 16.24 per hour\n",
		"no mix: not enough data: no forecast peak",
		"fleet: at most 1 × A100 + 5 × H100 = 6 GPUs for 1 deployment(s), at most USD 16.24 per hour\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("text lacks %q:\n%s", want, out)
		}
	}
	b.Reset()
	if err := PlanText(&b, sampleReport()); err != nil || b.Len() != 0 {
		t.Errorf("a report without plans writes %q (%v)", b.String(), err)
	}
}
