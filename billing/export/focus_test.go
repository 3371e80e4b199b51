package export_test

import (
	"math/big"
	"slices"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"

	"tokenmeter/billing"
	"tokenmeter/billing/export"
)

// focusColumn is a FOCUS 1.2 column's data type and whether it allows nulls
// (specification/columns/*.md, "Content Constraints").
type focusColumn struct {
	name     string
	typ      string // Decimal, Date/Time, String
	nullable bool
}

// focusMandatory lists the FOCUS 1.2 columns whose feature level is
// Mandatory, plus the Conditional and Recommended ones the mapping fills.
var focusMandatory = []focusColumn{
	{"BilledCost", "Decimal", false},
	{"BillingAccountId", "String", false},
	{"BillingAccountName", "String", true},
	{"BillingCurrency", "String", false},
	{"BillingPeriodEnd", "Date/Time", false},
	{"BillingPeriodStart", "Date/Time", false},
	{"ChargeCategory", "String", false},
	{"ChargeClass", "String", true},
	{"ChargeDescription", "String", true},
	{"ChargePeriodEnd", "Date/Time", false},
	{"ChargePeriodStart", "Date/Time", false},
	{"ContractedCost", "Decimal", false},
	{"EffectiveCost", "Decimal", false},
	{"InvoiceIssuerName", "String", false},
	{"ListCost", "Decimal", false},
	{"PricingQuantity", "Decimal", true},
	{"PricingUnit", "String", true},
	{"ProviderName", "String", false},
	{"PublisherName", "String", false},
	{"ServiceCategory", "String", false},
	{"ServiceName", "String", false},
	// Conditional or recommended, filled here.
	{"ChargeFrequency", "String", false},
	{"ServiceSubcategory", "String", false},
	{"ConsumedQuantity", "Decimal", true},
	{"ConsumedUnit", "String", true},
	{"ListUnitPrice", "Decimal", true},
	{"ContractedUnitPrice", "Decimal", true},
	{"PricingCategory", "String", true},
	{"ResourceId", "String", true},
	{"SkuId", "String", true},
	{"SkuPriceId", "String", true},
	{"SubAccountId", "String", true},
}

func focusStatements(t *testing.T) ([]export.StatementRow, billing.Money) {
	st1, st2 := testStatement(t, "acme"), testStatement(t, "globex")
	rows := append(export.StatementRows(st1), export.StatementRows(st2)...)
	return rows, st1.Total + st2.Total
}

// TestFocusParquetColumns reads the FOCUS Parquet of two statements with
// Arrow: every mandatory column is there with its FOCUS type, the columns
// that allow no nulls have none (and are required in the schema), the x_
// columns come last, costs add up exactly to the statements' charges, and
// the nullability rules that depend on the charge hold.
func TestFocusParquetColumns(t *testing.T) {
	rows, charge := focusStatements(t)
	tbl, rdr := arrowTable(t, encodeStatements(t, export.FocusParquet, export.Options{}, rows))
	schema := tbl.Schema()
	for _, c := range focusMandatory {
		idx := schema.FieldIndices(c.name)
		if len(idx) != 1 {
			t.Errorf("column %s missing", c.name)
			continue
		}
		f := schema.Field(idx[0])
		switch dt := f.Type.(type) {
		case *arrow.Decimal128Type:
			if c.typ != "Decimal" || (dt.Scale != 9 && dt.Scale != 15) {
				t.Errorf("column %s is %s, want %s", c.name, dt, c.typ)
			}
		case *arrow.TimestampType:
			if c.typ != "Date/Time" || dt.TimeZone != "UTC" {
				t.Errorf("column %s is %s, want %s in UTC", c.name, dt, c.typ)
			}
		case *arrow.StringType:
			if c.typ != "String" {
				t.Errorf("column %s is a string, want %s", c.name, c.typ)
			}
		default:
			t.Errorf("column %s is %s, want %s", c.name, dt, c.typ)
		}
		if !c.nullable && f.Nullable {
			t.Errorf("column %s is optional, want required (FOCUS allows no nulls)", c.name)
		}
		if n := nullCount(tbl.Column(idx[0]).Data()); !c.nullable && n != 0 {
			t.Errorf("column %s has %d nulls, FOCUS allows none", c.name, n)
		}
	}
	names := make([]string, len(schema.Fields()))
	for i, f := range schema.Fields() {
		names[i] = f.Name
	}
	if !slices.Equal(names, export.FocusColumns(false)) {
		t.Errorf("columns %v, want %v", names, export.FocusColumns(false))
	}
	kv := rdr.MetaData().KeyValueMetadata()
	for key, want := range map[string]string{"FocusVersion": "1.2", "DataGenerator": "tokenmeter", "SchemaId": export.FocusMetadataOf(export.Options{}).SchemaID} {
		if got := kv.FindValue(key); got == nil || *got != want {
			t.Errorf("%s metadata %v, want %q", key, got, want)
		}
	}
	// The statements' rows add up to their payable totals exactly (costs
	// are DECIMAL(38, 15): 10^6 units per nano-unit).
	want := new(big.Int).Mul(big.NewInt(int64(charge)), big.NewInt(1_000_000))
	for _, name := range []string{"BilledCost", "EffectiveCost", "ListCost", "ContractedCost"} {
		if got, _ := decimalSumScale(t, tbl, name, 15); got.Cmp(want) != 0 {
			t.Errorf("sum of %s: got %s, want the statements' totals %s", name, got, want)
		}
	}

	category := stringColumn(t, tbl, "ChargeCategory")
	class := stringColumn(t, tbl, "ChargeClass")
	consumed := column(t, tbl, "ConsumedQuantity").Chunk(0)
	kind := stringColumn(t, tbl, "x_TokenKind")
	adjustments, corrections := 0, 0
	for i, cat := range category {
		switch *cat {
		case "Usage":
			if class[i] != nil {
				corrections++
				// Late usage keeps its tokens; a repricing has none.
				if *class[i] != "Correction" || consumed.IsNull(i) != (kind[i] == nil) {
					t.Errorf("correction row %d: ChargeClass %v, ConsumedQuantity null %v", i, *class[i], consumed.IsNull(i))
				}
			} else if consumed.IsNull(i) {
				t.Errorf("usage row %d: ConsumedQuantity null; want a quantity", i)
			}
		case "Adjustment":
			adjustments++
			if class[i] != nil || !consumed.IsNull(i) {
				t.Errorf("rounding row %d: ChargeClass %v, ConsumedQuantity null %v; want null and null", i, class[i], consumed.IsNull(i))
			}
		default:
			t.Errorf("row %d: ChargeCategory %q", i, *cat)
		}
	}
	if adjustments != 2 || corrections != 8 { // a rounding row per statement; (3 kinds of late usage + 1 repricing) × 2
		t.Errorf("got %d rounding and %d correction rows, want 2 and 8", adjustments, corrections)
	}
	var tokens uint64
	for _, r := range rows {
		tokens += r.Line.InputTokens + r.Line.OutputTokens
	}
	if got := uintSum(t, tbl, "x_Tokens"); got != tokens {
		t.Errorf("sum of x_Tokens: got %d, want %d", got, tokens)
	}
}

