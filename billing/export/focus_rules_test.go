package export_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"

	"tokenmeter/billing"
	"tokenmeter/billing/export"
)

// focusRecords reads a FOCUS file (CSV or Parquet, the latter with Arrow)
// into one map per row: column → value as text, decimals exact; a null is
// absent (an empty CSV cell is a null).
func focusRecords(t *testing.T, f export.Format, data []byte) []map[string]string {
	t.Helper()
	var out []map[string]string
	if f == export.FocusCSV {
		recs := readCSV(t, data)
		for _, rec := range recs[1:] {
			m := map[string]string{}
			for i, h := range recs[0] {
				if rec[i] != "" {
					m[h] = strings.TrimPrefix(rec[i], "'")
				}
			}
			out = append(out, m)
		}
		return out
	}
	tbl, _ := arrowTable(t, data)
	out = make([]map[string]string, tbl.NumRows())
	for i := range out {
		out[i] = map[string]string{}
	}
	for ci, field := range tbl.Schema().Fields() {
		row := 0
		for _, c := range tbl.Column(ci).Data().Chunks() {
			for i := range c.Len() {
				if !c.IsNull(i) {
					out[row][field.Name] = arrowText(t, c, i)
				}
				row++
			}
		}
	}
	return out
}

func arrowText(t *testing.T, c arrow.Array, i int) string {
	switch a := c.(type) {
	case *array.String:
		return a.Value(i)
	case *array.Decimal128:
		scale := a.DataType().(*arrow.Decimal128Type).Scale
		r := new(big.Rat).SetFrac(a.Value(i).BigInt(), new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(scale)), nil))
		return r.FloatString(int(scale))
	case *array.Uint64:
		return strconv.FormatUint(a.Value(i), 10)
	case *array.Boolean:
		return strconv.FormatBool(a.Value(i))
	case *array.Timestamp:
		return a.Value(i).ToTime(arrow.Microsecond).UTC().Format(time.RFC3339)
	}
	t.Fatalf("column type %s", c.DataType())
	return ""
}

func rat(t *testing.T, s string) *big.Rat {
	t.Helper()
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		t.Fatalf("%q is not a decimal", s)
	}
	return r
}

// manyDecimalsBook prices models a–c with prices of up to nine decimals,
// each changed twice in November.
func manyDecimalsBook(t *testing.T, rng *rand.Rand) *billing.PriceBook {
	t.Helper()
	price := func() string { return fmt.Sprintf("%d.%09d", rng.IntN(20), rng.IntN(1_000_000_000)) }
	var entries []string
	for _, model := range []string{"a", "b", "c"} {
		for _, from := range []string{"2026-01-01T00:00:00Z", "2026-11-10T13:00:00Z", "2026-11-20T07:00:00Z"} {
			entries = append(entries, fmt.Sprintf(`{"model": %q, "effective_from": %q, "input_per_1m": %q, "cached_input_per_1m": %q, "output_per_1m": %q}`,
				model, from, price(), price(), price()))
		}
	}
	b, err := billing.ParsePriceBook([]byte(`{"currency": "USD", "token_prices": [` + strings.Join(entries, ",") + `]}`))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// generatedStatements are statements of November for tenants with hours
// of usage of models a–c (split at the price changes), late usage of
// October, under book.
func generatedStatements(t *testing.T, rng *rand.Rand, book *billing.PriceBook, tenants int) []billing.Statement {
	t.Helper()
	var out []billing.Statement
	for i := range tenants {
		zone := time.UTC
		if i%2 == 1 {
			zone = time.FixedZone("+05:30", 5*3600+1800)
		}
		p, err := billing.ParsePeriod("2026-11", zone)
		if err != nil {
			t.Fatal(err)
		}
		var usage []billing.StatementUsage
		for h := p.Start; h.Before(p.End); h = h.Add(time.Duration(1+rng.IntN(40)) * time.Hour) {
			start := h.UTC().Truncate(time.Hour)
			if start.Before(p.Start) {
				start = p.Start
			}
			end := start.Add(time.Hour).UTC().Truncate(time.Hour)
			if end.After(p.End) {
				end = p.End
			}
			in := uint64(rng.IntN(9_000_000))
			usage = append(usage, billing.StatementUsage{Start: start, End: end, Model: []string{"a", "b", "c"}[rng.IntN(3)],
				Deployment: fmt.Sprintf("d%d", rng.IntN(3)), Requests: uint64(1 + rng.IntN(500)),
				InputTokens: in, CachedInputTokens: uint64(rng.IntN(int(in) + 1)), OutputTokens: uint64(rng.IntN(3_000_000))})
		}
		late := p.Start.Add(-5 * time.Hour).UTC().Truncate(time.Hour)
		usage = append(usage, billing.StatementUsage{Start: late, End: late.Add(time.Hour), Model: "a", Deployment: "d1", Requests: 2,
			InputTokens: 1_234_567, CachedInputTokens: 7, OutputTokens: 98_765, OriginalPeriod: "2026-10"})
		st, err := billing.ComputeStatement(fmt.Sprintf("tenant-%d", i), p, book, usage, i%3 != 0)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, st)
	}
	return out
}

