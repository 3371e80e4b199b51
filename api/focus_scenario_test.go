package api_test

import (
	"bytes"
	"context"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/api"
	"tokenmeter/billing"
	"tokenmeter/billing/closing"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	"tokenmeter/internal/testkit/billingtest"
	"tokenmeter/internal/testkit/focuscheck"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
)

// closeBookV1 is the price book of September: m and m2 at list prices; GPU
// idle cost kept apart (the __idle__ line).
const closeBookV1 = `{"currency":"USD",
 "gpu_prices":[{"gpu_type":"H100","effective_from":"2026-01-01T00:00:00Z","per_hour":"3.60"}],
 "token_prices":[
  {"model":"m","effective_from":"2026-01-01T00:00:00Z","input_per_1m":"0.60","cached_input_per_1m":"0.30","output_per_1m":"1.80"},
  {"model":"m2","effective_from":"2026-01-01T00:00:00Z","input_per_1m":"2.00","cached_input_per_1m":"1.00","output_per_1m":"6.00"}],
 "allocation":{"busy_policy":"tokens","idle_policy":"separate"}}`

// closeBookV2 adds, after September closed, m's price change at 12:30 UTC
// on October 15 (five decimals per 1M) and a new m2 price from September 1
// (the repricing of September), and edits m's cached input price of
// January 1 in place (0.30 to 0.3125: one SkuPriceId, one price).
const closeBookV2 = `{"currency":"USD",
 "gpu_prices":[{"gpu_type":"H100","effective_from":"2026-01-01T00:00:00Z","per_hour":"3.60"}],
 "token_prices":[
  {"model":"m","effective_from":"2026-01-01T00:00:00Z","input_per_1m":"0.60","cached_input_per_1m":"0.3125","output_per_1m":"1.80"},
  {"model":"m","effective_from":"2026-10-15T12:30:00Z","input_per_1m":"0.61234","cached_input_per_1m":"0.30617","output_per_1m":"1.83703"},
  {"model":"m2","effective_from":"2026-01-01T00:00:00Z","input_per_1m":"2.00","cached_input_per_1m":"1.00","output_per_1m":"6.00"},
  {"model":"m2","effective_from":"2026-09-01T00:00:00Z","input_per_1m":"2.20","cached_input_per_1m":"1.10","output_per_1m":"6.60"}],
 "allocation":{"busy_policy":"tokens","idle_policy":"separate"}}`

// closeAccounts names the operator and the tenants; acme bills in +05:30,
// globex has a contract (10% off, m2's output at a rate card price from
// October, a monthly commitment above its usage) and initech a free
// allowance of m's input tokens and 18% VAT on its invoices.
const closeAccounts = `{"operator":{"provider_name":"Example AI","publisher_name":"Example AI","invoice_issuer_name":"Example AI Ltd"},
 "tenants":[{"id":"acme","name":"Acme Corp","zone":"+05:30"},
  {"id":"globex","name":"Globex Inc","contract":{"discount_percent":"10",
   "rate_card":[{"model":"m2","effective_from":"2026-10-01T00:00:00Z","output_per_1m":"5.123456"}],
   "commitment":{"monthly_spend":"5.00"}}},
  {"id":"initech","name":"Initech LLC","tax_name":"VAT","tax_rate":"0.18","contract":{"allowances":[{"model":"m","token_kind":"input","tokens":100000}]}}]}`

var closeTenants = []string{"acme", "globex", "initech"}

// closeScenarioHours are the hours of usage: both sides of each month's
// edges in UTC and +05:30 (18:30 UTC), mid-September, and the hours around
// m's price change on October 15.
func closeScenarioHours() []time.Time {
	var hours []time.Time
	for _, edge := range []time.Time{
		time.Date(2026, 8, 31, 17, 0, 0, 0, time.UTC), time.Date(2026, 9, 30, 17, 0, 0, 0, time.UTC),
		time.Date(2026, 10, 15, 11, 0, 0, 0, time.UTC), time.Date(2026, 10, 31, 17, 0, 0, 0, time.UTC),
	} {
		for h := range 3 {
			hours = append(hours, edge.Add(time.Duration(h)*time.Hour))
		}
	}
	return append(hours, time.Date(2026, 9, 15, 10, 0, 0, 0, time.UTC), time.Date(2026, 9, 30, 23, 0, 0, 0, time.UTC),
		time.Date(2026, 10, 31, 23, 0, 0, 0, time.UTC))
}

