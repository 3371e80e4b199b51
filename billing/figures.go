package billing

import (
	"math"
	"math/big"
)

// CostPer1K returns cost / (tokens / 1000), rounded half to even to a
// nano-unit once. ok is false when tokens ≤ 0 (there is no such figure, it
// is not zero) or the result is out of range.
//
// The figures of ARCHITECTURE "GPU time and cost" are all this one function:
//
//	allocation basis, all tokens:     CostPer1K(line.Total, in+out)
//	allocation basis, output tokens:  CostPer1K(line.Total, out)
//	usage basis (busy only):          CostPer1K(line.Busy, in+out) or (line.Busy, out)
//	per 1k goodput tokens:            CostPer1K(line.Total, goodOutputTokens)
//
// and likewise for a whole deployment-hour with GPUCost.Cost (allocation
// basis, idle included) or GPUCost.BusyCost (usage basis). Aggregate first
// (sum costs and tokens over the period), then divide: an average of ratios
// is not a ratio of sums.
func CostPer1K(cost Money, tokens int64) (Money, bool) {
	if tokens <= 0 {
		return 0, false
	}
	r := new(big.Rat).SetFrac(big.NewInt(int64(cost)), big.NewInt(tokens))
	r.Mul(r, big.NewRat(1000, 1))
	m, err := moneyFromRat(r)
	if err != nil {
		return 0, false
	}
	return m, true
}

// TokensPerGPUHour returns tokens × 3600 / gpuSeconds: throughput per
// (effective) GPU-hour, a capacity figure, not money, so a float64. ok is
// false when gpuSeconds is not a positive finite number.
func TokensPerGPUHour(tokens int64, gpuSeconds float64) (float64, bool) {
	if !(gpuSeconds > 0) || math.IsInf(gpuSeconds, 0) {
		return 0, false
	}
	return float64(tokens) * 3600 / gpuSeconds, true
}
