package api_test

import (
	"net/http"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	"tokenmeter/api"
	"tokenmeter/billing"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// TestContractAndCreditAnswers reads, over REST, what a contract and credit
// grants put on a closed statement and a balance: globex's September under
// its contract (10% off: a discount charge per line and token kind, with
// the model, deployment, tokens and contracted price; each line's
// contracted charge and discount) and initech's September drawing a
// promotional grant that expires with the month (the rest expires) and
// leaving a prepaid grant of priority 2 untouched (3.5 left), and acme's
// September on a dedicated deployment (the finance part's dedicated
// charge). Each figure must equal the stored statement's.
func TestContractAndCreditAnswers(t *testing.T) {
	ctx := t.Context()
	store := chstoretest.OpenMigrated(t)
	// acme's contract makes d1 its dedicated deployment: its September is
	// billed d1's GPU-hours (the finance part's dedicated charge).
	accounts := strings.Replace(closeAccounts, `{"id":"acme","name":"Acme Corp","zone":"+05:30"}`,
		`{"id":"acme","name":"Acme Corp","zone":"+05:30","contract":{"dedicated":[{"deployment":"d1","effective_from":"2026-01-01T00:00:00Z","per_gpu_hour":"2.5"}]}}`, 1)
	if accounts == closeAccounts {
		t.Fatal("the scenario's accounts changed: acme's entry not found")
	}
	svc, _ := closeScenarioService(t, store, accounts)
	s := startBillingAPI(t, store, svc, api.Config{})
	for _, g := range []string{
		`{"grant_id":"promo-sep","tenant_id":"initech","kind":"promotional","amount":"1000.123456789",
		  "effective_from":"2026-09-01T00:00:00Z","expires_at":"2026-10-01T00:00:00Z","description":"September trial"}`,
		`{"grant_id":"prepaid-1","tenant_id":"initech","kind":"prepaid","amount":"3.5","priority":2,
		  "effective_from":"2026-09-01T00:00:00Z","description":"prepaid"}`,
	} {
		r := s.get(t, "POST", "/v1/billing/credits/grants", testKeys["admin"], g)
		var resp meterv1.CreateCreditGrantResponse
		if r.code != http.StatusOK || protojson.Unmarshal(r.body, &resp) != nil {
			t.Fatalf("grant: %d %s", r.code, r.body)
		}
	}
	if r := s.get(t, "POST", "/v1/billing/periods/2026-09:close", testKeys["admin"], `{"tenant_ids":["acme","globex","initech"]}`); r.code != http.StatusOK {
		t.Fatalf("close 2026-09: %d %s", r.code, r.body)
	}
	stored := func(tenant string) billing.Statement {
		t.Helper()
		v, err := svc.Statement(ctx, tenant, "2026-09", false)
		if err != nil {
			t.Fatal(err)
		}
		return v.Statement
	}
	read := func(tenant string) *meterv1.Statement {
		t.Helper()
		r := s.get(t, "GET", "/v1/billing/statements/2026-09?tenant_id="+tenant, testKeys["finance"], "")
		var resp meterv1.GetStatementResponse
		if r.code != http.StatusOK || protojson.Unmarshal(r.body, &resp) != nil {
			t.Fatalf("statement of %s: %d %s", tenant, r.code, r.body)
		}
		return resp.GetStatement()
	}

	globex, wire := stored("globex"), read("globex")
	if len(wire.GetCharges()) != len(globex.Charges) || len(wire.GetLines()) != len(globex.Lines) {
		t.Fatalf("globex: API has %d charges and %d lines, the statement %d and %d", len(wire.GetCharges()), len(wire.GetLines()), len(globex.Charges), len(globex.Lines))
	}
	discounts := 0
	for i, c := range globex.Charges {
		a := wire.GetCharges()[i]
		if a.GetKind() != string(c.Kind) || a.GetAmount().GetAmount() != c.Amount.StringFixed(9) || a.GetModel() != c.Model ||
			a.GetDeployment() != c.Deployment || a.GetTokenKind() != c.TokenKind || a.GetQuantity() != c.Quantity ||
			a.GetUnit() != c.Unit || a.GetUnitPrice() != c.UnitPrice {
			t.Errorf("globex charge %d: API %v, statement %+v", i, a, c)
		}
		if c.Kind == billing.ChargeDiscount {
			discounts++
			if c.Model == "" || c.Deployment == "" || c.TokenKind == "" || c.Quantity == "" || c.Unit != "tokens" || c.UnitPrice == "" || c.Amount >= 0 {
				t.Errorf("globex discount %d is not a priced share of a line: %+v", i, c)
			}
		}
	}
	if discounts == 0 {
		t.Fatalf("globex's September has no discount: %+v", globex.Charges)
	}
	for i, l := range globex.Lines {
		a := wire.GetLines()[i]
		if l.ContractedCharge == nil || l.Discount == nil || *l.Discount >= 0 ||
			a.GetContractedCharge().GetAmount() != l.ContractedCharge.StringFixed(9) || a.GetDiscount().GetAmount() != l.Discount.StringFixed(9) {
			t.Errorf("globex line %d: API contracted %v discount %v, statement %v %v", i, a.GetContractedCharge(), a.GetDiscount(), l.ContractedCharge, l.Discount)
		}
	}

	initech, wire := stored("initech"), read("initech")
	if len(initech.Credits) != 2 || len(wire.GetCredits()) != 2 {
		t.Fatalf("initech's credits: statement %+v, API %v", initech.Credits, wire.GetCredits())
	}
	for i, c := range initech.Credits {
		a := wire.GetCredits()[i]
		if a.GetGrantId() != c.Grant || a.GetExpired().GetAmount() != c.Expired.StringFixed(9) || a.GetClosing().GetAmount() != c.Closing.StringFixed(9) ||
			a.GetDrawn().GetAmount() != c.Drawn.StringFixed(9) {
			t.Errorf("initech credit %d: API %v, statement %+v", i, a, c)
		}
		switch c.Grant {
		case "promo-sep": // drawn by the month, the rest expired with it
			if c.Drawn <= 0 || c.Closing != 0 || c.Drawn+c.Expired != 1000_123_456_789 {
				t.Errorf("promo-sep: %+v", c)
			}
		case "prepaid-1": // not drawn: promotional credit goes first
			if c.Drawn != 0 || c.Closing != 3_500_000_000 {
				t.Errorf("prepaid-1: %+v", c)
			}
		}
	}

	acme, wire := stored("acme"), read("acme")
	var dedicated billing.Money
	for _, c := range acme.Charges {
		if c.Kind == billing.ChargeDedicated {
			dedicated += c.Amount
		}
	}
	if dedicated <= 0 || wire.GetFinance().GetDedicatedCharge().GetAmount() != dedicated.StringFixed(9) {
		t.Errorf("acme's dedicated charges %s, the API's finance part %v", dedicated, wire.GetFinance())
	}

	r := s.get(t, "GET", "/v1/billing/credits/balance?tenant_id=initech", testKeys["finance"], "")
	var bal meterv1.GetCreditBalanceResponse
	if r.code != http.StatusOK || protojson.Unmarshal(r.body, &bal) != nil {
		t.Fatalf("balance: %d %s", r.code, r.body)
	}
	var promoExpired string
	for _, c := range initech.Credits {
		if c.Grant == "promo-sep" {
			promoExpired = c.Expired.StringFixed(9)
		}
	}
	got := map[string]*meterv1.CreditBalance{}
	for _, g := range bal.GetGrants() {
		got[g.GetGrant().GetGrantId()] = g
	}
	if p := got["promo-sep"]; p == nil || p.GetExpired().GetAmount() != promoExpired || p.GetRemaining().GetAmount() != "0.000000000" {
		t.Errorf("promo-sep's balance: %s", r.body)
	}
	if p := got["prepaid-1"]; p == nil || p.GetGrant().GetPriority() != 2 || p.GetRemaining().GetAmount() != "3.500000000" {
		t.Errorf("prepaid-1's balance: %s", r.body)
	}
	if len(bal.GetTotals()) != 1 || bal.GetTotals()[0].GetRemaining().GetAmount() != "3.500000000" {
		t.Errorf("initech's total balance: %s", r.body)
	}
}