// closeScenarioEvents are four events per tenant and model in each hour, at
// minutes 5, 20, 35 and 50.
func closeScenarioEvents(prefix string, hours []time.Time) []*meterv1.InferenceEvent {
	var events []*meterv1.InferenceEvent
	for i, h := range hours {
		for j, tenant := range closeTenants {
			for k, model := range []string{"m", "m2"} {
				for m := range 4 {
					events = append(events, &meterv1.InferenceEvent{
						EventId: fmt.Sprintf("%s-%d-%s-%s-%d", prefix, i, tenant, model, m), TenantId: tenant, Model: model,
						Deployment: "d1", Region: "eu-west-1",
						CompletedAt:  timestamppb.New(h.Add(time.Duration(5+15*m) * time.Minute)),
						PromptTokens: proto.Int64(int64(12345 + 1000*i + 100*j + 10*k + m)), CachedPromptTokens: proto.Int64(int64(1000 * m)),
						OutputTokens: proto.Int64(int64(777 + 10*i + j + m)), TtftMs: proto.Float64(10), E2EMs: proto.Float64(20),
					})
				}
			}
		}
	}
	return events
}

func closeScenarioGPUs(t *testing.T, store *chstore.Store, hours []time.Time) {
	t.Helper()
	var gpus chstore.GPUBatch
	for i, h := range hours {
		for k := range 360 {
			gpus.Append(&meterv1.GpuSample{SampleId: fmt.Sprintf("g%d-%d", i, k), GpuUuid: "GPU-1", GpuType: "H100", Deployment: "d1",
				Region: "eu-west-1", SampledAt: timestamppb.New(h.Add(time.Duration(k) * 10 * time.Second)), IntervalS: 10, Utilization: 0.4}, time.Now())
		}
	}
	if err := store.InsertGPUSamples(t.Context(), &gpus); err != nil {
		t.Fatal(err)
	}
}

// closeScenarioService sets up the month-end close scenario in store: the
// price book closeBookV1 in force, the scenario's usage and GPU samples of
// closeScenarioHours rolled up, and a closing service over them under the
// accounts file closeAccounts (its zones, lines by deployment), which it
// returns with the accounts.
func closeScenarioService(t *testing.T, store *chstore.Store, accountsDoc string) (*closing.Service, *billing.Accounts) {
	t.Helper()
	putPriceBook(t, store, closeBookV1)
	accounts, err := billing.ParseAccounts([]byte(accountsDoc))
	if err != nil {
		t.Fatal(err)
	}
	zones, err := accounts.Zones()
	if err != nil {
		t.Fatal(err)
	}
	hours := closeScenarioHours()
	chstoretest.Insert(t, store, closeScenarioEvents("e", hours))
	closeScenarioGPUs(t, store, hours)
	billingtest.RollUp(t, store)
	svc, err := closing.NewService(closing.Deps{Reads: query.New(store, query.Config{}), Store: store, Credits: store,
		Prices: func(ctx context.Context) (*billing.PriceBook, error) { return billing.BookInForce(ctx, store) }},
		closing.Config{Zones: zones, ByDeployment: true, Accounts: accounts})
	if err != nil {
		t.Fatal(err)
	}
	return svc, accounts
}

