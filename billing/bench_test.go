package billing

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// benchHour is one busy deployment-hour: 8 GPUs sampled every 10 s (360 × 8
// samples), a price change at 10:30, and 1,000 tenants.
func benchHour(b *testing.B) (*PriceBook, []GPUUsage, []TenantUsage) {
	book := mustBook(b, `{
	  "gpu_prices": [
	    {"gpu_type": "H100-SXM-80GB", "effective_from": "2026-01-01T00:00:00Z", "per_hour": "3.50"},
	    {"gpu_type": "H100-SXM-80GB", "pool": "on-demand", "effective_from": "2026-01-01T00:00:00Z", "per_hour": "4.10"},
	    {"gpu_type": "H100-SXM-80GB", "pool": "on-demand", "region": "us-east-1", "effective_from": "2026-01-01T00:00:00Z", "per_hour": "4.00"},
	    {"gpu_type": "H100-SXM-80GB", "pool": "on-demand", "region": "us-east-1", "effective_from": "2026-03-01T10:30:00Z", "per_hour": "3.00"},
	    {"gpu_type": "A100-SXM4-40GB", "effective_from": "2026-01-01T00:00:00Z", "per_hour": "2.00"}
	  ],
	  "allocation": {"weighted_tokens": {"input_weight": "1", "output_weight": "3"}}
	}`)
	rng := rand.New(rand.NewPCG(7, 8))
	var usage []GPUUsage
	for gpu := range 8 {
		_ = gpu
		for s := range 360 {
			usage = append(usage, GPUUsage{
				GPUType: "H100-SXM-80GB", Pool: "on-demand", Region: "us-east-1",
				At:          hourStart.Add(time.Duration(s+1) * 10 * time.Second),
				GPUSeconds:  10,
				BusySeconds: 10 * rng.Float64(),
			})
		}
	}
	tenants := make([]TenantUsage, 1000)
	for i := range tenants {
		in := rng.Int64N(2_000_000)
		tenants[i] = TenantUsage{
			Tenant:            fmt.Sprintf("tenant-%04d", rng.IntN(1_000_000)*1000+i),
			InputTokens:       in,
			CachedInputTokens: rng.Int64N(in + 1),
			OutputTokens:      rng.Int64N(500_000),
			Requests:          1 + rng.Int64N(1000),
			E2EMillis:         rng.Int64N(10_000_000),
		}
	}
	return book, usage, tenants
}

// BenchmarkDeploymentHour costs and allocates one deployment-hour (the
// rollup job's unit of work) with the default policy.
func BenchmarkDeploymentHour(b *testing.B) {
	book, usage, tenants := benchHour(b)
	b.ReportAllocs()
	for b.Loop() {
		c, err := book.GPUCost(usage)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := AllocateHour(c, tenants, book.Allocation); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkGPUCost(b *testing.B) {
	book, usage, _ := benchHour(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := book.GPUCost(usage); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAllocateHour(b *testing.B) {
	book, usage, tenants := benchHour(b)
	c, err := book.GPUCost(usage)
	if err != nil {
		b.Fatal(err)
	}
	for _, busy := range BusyPolicies() {
		for _, idle := range IdlePolicies() {
			p := book.Allocation
			p.Busy, p.Idle = busy, idle
			b.Run(string(busy)+"/"+string(idle), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := AllocateHour(c, tenants, p); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
