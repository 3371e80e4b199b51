package billing

import (
	"errors"
	"fmt"
	"math/big"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// parseFixed reads a printed amount ("-12.340", "105") as minor units.
func parseFixed(t *testing.T, s string) int64 {
	t.Helper()
	m, err := ParseMoney(s)
	if err != nil {
		t.Fatalf("printed amount %q: %v", s, err)
	}
	return int64(m)
}

// genStatement is a statement of n usage lines and some charges with odd
// nano amounts (some negative), its Charge their sum and Total that
// rounded as a close rounds it.
func genStatement(t *testing.T, r *rand.Rand, code string, n int) Statement {
	t.Helper()
	st := Statement{Tenant: "acme", Period: "2026-11", Zone: "+05:30", Currency: code,
		PeriodStart: time.Date(2026, 10, 31, 18, 30, 0, 0, time.UTC), PeriodEnd: time.Date(2026, 11, 30, 18, 30, 0, 0, time.UTC)}
	amount := func() Money {
		switch r.IntN(4) {
		case 0:
			return Money(r.Int64N(1_000)) // sub-cent
		case 1:
			return Money(r.Int64N(5_000_000_000)*1_000 + 500_000) // exact halves of some units
		default:
			return Money(r.Int64N(50_000_000_000_000)) // odd nanos up to 50,000
		}
	}
	for i := range n {
		l := StatementLine{Kind: LineUsage, Model: fmt.Sprintf("m%03d", i), Priced: true, InputTokens: uint64(r.IntN(1e9)), Charge: amount()}
		if i%7 == 3 {
			l.Kind, l.OriginalPeriod = LineAdjustment, "2026-10"
		}
		st.Lines = append(st.Lines, l)
	}
	for i := range r.IntN(n/3 + 1) {
		kind := []ChargeKind{ChargeDiscount, ChargeCommitment, ChargeDedicated, ChargeCredit}[i%4]
		a := amount()
		if kind == ChargeDiscount || kind == ChargeCredit {
			a = -a / 3
		}
		st.Charges = append(st.Charges, Charge{Kind: kind, Description: string(kind), Line: -1, Amount: a})
	}
	for _, l := range st.Lines {
		st.Charge += l.Charge
	}
	for _, c := range st.Charges {
		st.Charge += c.Amount
	}
	var err error
	if st.Total, st.Rounding, err = roundToMinorUnit(st.Charge, code); err != nil {
		t.Fatal(err)
	}
	st.Hash, _ = st.ContentHash()
	return st
}

// TestInvoiceLinesAddUp: on generated statements (1 to 400 lines and
// charges of odd nano amounts, negative ones among them) in currencies of
// 0, 2 and 3 minor digits, the printed lines add up exactly to the printed
// subtotal, which is the statement's total; each line is less than one
// minor unit off its exact amount; the tax is the subtotal times the rate
// rounded once; the printed total is subtotal plus tax.
func TestInvoiceLinesAddUp(t *testing.T) {
	r := rand.New(rand.NewPCG(32, 5))
	for _, tc := range []struct {
		code   string
		digits int
	}{{"JPY", 0}, {"USD", 2}, {"EUR", 2}, {"KWD", 3}, {"BHD", 3}} {
		for round := range 60 {
			n := 1 + r.IntN(400)
			if round < 5 {
				n = round + 1
			}
			st := genStatement(t, r, tc.code, n)
			acc := &Accounts{Operator: Operator{InvoicePrefix: "EI-"},
				Tenants: []TenantAccount{{ID: "acme", Name: "Acme", TaxName: "GST", TaxRate: Weight(r.Int64N(300_000_000))}}}
			inv, err := NewInvoice(st, time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC), acc, uint64(round+1))
			if err != nil {
				t.Fatalf("%s, %d lines: %v", tc.code, n, err)
			}
			if inv.MinorDigits != tc.digits {
				t.Fatalf("%s: minor digits %d, want %d", tc.code, inv.MinorDigits, tc.digits)
			}
			if got, want := len(inv.Lines), len(st.Lines)+len(st.Charges); got != want {
				t.Fatalf("%d invoice lines, want %d", got, want)
			}
			unit := pow10(9 - tc.digits)
			var printed int64
			for i, l := range inv.Lines {
				p := l.Amount.StringFixed(tc.digits)
				if parseFixed(t, p) != int64(l.Amount) || int64(l.Amount)%unit != 0 {
					t.Fatalf("line %d: amount %s is not whole minor units (printed %s)", i, l.Amount, p)
				}
				if d := int64(l.Amount - l.Exact); d <= -unit || d >= unit {
					t.Fatalf("line %d: amount %s is a minor unit or more off its exact %s", i, l.Amount, l.Exact)
				}
				printed += parseFixed(t, p)
			}
			sub := inv.Subtotal.StringFixed(tc.digits)
			if printed != parseFixed(t, sub) || inv.Subtotal != st.Total {
				t.Fatalf("%s, %d lines: printed lines add up to %s, printed subtotal %s, statement total %s",
					tc.code, n, Money(printed).StringFixed(tc.digits), sub, st.Total)
			}
			want := brutalTax(st.Total, inv.TaxRate, unit)
			if int64(inv.Tax) != want {
				t.Fatalf("%s: tax of %s at %s: got %s, want %s", tc.code, st.Total, inv.TaxRate, inv.Tax, Money(want))
			}
			if parseFixed(t, sub)+parseFixed(t, inv.Tax.StringFixed(tc.digits)) != parseFixed(t, inv.Total.StringFixed(tc.digits)) {
				t.Fatalf("printed subtotal %s + tax %s != total %s", sub, inv.Tax.StringFixed(tc.digits), inv.Total.StringFixed(tc.digits))
			}
		}
	}
}