// putPriceBook records the price book doc in store, in force from now.
func putPriceBook(t *testing.T, store *chstore.Store, doc string) {
	t.Helper()
	book, err := billing.ParsePriceBook([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := billing.EnsurePriceBook(t.Context(), store, book, "scenario", time.Now()); err != nil {
		t.Fatal(err)
	}
}

// scenarioFile is one exported FOCUS file.
type scenarioFile struct {
	name    string
	data    []byte
	parquet bool
	// statements: the statement file of period (Payable from its
	// statements); else usage-cost.
	statements bool
	period     string
	tenant     string // the tenant view's tenant; "": finance, every tenant
	// start and end bound a usage-cost file's range.
	start, end time.Time
	// header is the export's gRPC header metadata: a CSV file's FOCUS
	// metadata.
	header metadata.MD
}

// TestFocusMonthEndClose runs a month-end close like the FinOps review's
// and checks every FOCUS file it exports against the FOCUS 1.2 rules
// (package focuscheck), each rule a named subtest: three tenants (acme in
// +05:30, globex on a contract with a discount, a rate card and a
// commitment, initech with a free allowance and a promotional credit),
// September closed, late September usage, a price book that
// changes m mid-October at a price of five decimals per 1M and reprices
// m2 for September, October closed with the repricing; then the statement
// files (CSV and Parquet, finance and tenant views) of both months and the
// usage-cost files (hour and day steps) covering both, each checked. The
// statement files must sum to each statement's payable total exactly; the
// usage-cost files of a closed month must tie out, to the cent, to what
// the statements billed for that month's usage, under the book that
// billed it; no file has a row of the __idle__ pseudo-tenant. The
// statement files' invoices are the invoices' (InvoiceId their number,
// BilledCost summing to their payable total, tax included).
func TestFocusMonthEndClose(t *testing.T) {
	ctx := t.Context()
	store := chstoretest.OpenMigrated(t)
	svc, accounts := closeScenarioService(t, store, closeAccounts)
	s := startBillingAPI(t, store, svc, api.Config{})
	// initech's promotional credit, drawn by September's close.
	if _, _, err := svc.CreateGrant(ctx, billing.CreditGrant{ID: "promo-1", Tenant: "initech", Kind: billing.CreditPromotional,
		Amount: 500_000_000, Currency: "USD", EffectiveFrom: time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC),
		ExpiresAt: time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)}); err != nil {
		t.Fatal(err)
	}
	admin := withKey(testKeys["admin"])

	if _, err := s.client.CloseBillingPeriod(admin, &meterv1.CloseBillingPeriodRequest{Period: "2026-09"}); err != nil {
		t.Fatalf("close 2026-09: %v", err)
	}
	// Late usage of September, after its close.
	late := []time.Time{time.Date(2026, 9, 20, 10, 0, 0, 0, time.UTC)}
	chstoretest.Insert(t, store, closeScenarioEvents("late", late))
	closeScenarioGPUs(t, store, late)
	putPriceBook(t, store, closeBookV2)
	billingtest.RollUp(t, store)
	if _, err := s.client.CloseBillingPeriod(admin, &meterv1.CloseBillingPeriodRequest{Period: "2026-10", RepricePeriods: []string{"2026-09"}}); err != nil {
		t.Fatalf("close 2026-10: %v", err)
	}

	statements := map[string]map[string]billing.Statement{} // period → tenant → statement
	invoices := map[string]map[string]billing.Invoice{}     // period → tenant → invoice
	for _, period := range []string{"2026-09", "2026-10"} {
		statements[period] = map[string]billing.Statement{}
		invoices[period] = map[string]billing.Invoice{}
		for _, tenant := range closeTenants {
			iv, err := svc.Invoice(ctx, tenant, period)
			if err != nil {
				t.Fatal(err)
			}
			invoices[period][tenant] = iv.Invoice
			v, err := svc.Statement(ctx, tenant, period, true)
			if err != nil {
				t.Fatal(err)
			}
			if !v.Closed {
				t.Fatalf("%s of %s is not closed", period, tenant)
			}
			statements[period][tenant] = v.Statement
		}
	}
	var adjusted, repriced bool
	for _, l := range statements["2026-10"]["globex"].Lines {
		adjusted = adjusted || (l.Kind == billing.LineAdjustment && l.OriginalPeriod == "2026-09")
		repriced = repriced || l.Kind == billing.LineRepricing
	}
	if !adjusted || !repriced {
		t.Fatalf("October's statement has late usage %v, a repricing %v: the scenario needs both", adjusted, repriced)
	}
	kinds := func(st billing.Statement) map[billing.ChargeKind]bool {
		m := map[billing.ChargeKind]bool{}
		for _, c := range st.Charges {
			m[c.Kind] = true
		}
		return m
	}
	if k := kinds(statements["2026-10"]["globex"]); !k[billing.ChargeDiscount] || !k[billing.ChargeCommitment] {
		t.Fatalf("globex's October has charges %v: the scenario needs contract discounts and a commitment true-up", k)
	}
	if k := kinds(statements["2026-09"]["initech"]); !k[billing.ChargeCredit] || !k[billing.ChargeDiscount] {
		t.Fatalf("initech's September has charges %v: the scenario needs a credit drawn and an allowance", k)
	}
	if iv := invoices["2026-10"]["initech"]; iv.Tax <= 0 || iv.Total != iv.Subtotal+iv.Tax {
		t.Fatalf("initech's October invoice: subtotal %s, tax %s, total %s: the scenario needs a tax line", iv.Subtotal, iv.Tax, iv.Total)
	}

	files := exportScenarioFiles(t, s)
	if dir := os.Getenv("FOCUS_SCENARIO_DIR"); dir != "" { // keep the files to look at them
		for _, f := range files {
			if err := os.WriteFile(filepath.Join(dir, f.name), f.data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	skuPrices := map[string]string{} // SkuPriceId → ListUnitPrice, over every file
	skuPriceFile := map[string]string{}
	for _, f := range files {
		t.Run(f.name, func(t *testing.T) {
			var d *focuscheck.Dataset
			var err error
			if f.parquet {
				d, err = focuscheck.ReadParquet(f.name, f.data)
			} else {
				d, err = focuscheck.ReadCSV(f.name, bytes.NewReader(f.data))
			}
			if err != nil {
				t.Fatal(err)
			}
			if !f.parquet {
				d.Metadata = map[string]string{}
				for k, v := range f.header {
					d.Metadata[k] = strings.Join(v, ",")
				}
			}
			if len(d.Rows) == 0 {
				t.Fatalf("%s has no rows", f.name)
			}
			p := focuscheck.Profile{AccountNaming: true, Regions: true, SubAccounts: true, UnitPricing: true,
				UsageMeasurement: true, NegotiatedPricing: true, Resources: f.tenant == ""}
			if f.statements {
				p.Invoices = true
				p.Payable = map[string]string{}
				for tenant, iv := range invoices[f.period] {
					if f.tenant == "" || f.tenant == tenant {
						p.Payable[focuscheck.PayableKey(billingAccountID(accounts, tenant), iv.PeriodStart.UTC().Format(time.RFC3339))] = iv.Total.String()
					}
				}
			}
			focuscheck.Run(t, d, p)
			t.Run("Scenario/SkuPriceIdOnePriceAcrossFiles", func(t *testing.T) {
				for i := range d.Rows {
					id, price := d.Get(i, "SkuPriceId"), d.Get(i, "ListUnitPrice")
					if id.Null || price.Null || d.Get(i, "ChargeClass").Text == "Correction" {
						continue
					}
					r, ok := new(big.Rat).SetString(price.Text)
					if !ok {
						continue // TypeDecimal reports it
					}
					if was, ok := skuPrices[id.Text]; ok && was != r.RatString() {
						t.Fatalf("SkuPriceId %s: ListUnitPrice %s here, %s in %s", id.Text, r.RatString(), was, skuPriceFile[id.Text])
					}
					skuPrices[id.Text], skuPriceFile[id.Text] = r.RatString(), f.name
				}
			})
			t.Run("Scenario/NoIdleBillingAccount", func(t *testing.T) {
				for i := range d.Rows {
					if v := d.Get(i, "BillingAccountId"); v.Text == billing.IdleTenant || d.Get(i, "SubAccountId").Text == billing.IdleTenant {
						t.Fatalf("row %d bills the %s pseudo-tenant", i+1, billing.IdleTenant)
					}
				}
			})
			if f.statements {
				t.Run("Scenario/InvoiceIdIsTheInvoiceNumber", func(t *testing.T) {
					for i := range d.Rows {
						account, id := d.Get(i, "BillingAccountId").Text, d.Get(i, "InvoiceId").Text
						for tenant, iv := range invoices[f.period] {
							if billingAccountID(accounts, tenant) == account && id != iv.Number {
								t.Fatalf("row %d of %s: InvoiceId %q, its invoice is %s", i+1, account, id, iv.Number)
							}
						}
					}
				})
			}
			t.Run("Scenario/AccountNames", func(t *testing.T) {
				for i := range d.Rows {
					account := d.Get(i, "BillingAccountId").Text
					if got, want := d.Get(i, "BillingAccountName").Text, accounts.Tenant(account).DisplayName(); got != want {
						t.Fatalf("row %d: BillingAccountName %q of %s, want the accounts file's %q", i+1, got, account, want)
					}
				}
			})
			if f.tenant != "" {
				t.Run("Scenario/TenantViewHidesDeploymentsAndCost", func(t *testing.T) {
					for _, c := range []string{"x_AllocatedCost", "x_Margin"} {
						if d.Has(c) {
							t.Errorf("a tenant's file has %s", c)
						}
					}
					for i := range d.Rows {
						for _, c := range []string{"ResourceId", "ResourceName", "x_Deployment", "x_PriceBook"} {
							if v := d.Get(i, c); !v.Null && v.Text != "" {
								t.Fatalf("row %d: %s %q in a tenant's file", i+1, c, v.Text)
							}
						}
						if desc := d.Get(i, "ChargeDescription").Text; strings.Contains(desc, "d1") {
							t.Fatalf("row %d: ChargeDescription %q names the deployment", i+1, desc)
						}
					}
				})
			}
			t.Run("Scenario/OperatorNames", func(t *testing.T) {
				for i := range d.Rows {
					if got := d.Get(i, "ProviderName").Text + "|" + d.Get(i, "PublisherName").Text + "|" + d.Get(i, "InvoiceIssuerName").Text; got != "Example AI|Example AI|Example AI Ltd" {
						t.Fatalf("row %d: provider|publisher|issuer %s, want the accounts file's", i+1, got)
					}
				}
			})
			if !f.statements && f.tenant == "" {
				t.Run("Scenario/UsageCostTiesOutToStatements", func(t *testing.T) {
					tieOut(t, d, f.start, f.end, statements, accounts)
				})
			}
		})
	}
}

// billingAccountID is tenant's BillingAccountId: its account's, or its id.
func billingAccountID(a *billing.Accounts, tenant string) string {
	if id := a.Tenant(tenant).BillingAccountID; id != "" {
		return id
	}
	return tenant
}

// tieOut checks that the usage-cost rows of each closed month (the rows
// whose billing period is a closed statement's) sum, to the cent, to what
// the statements billed for that month's usage: the month's usage lines
// and the late usage of it in later statements (repricings excluded: a
// closed month's usage-cost is priced with the book that billed it).
func tieOut(t *testing.T, d *focuscheck.Dataset, start, end time.Time, statements map[string]map[string]billing.Statement, accounts *billing.Accounts) {
	t.Helper()
	type key struct{ account, start string }
	got := map[key]*big.Rat{}
	for i := range d.Rows {
		k := key{d.Get(i, "BillingAccountId").Text, d.Get(i, "BillingPeriodStart").Text}
		v, ok := new(big.Rat).SetString(d.Get(i, "BilledCost").Text)
		if !ok {
			t.Fatalf("row %d: BilledCost %q", i+1, d.Get(i, "BilledCost").Text)
		}
		if got[k] == nil {
			got[k] = new(big.Rat)
		}
		got[k].Add(got[k], v)
	}
	for period, byTenant := range statements {
		for tenant, st := range byTenant {
			if st.PeriodStart.Before(start) || st.PeriodEnd.After(end) {
				continue // this file does not cover the month
			}
			k := key{billingAccountID(accounts, tenant), st.PeriodStart.UTC().Format(time.RFC3339)}
			sum := got[k]
			if sum == nil {
				t.Errorf("%s %s: no usage-cost rows", tenant, period)
				continue
			}
			var want billing.Money
			for _, later := range statements {
				for _, l := range later[tenant].Lines {
					if (l.Kind == billing.LineUsage && later[tenant].Period == period) || (l.Kind == billing.LineAdjustment && l.OriginalPeriod == period) {
						want += l.Charge
					}
				}
			}
			if c := cents(sum); c != want.StringFixed(2) {
				t.Errorf("%s %s: usage-cost BilledCost sums to %s (%s), the statements billed %s for its usage", tenant, period, c, sum.FloatString(9), want)
			}
		}
	}
}

// cents is r rounded half to even to cents.
func cents(r *big.Rat) string {
	scaled := new(big.Rat).Mul(r, big.NewRat(100, 1))
	q, m := new(big.Int).QuoRem(scaled.Num(), scaled.Denom(), new(big.Int))
	twice := new(big.Int).Mul(new(big.Int).Abs(m), big.NewInt(2))
	if c := twice.Cmp(scaled.Denom()); c > 0 || (c == 0 && q.Bit(0) == 1) {
		if scaled.Sign() < 0 {
			q.Sub(q, big.NewInt(1))
		} else {
			q.Add(q, big.NewInt(1))
		}
	}
	return billing.Money(new(big.Int).Mul(q, big.NewInt(10_000_000)).Int64()).StringFixed(2)
}

// exportScenarioFiles exports every FOCUS file of the scenario over gRPC:
// statements of both months, usage-cost of both months by hour and by day;
// CSV and Parquet; the finance view (every tenant) and acme's.
func exportScenarioFiles(t *testing.T, s *billStack) []scenarioFile {
	t.Helper()
	var files []scenarioFile
	views := []struct{ tenant, key string }{{"", testKeys["finance"]}, {"acme", testKeys["tenant"]}}
	for _, format := range []string{"focus-csv", "focus-parquet"} {
		for _, v := range views {
			for _, period := range []string{"2026-09", "2026-10"} {
				stream, err := s.client.ExportStatements(withKey(v.key), &meterv1.ExportStatementsRequest{Period: period, TenantId: v.tenant, Format: format})
				chunks, err := drain(stream, err)
				if err != nil {
					t.Fatalf("export statements %s %s %s: %v", period, v.tenant, format, err)
				}
				header, _ := stream.Header()
				files = append(files, scenarioFile{name: chunks[0].GetFileName(), data: joined(chunks), parquet: format == "focus-parquet",
					statements: true, period: period, tenant: v.tenant, header: header})
			}
			ranges := []struct {
				step       string
				start, end time.Time
			}{
				{"hour", time.Date(2026, 8, 31, 18, 0, 0, 0, time.UTC), time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)},
				{"hour", time.Date(2026, 9, 30, 18, 0, 0, 0, time.UTC), time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)},
				{"day", time.Date(2026, 8, 31, 0, 0, 0, 0, time.UTC), time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)},
				{"day", time.Date(2026, 9, 30, 0, 0, 0, 0, time.UTC), time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)},
			}
			for _, r := range ranges {
				stream, err := s.client.ExportUsageCost(withKey(v.key), &meterv1.ExportUsageCostRequest{TenantId: v.tenant, Format: format,
					Start: timestamppb.New(r.start), End: timestamppb.New(r.end), Step: r.step})
				chunks, err := drain(stream, err)
				if err != nil {
					t.Fatalf("export usage-cost %s %s %s: %v", r.start, v.tenant, format, err)
				}
				header, _ := stream.Header()
				files = append(files, scenarioFile{name: chunks[0].GetFileName(), data: joined(chunks), parquet: format == "focus-parquet",
					tenant: v.tenant, start: r.start, end: r.end, header: header})
			}
		}
	}
	return files
}