func nullCount(c *arrow.Chunked) int {
	n := 0
	for _, a := range c.Chunks() {
		n += a.NullN()
	}
	return n
}

// stringColumn reads a string column; nil is a null.
func stringColumn(t *testing.T, tbl arrow.Table, name string) []*string {
	t.Helper()
	var out []*string
	for _, c := range column(t, tbl, name).Chunks() {
		a := c.(*array.String)
		for i := range a.Len() {
			if a.IsNull(i) {
				out = append(out, nil)
				continue
			}
			s := a.Value(i)
			out = append(out, &s)
		}
	}
	return out
}

// TestFocusCSV checks the FOCUS CSV of the usage dataset: the header is
// FocusColumns, no cell of a column that allows no nulls is empty, dates
// are YYYY-MM-DDTHH:mm:ssZ, and the costs and allocated costs add up
// exactly to the rows'.
func TestFocusCSV(t *testing.T) {
	rows := usageRows(t, 3000)
	recs := readCSV(t, encodeUsage(t, export.FocusCSV, export.Options{Finance: true}, rows))
	header := recs[0]
	if !slices.Equal(header, export.FocusColumns(true)) {
		t.Fatalf("header %v, want %v", header, export.FocusColumns(true))
	}
	col := map[string]int{}
	for i, h := range header {
		col[h] = i
	}
	var billed, allocated, margin billing.Money
	var requests uint64
	for n, rec := range recs[1:] {
		for _, c := range focusMandatory {
			if !c.nullable && rec[col[c.name]] == "" {
				t.Fatalf("row %d: %s is empty (null), FOCUS allows no nulls", n, c.name)
			}
		}
		for _, name := range []string{"BillingPeriodStart", "ChargePeriodStart", "ChargePeriodEnd"} {
			if v := rec[col[name]]; len(v) != 20 || v[10] != 'T' || v[19] != 'Z' {
				t.Fatalf("row %d: %s %q, want YYYY-MM-DDTHH:mm:ssZ", n, name, v)
			}
		}
		for _, p := range []struct {
			name string
			sum  *billing.Money
		}{{"BilledCost", &billed}, {"x_AllocatedCost", &allocated}, {"x_Margin", &margin}} {
			m, err := billing.ParseMoney(rec[col[p.name]])
			if err != nil {
				t.Fatalf("row %d: %s: %v", n, p.name, err)
			}
			*p.sum += m
		}
		var r uint64
		for _, ch := range rec[col["x_Requests"]] {
			r = r*10 + uint64(ch-'0')
		}
		requests += r
	}
	var wantBilled, wantAllocated, wantRequests = billing.Money(0), billing.Money(0), uint64(0)
	for _, r := range rows {
		wantBilled += r.ListCharge
		wantAllocated += r.AllocatedCost
		wantRequests += r.Requests
	}
	if billed != wantBilled || allocated != wantAllocated || margin != wantBilled-wantAllocated || requests != wantRequests {
		t.Errorf("sums: billed %s, allocated %s, margin %s, requests %d; want %s, %s, %s, %d",
			billed, allocated, margin, requests, wantBilled, wantAllocated, wantBilled-wantAllocated, wantRequests)
	}
	first := recs[1]
	if got := first[col["SkuId"]] + " " + first[col["PricingQuantity"]] + " " + first[col["PricingUnit"]] + " " + first[col["ListUnitPrice"]]; got != "m:input "+pricingQuantity(rows[0].InputTokens-rows[0].CachedInputTokens)+" 1000000 Tokens 0.6" {
		t.Errorf("first row SKU, pricing quantity, unit and unit price: %q", got)
	}
}

func pricingQuantity(tokens uint64) string {
	r := new(big.Rat).SetFrac(new(big.Int).SetUint64(tokens), big.NewInt(1_000_000))
	s := r.FloatString(6)
	for s[len(s)-1] == '0' {
		s = s[:len(s)-1]
	}
	if s[len(s)-1] == '.' {
		s = s[:len(s)-1]
	}
	return s
}