// brutalTax rounds subtotal×rate to the minor unit in exact rationals:
// the nearest whole number of minor units, half away from zero.
func brutalTax(subtotal Money, rate Weight, unit int64) int64 {
	x := new(big.Rat).SetFrac(new(big.Int).Mul(big.NewInt(int64(subtotal)), big.NewInt(int64(rate))),
		new(big.Int).Mul(big.NewInt(nanosPerUnit), big.NewInt(unit)))
	abs := new(big.Rat).Abs(x)
	abs.Add(abs, big.NewRat(1, 2))
	n := new(big.Int).Quo(abs.Num(), abs.Denom()) // floor(|x| + 1/2)
	if x.Sign() < 0 {
		n.Neg(n)
	}
	return n.Int64() * unit
}

// TestSplitToMinorUnitLargestRemainder: the units go to the largest
// remainders, earlier lines first on ties, and a total that is not the
// sum's rounding is refused.
func TestSplitToMinorUnitLargestRemainder(t *testing.T) {
	const cent = 10_000_000
	for _, tc := range []struct {
		name  string
		exact []Money
		total Money
		want  []Money
	}{
		{"thirds", []Money{cent / 3, cent / 3, cent / 3}, 0, []Money{0, 0, 0}},
		{"thirds of two cents", []Money{2 * cent / 3, 2 * cent / 3, 2*cent/3 + 2}, 2 * cent, []Money{cent, 0, cent}},
		{"ties go to the earlier", []Money{cent / 2, cent / 2}, cent, []Money{cent, 0}},
		{"negative", []Money{-cent / 4, 3 * cent / 2, -1}, cent, []Money{0, cent, 0}},
		{"whole", []Money{5 * cent, -2 * cent}, 3 * cent, []Money{5 * cent, -2 * cent}},
	} {
		got, err := SplitToMinorUnit(tc.exact, tc.total, cent)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s: (-want +got)\n%s", tc.name, diff)
		}
	}
	if _, err := SplitToMinorUnit([]Money{cent / 3}, 2*cent, cent); err == nil {
		t.Error("a total two cents off the lines: no error")
	}
	if _, err := SplitToMinorUnit([]Money{cent / 3}, cent/2, cent); err == nil {
		t.Error("a total that is not whole cents: no error")
	}
}

// TestTaxRounding: the tax is rounded once, half away from zero, in the
// currency's minor unit.
func TestTaxRounding(t *testing.T) {
	for _, tc := range []struct {
		code, subtotal, rate, want string
	}{
		{"USD", "10.01", "0.18", "1.8"},           // 1.8018
		{"USD", "0.05", "0.1", "0.01"},            // 0.005: half, away from zero
		{"USD", "-0.05", "0.1", "-0.01"},          // a negative subtotal (a repricing): away from zero too
		{"USD", "0.04", "0.1", "0"},               // 0.004
		{"USD", "1234567.89", "0.2", "246913.58"}, // 246913.578
		{"JPY", "105", "0.1", "11"},               // 10.5
		{"JPY", "104", "0.1", "10"},               // 10.4
		{"KWD", "1.005", "0.5", "0.503"},          // 0.5025
		{"KWD", "1.001", "0.05", "0.05"},          // 0.05005
		{"USD", "99.99", "0", "0"},
	} {
		digits, unit, err := MinorUnit(tc.code)
		if err != nil {
			t.Fatal(err)
		}
		sub, _ := ParseMoney(tc.subtotal)
		rate, _ := ParseWeight(tc.rate)
		got, err := TaxOf(sub, rate, unit)
		if err != nil {
			t.Fatal(err)
		}
		if want, _ := ParseMoney(tc.want); got != want {
			t.Errorf("%s %s at %s: tax %s (%s), want %s", tc.code, tc.subtotal, tc.rate, got, got.StringFixed(digits), tc.want)
		}
	}
}