// TestFocusUnitPriceTimesQuantity checks FOCUS's cost identities on every
// row of generated statements priced with prices of nine decimals, in CSV
// and Parquet: ListUnitPrice × PricingQuantity = ListCost and
// ContractedUnitPrice × PricingQuantity = ContractedCost exactly; and each
// statement's rows, one rounding row among them, add up to its payable
// Total exactly.
func TestFocusUnitPriceTimesQuantity(t *testing.T) {
	rng := rand.New(rand.NewPCG(32, 4))
	book := manyDecimalsBook(t, rng)
	statements := generatedStatements(t, rng, book, 6)
	var rows []export.StatementRow
	totals := map[string]billing.Money{}
	for _, st := range statements {
		rows = append(rows, export.StatementRows(st)...)
		totals[st.Hash] = st.Total
	}
	for _, f := range []export.Format{export.FocusCSV, export.FocusParquet} {
		for _, finance := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s finance=%v", f, finance), func(t *testing.T) {
				recs := focusRecords(t, f, encodeStatements(t, f, export.Options{Finance: finance}, rows))
				sums := map[string]*big.Rat{}
				rounding := map[string]int{}
				priced := 0
				for i, r := range recs {
					for _, p := range [][3]string{{"ListUnitPrice", "PricingQuantity", "ListCost"}, {"ContractedUnitPrice", "PricingQuantity", "ContractedCost"}} {
						price, ok := r[p[0]]
						if !ok {
							continue
						}
						priced++
						got := new(big.Rat).Mul(rat(t, price), rat(t, r[p[1]]))
						if got.Cmp(rat(t, r[p[2]])) != 0 {
							t.Fatalf("row %d: %s %s × %s %s = %s, %s is %s", i, p[0], price, p[1], r[p[1]], got.FloatString(18), p[2], r[p[2]])
						}
					}
					for _, c := range []string{"ListCost", "ContractedCost", "EffectiveCost"} {
						if rat(t, r[c]).Cmp(rat(t, r["BilledCost"])) != 0 {
							t.Fatalf("row %d: %s %s, BilledCost %s: list prices, want equal", i, c, r[c], r["BilledCost"])
						}
					}
					h := r["x_StatementHash"]
					if sums[h] == nil {
						sums[h] = new(big.Rat)
					}
					sums[h].Add(sums[h], rat(t, r["BilledCost"]))
					if r["ChargeCategory"] == "Adjustment" {
						rounding[h]++
					}
				}
				if priced == 0 {
					t.Fatal("no priced rows")
				}
				for h, total := range totals {
					if want := new(big.Rat).SetFrac64(int64(total), 1e9); sums[h] == nil || sums[h].Cmp(want) != 0 {
						t.Errorf("statement %s: rows add up to %v, want its total %s", h[:8], sums[h], total)
					}
					if rounding[h] != 1 {
						t.Errorf("statement %s: %d rounding rows, want 1", h[:8], rounding[h])
					}
				}
			})
		}
	}
}

