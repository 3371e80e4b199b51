package chstore

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestUsageCostChunkSortPackedMatchesFields: the chunk sort's packed
// integer keys order and sum the lines as comparing their fields does
// (the path taken when the keys do not fit 64 bits).
func TestUsageCostChunkSortPackedMatchesFields(t *testing.T) {
	names := func(prefix string, n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("%s%d", prefix, (i*7919)%n)) // not in id order
		}
		return out
	}
	tenants, models, deployments, versions := names("t", 300), names("m", 5), names("d", 3), names("v", 3)
	type key struct {
		b                         uint32
		tenant, model, deployment string
	}
	var keys []key
	sorted := func(keyBits int) []string {
		n := &usageCostNames{newUsageNames(), newUsageNames(), newUsageNames(), newUsageNames()}
		r := rand.New(rand.NewPCG(34, 3))
		c := &usageCostChunk{}
		for range 5000 {
			l := usageCostLine{b: 1_800_000_000 + 3600*uint32(r.IntN(48)), requests: r.Uint64N(100), input: r.Uint64N(1 << 40),
				cached: r.Uint64N(100), output: r.Uint64N(1000), unpriced: r.Uint64N(3), list: r.Int64N(1000) - 500, cost: r.Int64N(1 << 50), busy: r.Int64N(99)}
			l.tenant, l.model = n.tenants.id(tenants[r.IntN(len(tenants))]), n.models.id(models[r.IntN(len(models))])
			l.deployment, l.version = n.deployments.id(deployments[r.IntN(len(deployments))]), n.versions.id(versions[r.IntN(len(versions))])
			c.lines = append(c.lines, l)
		}
		old := usageCostKeyBits
		usageCostKeyBits = keyBits
		defer func() { usageCostKeyBits = old }()
		c.sort(n)
		c.tenants, c.models, c.deployments, c.priceVersions = n.tenants.names, n.models.names, n.deployments.names, n.versions.names
		var out []string
		for _, i := range c.order {
			l := c.lines[i]
			vs := []string{c.priceVersions[l.version]}
			for _, v := range c.versions[i] {
				vs = append(vs, c.priceVersions[v])
			}
			slices.Sort(vs)
			keys = append(keys, key{l.b, c.tenants[l.tenant], c.models[l.model], c.deployments[l.deployment]})
			out = append(out, fmt.Sprintf("%d %s %s %s %d %d %d %d %d %d %d %d %v", l.b, c.tenants[l.tenant], c.models[l.model], c.deployments[l.deployment],
				l.requests, l.input, l.cached, l.output, l.unpriced, l.list, l.cost, l.busy, vs))
		}
		return out
	}
	packed, fields := sorted(64), sorted(0)
	if !slices.Equal(packed, fields) {
		t.Fatalf("packed keys and field comparison differ: %d and %d rows", len(packed), len(fields))
	}
	// Each key once, in (step, tenant, model, deployment) order, some
	// lines summed.
	keys = keys[len(packed):]
	for i := 1; i < len(keys); i++ {
		a, b := keys[i-1], keys[i]
		if cmp.Or(cmp.Compare(a.b, b.b), strings.Compare(a.tenant, b.tenant), strings.Compare(a.model, b.model), strings.Compare(a.deployment, b.deployment)) >= 0 {
			t.Fatalf("row %d %v after %v", i, b, a)
		}
	}
	if len(fields) >= 5000 {
		t.Fatalf("%d rows of 5000 lines: none summed", len(fields))
	}
}
