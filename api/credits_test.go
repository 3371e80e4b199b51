package api_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	"tokenmeter/api"
	"tokenmeter/billing"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// TestCreditsOverREST grants acme credit as admin over REST (the same
// grant twice is stored once, its id with other terms is 409, a tenant or
// finance key may not grant, a malformed grant is 400), closes October,
// and reads the balance and the ledger: acme's key gets acme's only and
// is refused globex's; finance reads every tenant. The statement's total
// is what is left to pay after the draw.
func TestCreditsOverREST(t *testing.T) {
	store, svc := newBillingData(t)
	s := startBillingAPI(t, store, svc, api.Config{})
	grant := `{"grant_id":"acme-welcome","tenant_id":"acme","kind":"promotional","amount":"0.001",
		"effective_from":"2026-10-01T00:00:00Z","expires_at":"2027-01-01T00:00:00Z","description":"welcome"}`
	for i, want := range []bool{true, false} {
		r := s.get(t, "POST", "/v1/billing/credits/grants", testKeys["admin"], grant)
		var resp meterv1.CreateCreditGrantResponse
		if r.code != http.StatusOK || protojson.Unmarshal(r.body, &resp) != nil {
			t.Fatalf("grant %d: %d %s", i, r.code, r.body)
		}
		if resp.GetCreated() != want || resp.GetGrant().GetAmount().GetNanos() != 1_000_000 || resp.GetGrant().GetCreatedBy() != "admin" {
			t.Errorf("grant %d: %s, want created %v", i, r.body, want)
		}
	}
	for _, c := range []struct {
		name, key, body string
		code            int
	}{
		{"other terms", testKeys["admin"], `{"grant_id":"acme-welcome","tenant_id":"acme","kind":"promotional","amount":"5","effective_from":"2026-10-01T00:00:00Z"}`, http.StatusConflict},
		{"tenant key", testKeys["tenant"], grant, http.StatusForbidden},
		{"finance key", testKeys["finance"], grant, http.StatusForbidden},
		{"bad kind", testKeys["admin"], `{"grant_id":"x","tenant_id":"acme","kind":"gift","amount":"5","effective_from":"2026-10-01T00:00:00Z"}`, http.StatusBadRequest},
		{"bad amount", testKeys["admin"], `{"grant_id":"x","tenant_id":"acme","kind":"prepaid","amount":"5.0000000001","effective_from":"2026-10-01T00:00:00Z"}`, http.StatusBadRequest},
		{"other currency", testKeys["admin"], `{"grant_id":"x","tenant_id":"acme","kind":"prepaid","amount":"5","currency":"EUR","effective_from":"2026-10-01T00:00:00Z"}`, http.StatusBadRequest},
	} {
		if r := s.get(t, "POST", "/v1/billing/credits/grants", c.key, c.body); r.code != c.code {
			t.Errorf("%s: %d %s, want %d", c.name, r.code, r.body, c.code)
		}
	}

	closeOctober(t, s)
	r := s.get(t, "GET", "/v1/billing/statements/2026-10?tenant_id=acme", testKeys["tenant"], "")
	var st meterv1.GetStatementResponse
	if r.code != http.StatusOK || protojson.Unmarshal(r.body, &st) != nil {
		t.Fatalf("statement: %d %s", r.code, r.body)
	}
	stored, ok, err := store.Statement(t.Context(), "acme", "2026-10")
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	var bill billing.Statement
	if err := json.Unmarshal(stored.Content, &bill); err != nil {
		t.Fatal(err)
	}
	var lines billing.Money
	for _, l := range bill.Lines {
		lines += l.Charge
	}
	if len(bill.Credits) != 1 || bill.Credits[0].Drawn != 1_000_000 || bill.Charge != lines-1_000_000 ||
		st.GetStatement().GetTotal().GetNanos() != int64(bill.Total) {
		t.Fatalf("acme's October: credits %+v, lines %s, charge %s, total %s (API %v)", bill.Credits, lines, bill.Charge, bill.Total, st.GetStatement().GetTotal())
	}
	// The API's statement shows the draw: a credit charge and the grant's
	// balance before and after.
	cr, ch := st.GetStatement().GetCredits(), st.GetStatement().GetCharges()
	if len(cr) != 1 || cr[0].GetGrantId() != "acme-welcome" || cr[0].GetOpening().GetNanos() != 1_000_000 || cr[0].GetDrawn().GetNanos() != 1_000_000 ||
		cr[0].GetClosing().GetNanos() != 0 || cr[0].GetExpiresAt() == nil || len(ch) != 1 || ch[0].GetKind() != "credit" ||
		ch[0].GetRule() != "grant:acme-welcome" || ch[0].GetAmount().GetNanos() != -1_000_000 {
		t.Errorf("the API's statement: credits %v, charges %v", cr, ch)
	}

	r = s.get(t, "GET", "/v1/billing/credits/balance", testKeys["tenant"], "")
	var bal meterv1.GetCreditBalanceResponse
	if r.code != http.StatusOK || protojson.Unmarshal(r.body, &bal) != nil {
		t.Fatalf("balance: %d %s", r.code, r.body)
	}
	if len(bal.GetGrants()) != 1 || bal.GetGrants()[0].GetDrawn().GetNanos() != 1_000_000 || bal.GetGrants()[0].GetRemaining().GetNanos() != 0 ||
		len(bal.GetTotals()) != 1 || bal.GetTotals()[0].GetRemaining().GetAmount() != "0.000000000" {
		t.Errorf("acme's balance: %s", r.body)
	}
	if r := s.get(t, "GET", "/v1/billing/credits/balance?tenant_id=globex", testKeys["tenant"], ""); r.code != http.StatusForbidden {
		t.Errorf("acme's key reading globex's balance: %d %s", r.code, r.body)
	}
	if r := s.get(t, "GET", "/v1/billing/credits/balance", testKeys["finance"], ""); r.code != http.StatusOK || protojson.Unmarshal(r.body, &bal) != nil ||
		len(bal.GetGrants()) != 1 {
		t.Errorf("finance's balance of every tenant: %d %s", r.code, r.body)
	}
	r = s.get(t, "GET", "/v1/billing/credits/ledger?tenant_id=acme", testKeys["tenant"], "")
	var led meterv1.ListCreditLedgerResponse
	if r.code != http.StatusOK || protojson.Unmarshal(r.body, &led) != nil {
		t.Fatalf("ledger: %d %s", r.code, r.body)
	}
	if len(led.GetEntries()) != 1 || led.GetEntries()[0].GetKind() != "draw" || led.GetEntries()[0].GetChange().GetNanos() != -1_000_000 ||
		led.GetEntries()[0].GetStatementHash() != stored.Hash || led.GetEntries()[0].GetPeriod() != "2026-10" {
		t.Errorf("acme's ledger: %s", r.body)
	}
}
