package main

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"tokenmeter/api"
	"tokenmeter/internal/testkit/billingtest"
)

// TestBillingInvoiceCommands closes October, prints acme's invoice as a
// table and as the printable page, voids the statement (a tenant key may
// not) and prints the reissued invoice, which replaces the first.
func TestBillingInvoiceCommands(t *testing.T) {
	_, svc := billingtest.New(t)
	addr := startAPI(t, &api.Services{Keys: billingKeys(t), Billing: svc})
	with := func(key string, args ...string) []string { return append(args, "--addr", addr, "--key", key) }
	if _, _, err := runArgs(t, nil, with("tm_admin", "billing", "close", "2026-10", "--tenant", "acme,globex")...); err != nil {
		t.Fatal(err)
	}
	out, _, err := runArgs(t, nil, with("tm_acme", "billing", "invoice", "2026-10")...)
	if err != nil || !strings.Contains(out, "Invoice 000001 of acme for 2026-10") || !strings.Contains(out, "Subtotal") || !strings.Contains(out, "Total") {
		t.Fatalf("invoice: %q, %v", out, err)
	}
	page, _, err := runArgs(t, nil, with("tm_finance", "billing", "invoice", "2026-10", "--tenant", "acme", "-o", "html")...)
	if err != nil || !strings.HasPrefix(page, "<!DOCTYPE html>") || !strings.Contains(page, `id="total"`) {
		t.Fatalf("invoice -o html: %.200q, %v", page, err)
	}
	js, _, err := runArgs(t, nil, with("tm_finance", "billing", "invoice", "2026-10", "--tenant", "acme", "-o", "json")...)
	var inv struct {
		Invoice struct {
			StatementHash string `json:"statement_hash"`
		} `json:"invoice"`
	}
	if err != nil || json.Unmarshal([]byte(js), &inv) != nil || inv.Invoice.StatementHash == "" {
		t.Fatalf("invoice -o json: %.200q, %v", js, err)
	}
	void := []string{"billing", "void", "2026-10", "--tenant", "acme", "--hash", inv.Invoice.StatementHash, "--reason", "test"}
	var ae *apiError
	if _, _, err := runArgs(t, nil, with("tm_acme", void...)...); !errors.As(err, &ae) || ae.Status != http.StatusForbidden {
		t.Errorf("void with a tenant key: %v, want 403", err)
	}
	if _, _, err := runArgs(t, nil, with("tm_admin", "billing", "void", "2026-10", "--tenant", "acme")...); err == nil ||
		!strings.Contains(err.Error(), "--hash is required") || !strings.Contains(err.Error(), "--reason is required") {
		t.Errorf("void without --hash and --reason: %v", err)
	}
	out, _, err = runArgs(t, nil, with("tm_admin", void...)...)
	if err != nil || !strings.Contains(out, "Credit note 000003") || !strings.Contains(out, "Cancels invoice 000001: test") ||
		!strings.Contains(out, "Invoice 000004") || !strings.Contains(out, "Replaces invoice 000001.") {
		t.Fatalf("void: %q, %v", out, err)
	}
	out, _, err = runArgs(t, nil, with("tm_acme", "billing", "invoice", "2026-10")...)
	if err != nil || !strings.Contains(out, "Invoice 000004 of acme for 2026-10 (revision 1") {
		t.Errorf("invoice after the void: %q, %v", out, err)
	}
}
