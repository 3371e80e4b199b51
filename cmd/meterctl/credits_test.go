package main

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"tokenmeter/api"
	"tokenmeter/internal/testkit/billingtest"
)

// TestBillingCreditCommands grants acme credit with meterctl (twice: the
// second stores nothing; a tenant key may not grant), closes October, and
// prints acme's statement (with its credit charge and the grant's
// balances), balance and ledger as acme's key sees them.
func TestBillingCreditCommands(t *testing.T) {
	_, svc := billingtest.New(t)
	addr := startAPI(t, &api.Services{Keys: billingKeys(t), Billing: svc})
	with := func(key string, args ...string) []string { return append(args, "--addr", addr, "--key", key) }
	grant := []string{"billing", "grant", "acme-welcome", "--tenant", "acme", "--kind", "promotional", "--amount", "0.001",
		"--from", "2026-10-01T00:00:00Z", "--expires", "2027-01-01T00:00:00Z", "--description", "welcome"}
	for _, want := range []string{"created", "already stored"} {
		out, _, err := runArgs(t, nil, with("tm_admin", grant...)...)
		if err != nil || !strings.Contains(out, "Grant acme-welcome: USD 0.001 promotional credit for acme") || !strings.Contains(out, want) {
			t.Fatalf("grant: %q, %v; want %q", out, err, want)
		}
	}
	var ae *apiError
	if _, _, err := runArgs(t, nil, with("tm_acme", grant...)...); !errors.As(err, &ae) || ae.Status != http.StatusForbidden {
		t.Errorf("grant with a tenant key: %v, want 403", err)
	}
	if _, _, err := runArgs(t, nil, with("tm_admin", "billing", "grant", "x", "--tenant", "acme")...); err == nil ||
		!strings.Contains(err.Error(), "--kind is required") || !strings.Contains(err.Error(), "--from is required") {
		t.Errorf("grant without --kind and --from: %v", err)
	}
	if _, _, err := runArgs(t, nil, with("tm_admin", "billing", "close", "2026-10", "--tenant", "acme,globex")...); err != nil {
		t.Fatal(err)
	}
	out, _, err := runArgs(t, nil, with("tm_acme", "billing", "statement", "2026-10")...)
	if err != nil || !strings.Contains(out, "grant:acme-welcome") || !strings.Contains(out, "USD -0.001") ||
		!strings.Contains(out, "CREDIT_GRANT") {
		t.Errorf("statement: %q, %v; want the credit charge and the grant's balances", out, err)
	}
	out, _, err = runArgs(t, nil, with("tm_acme", "billing", "credits")...)
	if err != nil || !strings.Contains(out, "acme-welcome") || !strings.Contains(out, "USD 0.001") ||
		!strings.Contains(out, "acme has USD 0.00 of credit left.") {
		t.Errorf("credits: %q, %v", out, err)
	}
	out, _, err = runArgs(t, nil, with("tm_acme", "billing", "credits", "--ledger")...)
	if err != nil || !strings.Contains(out, "draw") || !strings.Contains(out, "USD -0.001") || !strings.Contains(out, "2026-10") {
		t.Errorf("credits --ledger: %q, %v", out, err)
	}
}
