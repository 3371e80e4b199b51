package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"

	"tokenmeter/internal/testkit/sheettest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// TestUsageCSVNoFormulas: ids that a spreadsheet would take as formulas or
// signed numbers are written with an apostrophe in front; counts stay
// plain numbers.
func TestUsageCSVNoFormulas(t *testing.T) {
	out := hostileUsageCSV(t)
	want := `bucket_start,tenant_id,model,requests,errors,prompt_tokens,cached_prompt_tokens,output_tokens
2026-11-21T00:00:00Z,"'=HYPERLINK(""http://evil.example/"",""x"")",'=cmd|' /C calc'!A0,3,0,0,0,0
2026-11-21T00:00:00Z,'+1+1,'@SUM(1+1),4,0,0,0,0
2026-11-21T00:00:00Z,'-5,a;'=1+1,5,0,0,0,0
`
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("CSV (-want +got):\n%s", diff)
	}
}

// hostileUsageCSV is meterctl usage --output csv of buckets with hostile
// tenants and models.
func hostileUsageCSV(t *testing.T) string {
	t.Helper()
	answer := `{"buckets":[
 {"start":"2026-11-21T00:00:00Z","tenantId":"=HYPERLINK(\"http://evil.example/\",\"x\")","model":"=cmd|' /C calc'!A0","requests":"3"},
 {"start":"2026-11-21T00:00:00Z","tenantId":"+1+1","model":"@SUM(1+1)","requests":"4"},
 {"start":"2026-11-21T00:00:00Z","tenantId":"-5","model":"a;=1+1","requests":"5"}
]}`
	srv := newFakeAPI(t, &fakeAPI{usage: answer})
	out, _, err := runArgs(t, map[string]string{"METER_ADDR": srv.URL, "METER_API_KEY": testKey},
		"usage", "--group-by", "tenant_id,model", "--output", "csv")
	if err != nil {
		t.Fatalf("usage: %v", err)
	}
	return out
}

// TestSeriesCSVNoFormulas: the group cells of the series commands' CSV
// (here goodput) are text with the apostrophe where needed.
func TestSeriesCSVNoFormulas(t *testing.T) {
	out := hostileGoodputCSV(t)
	want := `tenant_id,model,start,requests,good,attainment,goodput_rps,good_out_tps,goodput_ratio,slo_version
acme,'=1+1,2026-11-21T10:00:00Z,120000,119990,0.9999166666666667,33.330555555555556,7775,0.9996428571428572,3
acme,'=1+1,2026-11-21T11:00:00Z,90000,81000,0.9,22.5,5027.777777777777,0.861904761904762,3-4
acme,'=1+1,summary,210000,200990,0.9570952380952381,27.915277777777778,6401.388888888889,0.9406122448979591,3-4
acme,'-5,2026-11-21T10:00:00Z,7,0,0,0,0,0,2
acme,'-5,summary,7,0,0,0,0,0,2
`
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("CSV (-want +got):\n%s", diff)
	}
}

// hostileGoodputCSV is meterctl goodput --output csv of series whose model
// is a formula or a signed number.
func hostileGoodputCSV(t *testing.T) string {
	t.Helper()
	pages := goodputPages()
	pages[0].(*meterv1.GetGoodputResponse).Series[0].Group = map[string]string{"tenant_id": "acme", "model": "=1+1"}
	pages[1].(*meterv1.GetGoodputResponse).Series[0].Group = map[string]string{"tenant_id": "acme", "model": "-5"}
	_, srv := newFakeMetrics(t, map[string][]proto.Message{"/v1/goodput": pages})
	out, _, err := runArgs(t, nil, append([]string{"goodput", "--output", "csv", "--addr", srv.URL, "--key", testKey}, selectorArgs...)...)
	if err != nil {
		t.Fatalf("goodput: %v", err)
	}
	return out
}

// TestCSVInASpreadsheet opens meterctl's hostile CSV outputs in LibreOffice
// Calc (formulas evaluated): no cell is a formula, the counts and rates
// are numbers, the escaped ids text.
func TestCSVInASpreadsheet(t *testing.T) {
	usage, goodput := []byte(hostileUsageCSV(t)), []byte(hostileGoodputCSV(t))
	sheets := sheettest.Open(t, sheettest.Comma, usage, goodput)
	counts := func(c string) bool { return !slices.Contains([]string{"bucket_start", "tenant_id", "model"}, c) }
	if n := sheettest.CheckCSV(t, sheets[0], usage, counts); n == 0 {
		t.Error("usage: no number cells")
	}
	rates := func(c string) bool {
		return !slices.Contains([]string{"tenant_id", "model", "start", "slo_version"}, c)
	}
	if n := sheettest.CheckCSV(t, sheets[1], goodput, rates); n == 0 {
		t.Error("goodput: no number cells")
	}
}

// TestGridCSV: a num column writes a negative amount as a plain number, a
// text column the same characters as text.
func TestGridCSV(t *testing.T) {
	g := &grid{cols: []column{{head: "TENANT", csvHead: "tenant_id"}, {head: "COST", csvHead: "cost", num: true}}}
	g.add("-12.5", "-12.5")
	g.add("@acme", "=1+1") // what is not a number in a num column is text
	var buf bytes.Buffer
	if err := g.writeCSV(&buf); err != nil {
		t.Fatal(err)
	}
	if got, want := buf.String(), "tenant_id,cost\n'-12.5,-12.5\n'@acme,'=1+1\n"; got != want {
		t.Errorf("CSV %q, want %q", got, strings.TrimSpace(want))
	}
}
