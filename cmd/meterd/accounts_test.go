package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestBillingAccountsFlag checks --billing-accounts (METER_BILLING_ACCOUNTS):
// the example file parses, its names and zones reach the billing config,
// its zones merge with --billing-zones, and a tenant the two give
// different zones, a file that does not parse or does not exist is a
// configuration error.
func TestBillingAccountsFlag(t *testing.T) {
	example := filepath.Join("..", "..", "deploy", "billing-accounts.example.json")
	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte(`{"operator": {}, "tenants": [{"id": "acme", "zone": "Mars/Base", "tax_rate": "1.5"}], "extra": 1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	dev := []string{"--dev", "--data-dir", "d"}
	for _, tt := range []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr []string
	}{
		{"example", []string{"--billing-accounts", example, "--billing-zones", "acme=Asia/Kolkata,beta=+05:30"}, nil, nil},
		{"from the environment", nil, map[string]string{"METER_BILLING_ACCOUNTS": example}, nil},
		{"zones disagree", []string{"--billing-accounts", example, "--billing-zones", "acme=+05:30"}, nil,
			[]string{`tenant "acme": --billing-zones says +05:30`, "Asia/Kolkata"}},
		{"missing file", []string{"--billing-accounts", filepath.Join(t.TempDir(), "none.json")}, nil, []string{"--billing-accounts", "no such file"}},
		{"bad file", []string{"--billing-accounts", bad}, nil, []string{"invalid billing accounts", "extra"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			checkParse(t, append(tt.args, dev...), tt.env, tt.wantErr)
		})
	}
	cfg, err := parseConfig(append([]string{"--billing-accounts", example, "--billing-zones", "beta=+05:30"}, dev...), func(string) string { return "" }, nil)
	if err != nil {
		t.Fatal(err)
	}
	accounts, zones, err := cfg.billingAccounts()
	if err != nil {
		t.Fatal(err)
	}
	if provider, _, issuer := accounts.Names(); provider != "Example Inference" || issuer != "Example Inference Ltd" {
		t.Errorf("operator names %q, %q", provider, issuer)
	}
	if got := accounts.Tenant("acme").DisplayName(); got != "Acme Corp" {
		t.Errorf("acme's name %q", got)
	}
	at := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	for tenant, want := range map[string]int{"acme": 19800, "beta": 19800} {
		z, ok := zones[tenant]
		if !ok {
			t.Errorf("no zone for %s", tenant)
			continue
		}
		if _, off := at.In(z).Zone(); off != want {
			t.Errorf("%s's offset %d s, want %d", tenant, off, want)
		}
	}
}