// TestFocusSkuPriceIDOnePrice exports two statements priced with two
// books in which one price was edited in place (same model and start, 2.00
// then 1.80): each SkuPriceId has one ListUnitPrice and one SkuPriceDetails
// (a JSON object whose keys are FOCUS's or start with x_), and the edited
// price has an id of its own.
func TestFocusSkuPriceIDOnePrice(t *testing.T) {
	bookOf := func(input string) *billing.PriceBook {
		b, err := billing.ParsePriceBook([]byte(`{"currency": "USD", "token_prices": [{"model": "m", "effective_from": "2026-01-01T00:00:00Z",
			"input_per_1m": "` + input + `", "cached_input_per_1m": "0.5", "output_per_1m": "6"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	p, err := billing.ParsePeriod("2026-11", time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	usage := []billing.StatementUsage{{Start: p.Start, End: p.Start.Add(time.Hour), Model: "m", Requests: 1, InputTokens: 1_000_000, OutputTokens: 10}}
	var rows []export.StatementRow
	for i, price := range []string{"2.00", "1.80"} {
		st, err := billing.ComputeStatement(fmt.Sprintf("t%d", i), p, bookOf(price), usage, false)
		if err != nil {
			t.Fatal(err)
		}
		rows = append(rows, export.StatementRows(st)...)
	}
	for _, f := range []export.Format{export.FocusCSV, export.FocusParquet} {
		prices, details := map[string]string{}, map[string]string{}
		inputIDs := map[string]bool{}
		for i, r := range focusRecords(t, f, encodeStatements(t, f, export.Options{}, rows)) {
			id, ok := r["SkuPriceId"]
			if !ok {
				continue
			}
			if r["x_TokenKind"] == "input" {
				inputIDs[id] = true
			}
			if p, seen := prices[id]; seen && rat(t, p).Cmp(rat(t, r["ListUnitPrice"])) != 0 {
				t.Errorf("%s row %d: SkuPriceId %s has ListUnitPrice %s and %s", f, i, id, p, r["ListUnitPrice"])
			}
			prices[id] = r["ListUnitPrice"]
			if d, seen := details[id]; seen && d != r["SkuPriceDetails"] {
				t.Errorf("%s row %d: SkuPriceId %s has SkuPriceDetails %s and %s", f, i, id, d, r["SkuPriceDetails"])
			}
			details[id] = r["SkuPriceDetails"]
			var kv map[string]any
			dec := json.NewDecoder(strings.NewReader(r["SkuPriceDetails"]))
			if err := dec.Decode(&kv); err != nil {
				t.Fatalf("%s row %d: SkuPriceDetails %q: %v", f, i, r["SkuPriceDetails"], err)
			}
			for k, v := range kv {
				if !strings.HasPrefix(k, "x_") {
					t.Errorf("%s row %d: SkuPriceDetails key %q is neither FOCUS's nor x_", f, i, k)
				}
				switch v.(type) {
				case map[string]any, []any:
					t.Errorf("%s row %d: SkuPriceDetails %q holds an object or array", f, i, k)
				}
			}
		}
		if len(inputIDs) != 2 {
			t.Errorf("%s: input SkuPriceIds %v, want two: the edited price is another price", f, inputIDs)
		}
	}
}

// TestFocusAccounts checks that the accounts file names the parties: the
// operator's provider, publisher and invoice issuer, each tenant's billing
// account id and display name (BillingAccountName, SubAccountName), and
// the Parquet file's DataGenerator.
func TestFocusAccounts(t *testing.T) {
	accounts, err := billing.ParseAccounts([]byte(`{"operator": {"provider_name": "Example Inference", "publisher_name": "Example Labs",
		"invoice_issuer_name": "Example Inference Ltd"},
		"tenants": [{"id": "acme", "name": "Acme Corp", "billing_account_id": "BA-0042"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	rows := append(export.StatementRows(testStatement(t, "acme")), export.StatementRows(testStatement(t, "globex"))...)
	opts := export.Options{Accounts: accounts}
	for _, f := range []export.Format{export.FocusCSV, export.FocusParquet} {
		data := encodeStatements(t, f, opts, rows)
		for i, r := range focusRecords(t, f, data) {
			want := map[string]string{"ProviderName": "Example Inference", "PublisherName": "Example Labs", "InvoiceIssuerName": "Example Inference Ltd",
				"BillingAccountId": "BA-0042", "BillingAccountName": "Acme Corp", "SubAccountId": "acme", "SubAccountName": "Acme Corp",
				"ServiceName": "Example Inference inference"}
			if r["SubAccountId"] == "globex" { // not in the file: its id
				want["BillingAccountId"], want["BillingAccountName"], want["SubAccountId"], want["SubAccountName"] = "globex", "globex", "globex", "globex"
			}
			for c, v := range want {
				if r[c] != v {
					t.Errorf("%s row %d: %s %q, want %q", f, i, c, r[c], v)
				}
			}
		}
		if f == export.FocusParquet {
			_, rdr := arrowTable(t, data)
			if got := rdr.MetaData().KeyValueMetadata().FindValue("DataGenerator"); got == nil || *got != "Example Inference" {
				t.Errorf("DataGenerator %v, want Example Inference", got)
			}
		}
	}
}

// TestFocusTenantView checks what a tenant's FOCUS file leaves out:
// deployment names (ResourceId, ResourceName, x_Deployment) and price book
// versions (x_PriceBook), which finance's file has.
func TestFocusTenantView(t *testing.T) {
	rows := export.StatementRows(testStatement(t, "acme"))
	for _, f := range []export.Format{export.FocusCSV, export.FocusParquet} {
		for _, finance := range []bool{false, true} {
			deployments := 0
			for i, r := range focusRecords(t, f, encodeStatements(t, f, export.Options{Finance: finance}, rows)) {
				for _, c := range []string{"ResourceId", "ResourceName", "ResourceType", "x_Deployment", "x_PriceBook"} {
					if _, ok := r[c]; ok && !finance {
						t.Errorf("%s tenant row %d shows %s %q", f, i, c, r[c])
					}
				}
				if r["ResourceId"] != "" {
					deployments++
				}
			}
			if finance && deployments == 0 {
				t.Errorf("%s: finance's file names no deployment", f)
			}
		}
	}
}

// TestFocusRegionAndInvoice checks that a row's region and invoice number
// reach RegionId, RegionName and InvoiceId, and that they are null when
// unknown.
func TestFocusRegionAndInvoice(t *testing.T) {
	rows := export.StatementRows(testStatement(t, "acme"))
	for i := range rows {
		rows[i].InvoiceID = "EI-000017"
		if rows[i].Line.Deployment == "d1" {
			rows[i].Region = "us-east-1"
		}
	}
	for _, f := range []export.Format{export.FocusCSV, export.FocusParquet} {
		regions := 0
		for i, r := range focusRecords(t, f, encodeStatements(t, f, export.Options{Finance: true}, rows)) {
			if r["InvoiceId"] != "EI-000017" {
				t.Errorf("%s row %d: InvoiceId %q", f, i, r["InvoiceId"])
			}
			want := ""
			if r["x_Deployment"] == "d1" {
				want = "us-east-1"
				regions++
			}
			if r["RegionId"] != want || r["RegionName"] != want {
				t.Errorf("%s row %d (%s): RegionId %q, RegionName %q, want %q", f, i, r["x_Deployment"], r["RegionId"], r["RegionName"], want)
			}
		}
		if regions == 0 {
			t.Errorf("%s: no row with a region", f)
		}
	}
}

// TestFocusRowsCounted checks that Writer.Rows counts the rows of the
// file (FOCUS rows: one per token kind, and rounding rows), not the rows
// given to Write.
func TestFocusRowsCounted(t *testing.T) {
	rows := append(export.StatementRows(testStatement(t, "acme")), export.StatementRows(testStatement(t, "globex"))...)
	for _, f := range export.Formats() {
		var buf bytes.Buffer
		w, err := export.NewStatementWriter(&buf, f, export.Options{})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if err := w.Write(r); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		var want int64
		switch f {
		case export.CSV, export.FocusCSV:
			want = int64(len(readCSV(t, buf.Bytes())) - 1)
		case export.JSONLines:
			want = int64(bytes.Count(buf.Bytes(), []byte("\n")))
		default:
			tbl, _ := arrowTable(t, buf.Bytes())
			want = tbl.NumRows()
		}
		if w.Rows() != want {
			t.Errorf("%s: Rows() %d, the file has %d", f, w.Rows(), want)
		}
		if !f.IsFocus() && want != int64(len(rows)-2) {
			t.Errorf("%s: %d rows, want one per line (%d)", f, want, len(rows)-2)
		}
	}
}

// TestFocusGPUCostByGPUTime checks the split of a row's allocated GPU cost
// over its token kinds: by GPU time (DefaultGPUTimeWeights: an output
// token 4 input tokens' time, a cached input token a tenth), not by token
// count, and exact.
func TestFocusGPUCostByGPUTime(t *testing.T) {
	r := usageRows(t, 1)[0]
	r.InputTokens, r.CachedInputTokens, r.OutputTokens = 2_000_000, 1_000_000, 1_000_000
	r.AllocatedCost = 5_100_000_000 // weights 10 × 1M, 1 × 1M, 40 × 1M of 51M
	want := map[string]string{"input": "1", "cached_input": "0.1", "output": "4"}
	weights := [3]uint64{1, 1, 1}
	for _, opts := range []export.Options{{Finance: true}, {Finance: true, GPUTimeWeights: &weights}} {
		for _, rec := range focusRecords(t, export.FocusCSV, encodeUsage(t, export.FocusCSV, opts, []export.UsageCostRow{r})) {
			got := rec["x_AllocatedCost"]
			if opts.GPUTimeWeights != nil {
				// by tokens: 1M of 3M each
				want[rec["x_TokenKind"]] = "1.7"
			}
			if got != want[rec["x_TokenKind"]] {
				t.Errorf("weights %v: %s allocated %s, want %s", opts.GPUTimeWeights, rec["x_TokenKind"], got, want[rec["x_TokenKind"]])
			}
		}
	}
}

// TestFocusContractCharges exports generated statements priced by a
// contract (a percentage discount, a rate card of nine-decimal prices, a
// free allowance, volume tiers, dedicated GPU-hours, a commitment) with a
// credit drawn, in CSV and Parquet: the discounts lower ContractedCost,
// EffectiveCost and BilledCost of their rows (one ContractedUnitPrice per
// row, ContractedUnitPrice × PricingQuantity = ContractedCost exactly, the
// list identity too), dedicated GPU-hours are rows priced per GPU-hour,
// the credit a Credit row, the true-up an Adjustment row, and each
// statement's rows add up to its Total exactly.
func TestFocusContractCharges(t *testing.T) {
	rng := rand.New(rand.NewPCG(32, 9))
	book := manyDecimalsBook(t, rng)
	var contract billing.Contract
	err := json.Unmarshal([]byte(`{"discount_percent": "7.5",
		"rate_card": [{"model": "a", "effective_from": "2026-10-01T00:00:00Z", "input_per_1m": "1.123456789", "output_per_1m": "3.987654321"}],
		"allowances": [{"model": "b", "token_kind": "output", "tokens": 1000000}],
		"tiers": [{"model": "c", "tiers": [{"up_to": 20000000}, {"discount_percent": "20"}]}],
		"commitment": {"monthly_spend": "100000"},
		"dedicated": [{"deployment": "d2", "effective_from": "2026-10-01T00:00:00Z", "per_gpu_hour": "2.418"}]}`), &contract)
	if err != nil {
		t.Fatal(err)
	}
	if err := contract.Validate(); err != nil {
		t.Fatal(err)
	}
	var rows []export.StatementRow
	totals := map[string]billing.Money{}
	kinds := map[billing.ChargeKind]int{}
	for _, st := range generatedStatements(t, rng, book, 4) {
		var hours []billing.DedicatedHour
		for h := st.PeriodStart.Truncate(time.Hour); h.Before(st.PeriodEnd); h = h.Add(7 * time.Hour) {
			hours = append(hours, billing.DedicatedHour{Deployment: "d2", Hour: h, MicroHours: int64(rng.IntN(8_000_000))})
		}
		if err := contract.Apply(&st, hours); err != nil {
			t.Fatal(err)
		}
		p, err := billing.ParsePeriod(st.Period, time.UTC)
		if err != nil {
			t.Fatal(err)
		}
		grant := billing.GrantBalance{Grant: billing.CreditGrant{ID: "g-1", Tenant: st.Tenant, Kind: "promotional", Amount: 250_000_000_000,
			Currency: "USD", EffectiveFrom: p.Start.AddDate(0, -1, 0)}, Remaining: 250_000_000_000}
		if err := billing.ApplyCredits(&st, p, []billing.GrantBalance{grant}); err != nil {
			t.Fatal(err)
		}
		for _, c := range st.Charges {
			kinds[c.Kind]++
		}
		rows = append(rows, export.StatementRows(st)...)
		totals[st.Hash] = st.Total
	}
	for _, k := range []billing.ChargeKind{billing.ChargeDiscount, billing.ChargeDedicated, billing.ChargeCommitment, billing.ChargeCredit} {
		if kinds[k] == 0 {
			t.Fatalf("the generated statements have no %s charge: %v", k, kinds)
		}
	}
	for _, f := range []export.Format{export.FocusCSV, export.FocusParquet} {
		recs := focusRecords(t, f, encodeStatements(t, f, export.Options{Finance: true}, rows))
		sums := map[string]*big.Rat{}
		seen := map[string]int{}
		for i, r := range recs {
			for _, p := range [][3]string{{"ListUnitPrice", "PricingQuantity", "ListCost"}, {"ContractedUnitPrice", "PricingQuantity", "ContractedCost"}} {
				if price, ok := r[p[0]]; ok {
					if got := new(big.Rat).Mul(rat(t, price), rat(t, r[p[1]])); got.Cmp(rat(t, r[p[2]])) != 0 {
						t.Fatalf("%s row %d: %s %s × %s %s = %s, %s is %s", f, i, p[0], price, p[1], r[p[1]], got.FloatString(18), p[2], r[p[2]])
					}
				}
			}
			if r["BilledCost"] != r["EffectiveCost"] || r["BilledCost"] != r["ContractedCost"] {
				t.Fatalf("%s row %d: billed %s, effective %s, contracted %s: want equal (no amortization)", f, i, r["BilledCost"], r["EffectiveCost"], r["ContractedCost"])
			}
			switch {
			case r["ChargeCategory"] == "Credit":
				seen["credit"]++
				if r["ListCost"] != r["BilledCost"] || rat(t, r["BilledCost"]).Sign() >= 0 {
					t.Errorf("%s row %d: credit with ListCost %s, BilledCost %s", f, i, r["ListCost"], r["BilledCost"])
				}
			case r["PricingUnit"] == "GPU-Hours":
				seen["dedicated"]++
				if r["ChargeCategory"] != "Usage" || r["ConsumedUnit"] != "GPU-Hours" || r["SkuPriceId"] == "" || r["x_Deployment"] != "d2" {
					t.Errorf("%s row %d: dedicated GPU-hours %v", f, i, r)
				}
			case r["ChargeFrequency"] == "Recurring":
				seen["commitment"]++
				if r["ChargeCategory"] != "Adjustment" {
					t.Errorf("%s row %d: commitment true-up in %s", f, i, r["ChargeCategory"])
				}
			case r["ContractedUnitPrice"] != "" && rat(t, r["ContractedUnitPrice"]).Cmp(rat(t, r["ListUnitPrice"])) != 0:
				seen["discounted"]++
				if r["PricingCategory"] != "Standard" { // negotiated prices are Standard; Committed is for commitment discounts
					t.Errorf("%s row %d: contracted price with PricingCategory %q", f, i, r["PricingCategory"])
				}
			}
			h := r["x_StatementHash"]
			if sums[h] == nil {
				sums[h] = new(big.Rat)
			}
			sums[h].Add(sums[h], rat(t, r["BilledCost"]))
		}
		for _, k := range []string{"credit", "dedicated", "commitment", "discounted"} {
			if seen[k] == 0 {
				t.Errorf("%s: no %s row", f, k)
			}
		}
		for h, total := range totals {
			if want := new(big.Rat).SetFrac64(int64(total), 1e9); sums[h].Cmp(want) != 0 {
				t.Errorf("%s: statement %s: rows add up to %s, want its total %s", f, h[:8], sums[h].FloatString(15), total)
			}
		}
	}
}

// TestFocusRepricingByKind exports a repricing broken down by token kind:
// a Usage row per kind with ChargeClass "Correction", its SKU, the kind's
// tokens as PricingQuantity, no ConsumedQuantity or x_Tokens (the tokens
// were counted in the period repriced), costs adding up to the line's
// charge; a repricing without the breakdown stays one row.
func TestFocusRepricingByKind(t *testing.T) {
	p, err := billing.ParsePeriod("2026-11", time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	d := billing.Money(-1_234_567_891)
	usage := []billing.StatementUsage{
		{Start: p.Start, End: p.Start.Add(time.Hour), Model: "m", Requests: 1, InputTokens: 10, OutputTokens: 10},
		{Start: p.Start.AddDate(0, -1, 0), End: p.Start, Model: "m", OriginalPeriod: "2026-10", Repricing: &d,
			Repriced: &billing.Repriced{InputTokens: 3_000_000, CachedInputTokens: 1_000_000, OutputTokens: 500_000,
				InputCharge: -600_000_000, CachedInputCharge: -34_567_891, OutputCharge: -600_000_000}},
		{Start: p.Start.AddDate(0, -1, 0), End: p.Start, Model: "n", OriginalPeriod: "2026-10", Repricing: &d},
	}
	st, err := billing.ComputeStatement("acme", p, testBook(t), usage, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []export.Format{export.FocusCSV, export.FocusParquet} {
		sum := map[string]*big.Rat{"m": new(big.Rat), "n": new(big.Rat)}
		quantities := map[string]string{}
		rows := map[string]int{}
		for i, r := range focusRecords(t, f, encodeStatements(t, f, export.Options{}, export.StatementRows(st))) {
			if r["x_OriginalPeriod"] != "2026-10" {
				continue
			}
			rows[r["x_Model"]]++
			sum[r["x_Model"]].Add(sum[r["x_Model"]], rat(t, r["BilledCost"]))
			if r["ChargeCategory"] != "Usage" || r["ChargeClass"] != "Correction" || r["ConsumedQuantity"] != "" || r["x_Tokens"] != "0" {
				t.Errorf("%s row %d: repricing %v", f, i, r)
			}
			if r["x_Model"] == "m" {
				quantities[r["SkuId"]] = r["PricingQuantity"]
				if r["PricingUnit"] != "1000000 Tokens" || r["SkuMeter"] == "" {
					t.Errorf("%s row %d: repricing of m without its unit or meter: %v", f, i, r)
				}
			}
		}
		for sku, want := range map[string]string{"m:input": "2", "m:cached_input": "1", "m:output": "0.5"} {
			if rat(t, quantities[sku]).Cmp(rat(t, want)) != 0 {
				t.Errorf("%s: %s PricingQuantity %s, want %s", f, sku, quantities[sku], want)
			}
		}
		if rows["m"] != 3 || rows["n"] != 1 {
			t.Errorf("%s: repricing rows %v, want 3 of m (by kind) and 1 of n", f, rows)
		}
		for m, s := range sum {
			if s.Cmp(new(big.Rat).SetFrac64(int64(d), 1e9)) != 0 {
				t.Errorf("%s: %s's repricing rows add up to %s, want %s", f, m, s.FloatString(9), d)
			}
		}
	}
}

// TestFocusTaxRow exports two statements whose invoices have tax: each
// ends with a Tax row after its rounding row, whose BilledCost is the
// invoice's tax and whose list and contracted costs are the rate × those
// of the statement's rows (FOCUS: a tax is computed from the charges it
// taxes); the rows of an InvoiceId add up to the invoice's total, and a
// statement's rounding row is not moved by the tax of the one before.
func TestFocusTaxRow(t *testing.T) {
	var rows []export.StatementRow
	want := map[string]*big.Rat{}
	for i, tenant := range []string{"acme", "globex"} {
		st := testStatement(t, tenant)
		srows := export.StatementRows(st)
		invoice := fmt.Sprintf("EI-%06d", i+1)
		tax := billing.Money(st.Total / 1e7 * 1e7 * 18 / 100)
		for j := range srows {
			srows[j].InvoiceID = invoice
		}
		taxRow := srows[len(srows)-1]
		taxRow.Kind, taxRow.Tax = export.RowTax, &export.Tax{Name: "GST", Rate: 180_000_000, Amount: tax}
		rows = append(append(rows, srows...), taxRow)
		want[invoice] = new(big.Rat).SetFrac64(int64(st.Total+tax), 1e9)
	}
	for _, f := range []export.Format{export.FocusCSV, export.FocusParquet} {
		sums := map[string]*big.Rat{}
		list, contracted := map[string]*big.Rat{}, map[string]*big.Rat{}
		taxes := 0
		for i, r := range focusRecords(t, f, encodeStatements(t, f, export.Options{}, rows)) {
			id := r["InvoiceId"]
			for _, m := range []map[string]*big.Rat{sums, list, contracted} {
				if m[id] == nil {
					m[id] = new(big.Rat)
				}
			}
			if r["ChargeCategory"] != "Tax" {
				sums[id].Add(sums[id], rat(t, r["BilledCost"]))
				list[id].Add(list[id], rat(t, r["ListCost"]))
				contracted[id].Add(contracted[id], rat(t, r["ContractedCost"]))
				continue
			}
			taxes++
			for _, c := range []string{"SkuId", "SkuPriceId", "ListUnitPrice", "ContractedUnitPrice", "PricingQuantity", "ConsumedQuantity"} {
				if v, ok := r[c]; ok {
					t.Errorf("%s row %d: tax with %s %q", f, i, c, v)
				}
			}
			rate := big.NewRat(18, 100)
			for c, base := range map[string]*big.Rat{"ListCost": list[id], "ContractedCost": contracted[id], "EffectiveCost": contracted[id]} {
				if got, w := rat(t, r[c]), new(big.Rat).Mul(base, rate); new(big.Rat).Sub(got, w).Abs(new(big.Rat).Sub(got, w)).Cmp(big.NewRat(1, 1e15)) > 0 {
					t.Errorf("%s row %d: tax %s %s, want 0.18 × %s", f, i, c, r[c], base.FloatString(15))
				}
			}
			sums[id].Add(sums[id], rat(t, r["BilledCost"]))
		}
		if taxes != 2 {
			t.Errorf("%s: %d tax rows, want 2", f, taxes)
		}
		for id, w := range want {
			if sums[id].Cmp(w) != 0 {
				t.Errorf("%s: invoice %s: rows add up to %s, want its total %s", f, id, sums[id].FloatString(9), w.FloatString(9))
			}
		}
	}
}

// TestFocusTenantViewNamesNoDeployment exports a statement priced by a
// contract that names a deployment (a dedicated deployment and a rate card
// entry of it): the tenant's files hold its name nowhere (not in
// ResourceId, x_Deployment, ChargeDescription or SkuPriceId), finance's
// do.
func TestFocusTenantViewNamesNoDeployment(t *testing.T) {
	var contract billing.Contract
	if err := json.Unmarshal([]byte(`{"rate_card": [{"model": "m", "deployment": "secret-dep", "effective_from": "2026-01-01T00:00:00Z", "output_per_1m": "1.5"}],
		"dedicated": [{"deployment": "secret-dep", "effective_from": "2026-01-01T00:00:00Z", "per_gpu_hour": "2.5"}]}`), &contract); err != nil {
		t.Fatal(err)
	}
	p, err := billing.ParsePeriod("2026-11", time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	usage := []billing.StatementUsage{
		{Start: p.Start, End: p.Start.Add(time.Hour), Model: "m", Deployment: "secret-dep", Requests: 3, InputTokens: 1000, OutputTokens: 1000},
		{Start: p.Start, End: p.Start.Add(time.Hour), Model: "m", Deployment: "shared", Requests: 3, InputTokens: 1000, OutputTokens: 1000},
	}
	st, err := billing.ComputeStatement("acme", p, testBook(t), usage, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := contract.Apply(&st, []billing.DedicatedHour{{Deployment: "secret-dep", Hour: p.Start, MicroHours: 2_500_000}}); err != nil {
		t.Fatal(err)
	}
	rows := export.StatementRows(st)
	for _, f := range []export.Format{export.FocusCSV, export.FocusParquet} {
		for _, finance := range []bool{false, true} {
			named := 0
			for _, r := range focusRecords(t, f, encodeStatements(t, f, export.Options{Finance: finance}, rows)) {
				for c, v := range r {
					if strings.Contains(v, "secret-dep") || strings.Contains(v, "shared") {
						named++
						if !finance {
							t.Errorf("%s tenant view: %s %q names a deployment", f, c, v)
						}
					}
				}
			}
			if finance && named == 0 {
				t.Errorf("%s finance view names no deployment", f)
			}
		}
	}
}
