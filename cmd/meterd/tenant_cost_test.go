package main

import (
	"io"
	"testing"
)

// TestTenantCostFlag: --tenant-cost (or METER_TENANT_COST) opts tenant
// keys into the provider's cost; it is the api role's.
func TestTenantCostFlag(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		env  map[string]string
		want bool
	}{
		{"off by default", []string{"--dev", "--data-dir", "d"}, nil, false},
		{"flag", []string{"--dev", "--data-dir", "d", "--tenant-cost"}, nil, true},
		{"environment", []string{"--dev", "--data-dir", "d"}, map[string]string{"METER_TENANT_COST": "true"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := parseConfig(c.args, func(k string) string { return c.env[k] }, io.Discard)
			if err != nil || cfg.TenantCost != c.want {
				t.Errorf("TenantCost = %v, %v; want %v", cfg.TenantCost, err, c.want)
			}
		})
	}
	checkParse(t, []string{"--role", "ingest", "--clickhouse", "h:9000", "--tenant-cost"}, nil, []string{"--tenant-cost is the api role's"})
}
