package billing_test

import (
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"time"

	"tokenmeter/billing"
)

func ExampleAllocate() {
	// 1.00 split 1:1:1 — the nano-unit left over goes to the first key.
	shares, err := billing.Allocate(1_000_000_000, []*big.Int{big.NewInt(1), big.NewInt(1), big.NewInt(1)}, []string{"b", "a", "c"})
	if err != nil {
		panic(err)
	}
	fmt.Println(shares)
	// Output: [0.333333333 0.333333334 0.333333333]
}

func ExampleAllocateHour() {
	data, err := os.ReadFile(filepath.Join("..", "testdata", "billing", "prices", "example.json"))
	if err != nil {
		panic(err)
	}
	book, err := billing.ParsePriceBook(data)
	if err != nil {
		panic(err)
	}
	hour := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	// Two whole H100s (on-demand, us-east-1: 4.00/hour) sampled every
	// 10 minutes, 75% busy.
	var usage []billing.GPUUsage
	for gpu := 0; gpu < 2; gpu++ {
		for s := 0; s < 6; s++ {
			usage = append(usage, billing.GPUUsage{
				GPUType: "H100-SXM-80GB", Pool: "on-demand", Region: "us-east-1",
				At: hour.Add(time.Duration(s) * 10 * time.Minute), GPUSeconds: 600, BusySeconds: 450,
			})
		}
	}
	cost, err := book.GPUCost(usage)
	if err != nil {
		panic(err)
	}
	fmt.Println("cost", cost.Cost, "busy", cost.BusyCost, "idle", cost.IdleCost, cost.PriceIDs)

	alloc, err := billing.AllocateHour(cost, []billing.TenantUsage{
		{Tenant: "globex", InputTokens: 90_000, OutputTokens: 30_000, Requests: 40, E2EMillis: 200_000},
		{Tenant: "acme", InputTokens: 200_000, CachedInputTokens: 50_000, OutputTokens: 40_000, Requests: 100, E2EMillis: 600_000},
	}, book.Allocation)
	if err != nil {
		panic(err)
	}
	for _, l := range alloc.Lines {
		perK, ok := billing.CostPer1K(l.Total, l.Usage.InputTokens+l.Usage.OutputTokens)
		fmt.Println(l.Tenant, l.Basis, l.Busy, l.Idle, l.Total, perK, ok)
	}
	// Output:
	// cost 8 busy 6 idle 2 [gpu:H100-SXM-80GB|on-demand|us-east-1@2026-01-01T00:00:00Z]
	// acme 240000 4 0 4 0.016666667 true
	// globex 120000 2 0 2 0.016666667 true
	// __idle__ 0 0 2 2 0 false
}
