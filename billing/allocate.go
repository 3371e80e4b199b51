package billing

import (
	"cmp"
	"fmt"
	"math/big"
	"math/bits"
	"slices"
	"strings"
)

// Allocate splits total among weights in proportion, exactly, by largest
// remainder (Hamilton's method): share i is the floor of total × w_i / Σw,
// and the units left over go one each to the largest remainders; ties go to
// the smaller key, then to the smaller index (keys should be unique; nil
// keys break ties by index alone). The shares add up to total and each is
// the floor or the ceiling of its exact quota. The result is aligned with
// weights, which are not modified.
//
// total must be ≥ 0 and the weights ≥ 0 (nil is not a weight). When every
// weight is 0, a total of 0 gives zero shares and any other total is an
// error wrapping ErrZeroWeights.
func Allocate(total Money, weights []*big.Int, keys []string) ([]Money, error) {
	n := len(weights)
	if keys != nil && len(keys) != n {
		return nil, fmt.Errorf("%w: %d weights and %d keys", ErrInvalidUsage, n, len(keys))
	}
	if total < 0 {
		return nil, fmt.Errorf("%w: allocate negative amount %s", ErrInvalidUsage, total)
	}
	small := make([]uint64, n)
	fits := true
	var sum uint64
	for i, w := range weights {
		if w == nil || w.Sign() < 0 {
			return nil, fmt.Errorf("%w: weight %d is nil or negative", ErrInvalidUsage, i)
		}
		if fits && w.IsUint64() {
			small[i] = w.Uint64()
			var carry uint64
			sum, carry = bits.Add64(sum, small[i], 0)
			fits = carry == 0
		} else {
			fits = false
		}
	}
	if fits {
		return allocateUint64(total, small, sum, keys)
	}
	return allocateBig(total, weights, keys), nil
}

// allocateUint64 is Allocate for weights that, and whose sum, fit in 64
// bits: 128-bit products, no big.Int.
func allocateUint64(total Money, weights []uint64, sum uint64, keys []string) ([]Money, error) {
	shares := make([]Money, len(weights))
	if sum == 0 {
		if total != 0 {
			return nil, ErrZeroWeights
		}
		return shares, nil
	}
	floors := make([]int64, len(weights))
	rems := make([]uint64, len(weights))
	for i, w := range weights {
		// total < 2^63 and w ≤ sum, so the quotient fits in 64 bits.
		hi, lo := bits.Mul64(uint64(total), w)
		q, r := bits.Div64(hi, lo, sum)
		floors[i], rems[i] = int64(q), r
	}
	distribute(int64(total), floors, rems, cmp.Compare[uint64], keys)
	for i, f := range floors {
		shares[i] = Money(f)
	}
	return shares, nil
}

// allocateBig is Allocate for weights beyond 64 bits. The sum is not zero.
func allocateBig(total Money, weights []*big.Int, keys []string) []Money {
	sum := new(big.Int)
	for _, w := range weights {
		sum.Add(sum, w)
	}
	floors := make([]int64, len(weights))
	rems := make([]*big.Int, len(weights))
	t := big.NewInt(int64(total))
	for i, w := range weights {
		q, r := new(big.Int).QuoRem(new(big.Int).Mul(t, w), sum, new(big.Int))
		floors[i], rems[i] = q.Int64(), r
	}
	distribute(int64(total), floors, rems, (*big.Int).Cmp, keys)
	shares := make([]Money, len(weights))
	for i, f := range floors {
		shares[i] = Money(f)
	}
	return shares
}

// distribute adds total − Σ floors to floors, one unit each, to the
// largest remainders (compared by cmpRem), ties to the smaller key, then to
// the smaller index. The callers guarantee 0 ≤ total − Σ floors ≤
// len(floors).
func distribute[R any](total int64, floors []int64, rems []R, cmpRem func(a, b R) int, keys []string) {
	left := total
	for _, f := range floors {
		left -= f
	}
	if left < 0 || left > int64(len(floors)) {
		panic(fmt.Sprintf("billing: %d units left over for %d shares", left, len(floors)))
	}
	if left == 0 {
		return
	}
	type cand struct {
		rem R
		i   int
	}
	cands := make([]cand, len(floors))
	for i := range floors {
		cands[i] = cand{rem: rems[i], i: i}
	}
	slices.SortFunc(cands, func(a, b cand) int {
		if c := cmpRem(b.rem, a.rem); c != 0 { // larger remainder first
			return c
		}
		if keys != nil {
			if c := strings.Compare(keys[a.i], keys[b.i]); c != 0 {
				return c
			}
		}
		return cmp.Compare(a.i, b.i)
	})
	for _, c := range cands[:left] {
		floors[c.i]++
	}
}

// roundKeepingTotal rounds each non-negative value to its floor or ceiling
// so that the results add up to total, the ceilings going to the largest
// fractional parts (then the smaller index). total must lie between the sum
// of the floors and the sum of the ceilings.
func roundKeepingTotal(total int64, values []*big.Rat) []int64 {
	floors := make([]int64, len(values))
	fracs := make([]*big.Rat, len(values))
	for i, v := range values {
		q, r := new(big.Int).QuoRem(v.Num(), v.Denom(), new(big.Int))
		floors[i] = q.Int64()
		fracs[i] = new(big.Rat).SetFrac(r, v.Denom())
	}
	distribute(total, floors, fracs, (*big.Rat).Cmp, nil)
	return floors
}
