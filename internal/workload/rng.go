package workload

import (
	"math"
	"math/bits"
	"math/rand/v2"
)

// rng is a small, allocation-free random source on a PCG, seeded per event so
// that event i can be generated on its own and from any goroutine.
type rng struct {
	src      rand.PCG
	spare    float64
	hasSpare bool
}

func newRNG(seed1, seed2 uint64) rng {
	var r rng
	r.src.Seed(mix64(seed1), mix64(seed2^0x6a09e667f3bcc909))
	return r
}

// float64 returns a uniform value in [0, 1).
func (r *rng) float64() float64 { return float64(r.src.Uint64()>>11) * 0x1p-53 }

// intN returns a value in [0, n) for n > 0 (Lemire's multiply, bias < n/2^64).
func (r *rng) intN(n int) int {
	hi, _ := bits.Mul64(r.src.Uint64(), uint64(n))
	return int(hi)
}

// norm returns a standard normal value (Box–Muller, the second value kept).
func (r *rng) norm() float64 {
	if r.hasSpare {
		r.hasSpare = false
		return r.spare
	}
	u1 := 1 - r.float64() // (0, 1]: log is finite
	u2 := r.float64()
	rad := math.Sqrt(-2 * math.Log(u1))
	s, c := math.Sincos(2 * math.Pi * u2)
	r.spare, r.hasSpare = rad*s, true
	return rad * c
}

// logNormal returns a log-normal value with the given median and the given
// standard deviation of its logarithm.
func (r *rng) logNormal(median, sigma float64) float64 {
	return median * math.Exp(sigma*r.norm())
}

// pick returns the index of the first cumulative weight above a uniform draw;
// cdf is increasing and ends at 1.
func (r *rng) pick(cdf []float64) int {
	u := r.float64()
	lo, hi := 0, len(cdf)-1
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if cdf[m] > u {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return lo
}

// mix64 is the SplitMix64 finalizer, a bijection on uint64 that spreads every
// input bit over the output.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// cumulative turns weights into a normalized cumulative distribution.
func cumulative(w []float64) []float64 {
	cdf := make([]float64, len(w))
	var sum float64
	for i, x := range w {
		sum += x
		cdf[i] = sum
	}
	for i := range cdf {
		cdf[i] /= sum
	}
	cdf[len(cdf)-1] = 1
	return cdf
}

const hexDigits = "0123456789abcdef"

// putUUID writes hi and lo as a UUID-shaped string (8-4-4-4-12 hex digits)
// into b, which must hold 36 bytes.
func putUUID(b []byte, hi, lo uint64) {
	j := 0
	for i := 0; i < 32; i++ {
		if i == 8 || i == 12 || i == 16 || i == 20 {
			b[j] = '-'
			j++
		}
		var nib uint64
		if i < 16 {
			nib = hi >> (60 - 4*i) & 0xf
		} else {
			nib = lo >> (60 - 4*(i-16)) & 0xf
		}
		b[j] = hexDigits[nib]
		j++
	}
}
