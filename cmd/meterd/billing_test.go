package main

import (
	"net/url"
	"strings"
	"testing"
	"time"
)

func TestBillingFlags(t *testing.T) {
	dev := []string{"--dev", "--data-dir", "d"}
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr []string
	}{
		{"zones", []string{"--billing-zones", "acme=Asia/Kolkata, beta=+05:30,gamma=UTC", "--billing-grace", "36h", "--billing-by-deployment"}, nil, nil},
		{"zones from the environment", nil, map[string]string{"METER_BILLING_ZONES": "acme=-08:00"}, nil},
		{"bad zones", []string{"--billing-zones", "acme,beta=Mars/Base,gamma=+15:00,acme=UTC,bad\u200btenant=UTC"}, nil,
			[]string{`"acme": want tenant=zone`, `tenant "beta"`, "Mars/Base", `tenant "gamma"`, "±14:00", "tenant_id"}},
		{"duplicate tenant", []string{"--billing-zones", "acme=UTC,acme=+01:00"}, nil, []string{`tenant "acme" is given twice`}},
		{"grace", []string{"--billing-grace", "0s"}, nil, []string{"--billing-grace 0s: must be positive"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkParse(t, append(tt.args, dev...), tt.env, tt.wantErr)
		})
	}
	cfg, err := parseConfig([]string{"--dev", "--data-dir", "d", "--billing-zones", "acme=Asia/Kolkata,beta=+05:30"}, func(string) string { return "" }, nil)
	if err != nil {
		t.Fatal(err)
	}
	zones, err := cfg.billingZones()
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	for tenant, want := range map[string]int{"acme": 19800, "beta": 19800} {
		if _, off := at.In(zones[tenant]).Zone(); off != want {
			t.Errorf("%s's offset %d s, want %d", tenant, off, want)
		}
	}
	if cfg.BillingGrace != 24*time.Hour {
		t.Errorf("default grace %s, want 24h", cfg.BillingGrace)
	}
}

// TestDevServesBilling checks that meterd's api role serves the billing
// service: a malformed period is the service's 400, and the usage-and-cost
// export of the last hours streams a CSV file.
func TestDevServesBilling(t *testing.T) {
	m := startDev(t)
	fin := m.key(t, "finance")
	code, body, err := m.do("GET", "/v1/billing/statements/2026-13?tenant_id=acme", fin, nil)
	if err != nil || code != 400 || !strings.Contains(string(body), "2026-13") {
		t.Errorf("statement of 2026-13: %d %s %v, want 400 naming the period", code, body, err)
	}
	end := time.Now().UTC().Truncate(time.Hour)
	q := url.Values{"start": {end.Add(-2 * time.Hour).Format(time.RFC3339)}, "end": {end.Format(time.RFC3339)}, "format": {"csv"}}
	code, body, err = m.do("GET", "/v1/billing/usage-cost/export?"+q.Encode(), fin, nil)
	if err != nil || code != 200 || !strings.HasPrefix(string(body), "charge_period_start,") {
		t.Errorf("usage-cost export: %d %q %v, want a CSV file", code, body, err)
	}
}
