package billing

import (
	"math/big"
)

// GPUCostParts prices usage that falls into parts (the GPUs of one GPU
// group, say). whole is GPUCost of all the parts' usage together; parts[i]
// carries parts' own seconds and price ids, and a share of whole's money:
// its BusyCost and IdleCost are whole's split over the parts by largest
// remainder, in proportion to each part's exact busy and idle cost (ties go
// to the earlier part), so that the parts add up to whole exactly and each
// part is within a nano-unit or so of its own exact cost. A part's Cost is
// its BusyCost plus its IdleCost; its Groups are nil.
func (b *PriceBook) GPUCostParts(usage [][]GPUUsage) (whole GPUCost, parts []GPUCost, err error) {
	var all []GPUUsage
	for _, u := range usage {
		all = append(all, u...)
	}
	if whole, err = b.GPUCost(all); err != nil {
		return GPUCost{}, nil, err
	}
	parts = make([]GPUCost, len(usage))
	busy := make([]*big.Rat, len(usage))
	idle := make([]*big.Rat, len(usage))
	seconds := make([]*big.Rat, len(usage))
	for i, u := range usage {
		c, cost, busyCost, err := b.gpuCost(u)
		if err != nil {
			return GPUCost{}, nil, err
		}
		c.Groups = nil
		parts[i] = c
		busy[i], idle[i] = busyCost, new(big.Rat).Sub(cost, busyCost)
		seconds[i] = new(big.Rat).SetFloat64(c.GPUSeconds)
	}
	busyShares := splitByWeights(int64(whole.BusyCost), busy, seconds)
	idleShares := splitByWeights(int64(whole.IdleCost), idle, seconds)
	for i := range parts {
		parts[i].BusyCost, parts[i].IdleCost = Money(busyShares[i]), Money(idleShares[i])
		parts[i].Cost = parts[i].BusyCost + parts[i].IdleCost
	}
	return whole, parts, nil
}

// splitByWeights splits total into integer shares in proportion to weights
// by largest remainder (Hamilton): each share is the floor or the ceiling of
// total × weight ÷ Σ weights, the ceilings going to the largest remainders,
// then to the smaller index. The shares add up to total exactly, whatever
// total is. With weights adding up to zero it splits by fallback, and
// with those zero too into equal parts.
func splitByWeights(total int64, weights, fallback []*big.Rat) []int64 {
	out := make([]int64, len(weights))
	if len(weights) == 0 {
		return out
	}
	sum := new(big.Rat)
	for _, w := range weights {
		sum.Add(sum, w)
	}
	if sum.Sign() == 0 && fallback != nil {
		return splitByWeights(total, fallback, nil)
	}
	if sum.Sign() == 0 {
		weights = make([]*big.Rat, len(out))
		for i := range weights {
			weights[i] = big.NewRat(1, 1)
		}
		sum.SetInt64(int64(len(out)))
	}
	rems := make([]*big.Rat, len(out))
	t := new(big.Rat).SetInt64(total)
	for i, w := range weights {
		share := new(big.Rat).Mul(t, w)
		share.Quo(share, sum)
		q, r := new(big.Int).DivMod(share.Num(), share.Denom(), new(big.Int)) // floor, 0 ≤ r < den
		out[i] = q.Int64()
		rems[i] = new(big.Rat).SetFrac(r, share.Denom())
	}
	distribute(total, out, rems, (*big.Rat).Cmp, nil)
	return out
}