// TestInvoiceDatesAndParties: the issue date is the close's date in the
// tenant's zone, the due date the payment terms after it; seller, buyer,
// numbering and tax name come from the accounts file.
func TestInvoiceDatesAndParties(t *testing.T) {
	st := Statement{Tenant: "acme", Period: "2026-11", Zone: "+05:30", Currency: "USD", Hash: "h0",
		Lines: []StatementLine{{Kind: LineUsage, Model: "llama", Priced: true, InputTokens: 1000, Charge: 1_234_567_891}}}
	st.Charge = 1_234_567_891
	st.Total, st.Rounding, _ = roundToMinorUnit(st.Charge, "USD")
	acc := &Accounts{
		Operator: Operator{Seller: Party{Name: "Example Inference Ltd", TaxID: "US12"}, InvoicePrefix: "EI-", PaymentTermsDays: 30},
		Tenants:  []TenantAccount{{ID: "acme", Name: "Acme Corp", BillingAccountID: "acme-billing", TaxName: "GST", TaxRate: 180_000_000}},
	}
	// 20:00 UTC on 1 December is 01:30 on 2 December in +05:30.
	inv, err := NewInvoice(st, time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC), acc, 42)
	if err != nil {
		t.Fatal(err)
	}
	if inv.Number != "EI-000042" || inv.IssueDate != "2026-12-02" || inv.DueDate != "2027-01-01" {
		t.Errorf("number %s, issued %s, due %s; want EI-000042, 2026-12-02, 2027-01-01", inv.Number, inv.IssueDate, inv.DueDate)
	}
	if inv.Seller.Name != "Example Inference Ltd" || inv.Buyer.Name != "Acme Corp" || inv.BillingAccountID != "acme-billing" || inv.TaxName != "GST" {
		t.Errorf("seller %q, buyer %q, account %q, tax %q", inv.Seller.Name, inv.Buyer.Name, inv.BillingAccountID, inv.TaxName)
	}
	if inv.Subtotal != 1_230_000_000 || inv.Tax != 220_000_000 || inv.Total != 1_450_000_000 {
		t.Errorf("subtotal %s, tax %s, total %s; want 1.23, 0.22 (0.2214), 1.45", inv.Subtotal, inv.Tax, inv.Total)
	}
	// No accounts file: default terms, the tenant id as buyer, no tax.
	inv, err = NewInvoice(st, time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	if inv.Number != "000001" || inv.Buyer.Name != "acme" || inv.DueDate != "2026-12-31" || inv.Tax != 0 || inv.Total != inv.Subtotal {
		t.Errorf("without accounts: %+v", inv)
	}
	if _, err := NewInvoice(st, time.Now(), nil, 0); !errors.Is(err, ErrInvalidInvoice) {
		t.Errorf("sequence 0: %v, want ErrInvalidInvoice", err)
	}
}

// TestCreditNoteNegates: a credit note negates every amount of its invoice
// (invoice plus credit note is zero on every line), in the same sequence.
func TestCreditNoteNegates(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	st := genStatement(t, r, "USD", 40)
	acc := &Accounts{Operator: Operator{InvoicePrefix: "INV-"}, Tenants: []TenantAccount{{ID: "acme", TaxRate: 70_000_000}}}
	inv, err := NewInvoice(st, time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), acc, 7)
	if err != nil {
		t.Fatal(err)
	}
	cn, err := NewCreditNote(inv, 8, time.Date(2026, 12, 9, 10, 0, 0, 0, time.UTC), "wrong tax rate")
	if err != nil {
		t.Fatal(err)
	}
	if cn.Kind != KindCreditNote || cn.Number != "INV-000008" || cn.Credits != "INV-000007" || cn.Reason != "wrong tax rate" || cn.IssueDate != "2026-12-09" {
		t.Errorf("credit note %s (%s) credits %q for %q, issued %s", cn.Number, cn.Kind, cn.Credits, cn.Reason, cn.IssueDate)
	}
	for i := range inv.Lines {
		if inv.Lines[i].Amount+cn.Lines[i].Amount != 0 || inv.Lines[i].Exact+cn.Lines[i].Exact != 0 {
			t.Fatalf("line %d: invoice %s, credit note %s", i, inv.Lines[i].Amount, cn.Lines[i].Amount)
		}
	}
	if inv.Subtotal+cn.Subtotal != 0 || inv.Tax+cn.Tax != 0 || inv.Total+cn.Total != 0 {
		t.Errorf("totals: invoice %s/%s/%s, credit note %s/%s/%s", inv.Subtotal, inv.Tax, inv.Total, cn.Subtotal, cn.Tax, cn.Total)
	}
	if _, err := NewCreditNote(cn, 9, time.Now(), "again"); !errors.Is(err, ErrInvalidInvoice) {
		t.Errorf("a credit note of a credit note: %v, want ErrInvalidInvoice", err)
	}
	if !strings.HasPrefix(cn.Number, "INV-") {
		t.Error(cn.Number)
	}
}

// BenchmarkNewInvoice: the invoice of a statement of 40 lines and charges
// (a tenant's month), lines cut by largest remainder, tax, encoding.
func BenchmarkNewInvoice(b *testing.B) {
	t := &testing.T{}
	st := genStatement(t, rand.New(rand.NewPCG(1, 1)), "USD", 40)
	acc := &Accounts{Operator: Operator{InvoicePrefix: "EI-"}, Tenants: []TenantAccount{{ID: "acme", TaxRate: 180_000_000}}}
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		inv, err := NewInvoice(st, at, acc, uint64(i+1))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := inv.Encode(); err != nil {
			b.Fatal(err)
		}
	}
}
