package billing

import (
	"errors"
	"strings"
	"testing"
)

// TestAccountsDedicatedToOneTenant: two tenants naming one dedicated
// deployment would each be billed all its GPU-hours; the file is refused
// with both entries' paths. One tenant's two entries of a deployment (a
// rate change) and two tenants' different deployments are fine.
func TestAccountsDedicatedToOneTenant(t *testing.T) {
	ok := `{"operator": {"seller": {}}, "tenants": [
	  {"id": "acme", "buyer": {}, "contract": {"dedicated": [
	    {"deployment": "d1", "effective_from": "2026-10-01T00:00:00Z", "per_gpu_hour": "2"},
	    {"deployment": "d1", "effective_from": "2026-11-01T00:00:00Z", "per_gpu_hour": "2.4"}]}},
	  {"id": "beta", "buyer": {}, "contract": {"dedicated": [
	    {"deployment": "d2", "effective_from": "2026-11-01T00:00:00Z", "per_gpu_hour": "3"}]}}]}`
	if _, err := ParseAccounts([]byte(ok)); err != nil {
		t.Fatal(err)
	}
	bad := `{"operator": {"seller": {}}, "tenants": [
	  {"id": "acme", "buyer": {}, "contract": {"dedicated": [
	    {"deployment": "d1", "effective_from": "2026-10-01T00:00:00Z", "per_gpu_hour": "2"}]}},
	  {"id": "plain", "buyer": {}},
	  {"id": "beta", "buyer": {}, "contract": {"dedicated": [
	    {"deployment": "d2", "effective_from": "2026-11-01T00:00:00Z", "per_gpu_hour": "3"},
	    {"deployment": "d1", "effective_from": "2027-01-01T00:00:00Z", "per_gpu_hour": "3"}]}}]}`
	_, err := ParseAccounts([]byte(bad))
	if !errors.Is(err, ErrInvalidAccounts) || !errors.Is(err, ErrInvalidField) {
		t.Fatalf("err = %v, want ErrInvalidAccounts and ErrInvalidField", err)
	}
	for _, want := range []string{"tenants[2].contract.dedicated[1].deployment", "tenants[0].contract.dedicated[0].deployment",
		`"d1"`, `"acme"`, "2027-01-01T00:00:00Z"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %s:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), `"d2"`) {
		t.Errorf("error names d2, dedicated to beta only:\n%v", err)
	}
}
