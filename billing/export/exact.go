package export

import (
	"encoding/binary"
	"errors"
	"math/big"
	"math/bits"

	"tokenmeter/billing"
)

// costScale is the number of decimals of FOCUS cost columns: a token price
// is in nano-units per 1,000,000 tokens (PricingUnit "1000000 Tokens"), a
// PricingQuantity is tokens / 10^6, so their product is exact at 10^-15 and
// ListUnitPrice × PricingQuantity = ListCost holds on every row without
// rounding.
const costScale = 15

// nanoToCost is 10^(costScale-9): one nano-unit in cost units.
const nanoToCost = 1_000_000

// errCostRange marks an exact cost that does not fit DECIMAL(38, 15).
var errCostRange = errors.New("cost out of the range of DECIMAL(38, 15)")

// cost is an exact amount in units of 10^-costScale of the currency: a
// signed 128-bit integer (two's complement, hi:lo).
type cost struct {
	hi int64
	lo uint64
}

// maxCost is 10^38 − 1 (DECIMAL(38, x)'s largest unscaled value) as hi:lo.
var maxCost = cost{hi: 0x4b3b4ca85a86c47a, lo: 0x098a223fffffffff}

// costOfProduct is tokens × per1M (nano-units per 1M tokens) in cost units:
// exactly the unscaled product, since 10^-9 / 10^6 = 10^-15.
func costOfProduct(tokens uint64, per1M billing.Money) (cost, error) {
	if per1M < 0 {
		c, err := costOfProduct(tokens, -per1M)
		return c.neg(), err
	}
	hi, lo := bits.Mul64(tokens, uint64(per1M))
	c := cost{hi: int64(hi), lo: lo}
	if hi>>63 != 0 || c.cmp(maxCost) > 0 {
		return cost{}, errCostRange
	}
	return c, nil
}

// costOfMoney is m in cost units.
func costOfMoney(m billing.Money) cost {
	if m < 0 {
		// −2^63 nano-units × 10^6 still fits: |m| as uint64 is exact.
		hi, lo := bits.Mul64(uint64(-m), nanoToCost)
		return cost{hi: int64(hi), lo: lo}.neg()
	}
	hi, lo := bits.Mul64(uint64(m), nanoToCost)
	return cost{hi: int64(hi), lo: lo}
}

func (c cost) neg() cost {
	lo, borrow := bits.Sub64(0, c.lo, 0)
	hi, _ := bits.Sub64(0, uint64(c.hi), borrow)
	return cost{hi: int64(hi), lo: lo}
}

func (c cost) add(d cost) cost {
	lo, carry := bits.Add64(c.lo, d.lo, 0)
	hi, _ := bits.Add64(uint64(c.hi), uint64(d.hi), carry)
	return cost{hi: int64(hi), lo: lo}
}

func (c cost) sub(d cost) cost { return c.add(d.neg()) }

func (c cost) sign() int {
	switch {
	case c.hi < 0:
		return -1
	case c.hi == 0 && c.lo == 0:
		return 0
	}
	return 1
}

func (c cost) cmp(d cost) int {
	switch {
	case c.hi < d.hi:
		return -1
	case c.hi > d.hi:
		return 1
	case c.lo < d.lo:
		return -1
	case c.lo > d.lo:
		return 1
	}
	return 0
}

// mulRate is c × rate (a billing.Weight: nano-units of 1), rounded half
// away from zero to a cost unit.
func (c cost) mulRate(rate billing.Weight) cost {
	x := new(big.Int).Lsh(big.NewInt(c.hi), 64)
	x.Add(x, new(big.Int).SetUint64(c.lo))
	x.Mul(x, big.NewInt(int64(rate)))
	neg := x.Sign() < 0
	x.Abs(x)
	q, r := x.QuoRem(x, big.NewInt(1e9), new(big.Int))
	if r.Lsh(r, 1).Cmp(big.NewInt(1e9)) >= 0 {
		q.Add(q, big.NewInt(1))
	}
	if neg {
		q.Neg(q)
	}
	lo := new(big.Int).And(q, new(big.Int).SetUint64(^uint64(0)))
	hi := new(big.Int).Rsh(q, 64)
	return cost{hi: hi.Int64(), lo: lo.Uint64()}
}

// decimal is c as a Parquet DECIMAL(38, costScale) value.
func (c cost) decimal() decimal16 {
	var b decimal16
	binary.BigEndian.PutUint64(b[:8], uint64(c.hi))
	binary.BigEndian.PutUint64(b[8:], c.lo)
	return b
}

// String is c as the shortest exact decimal ("1.5", "-0.000000000000001").
func (c cost) String() string {
	var buf [48]byte
	return string(c.appendText(buf[:0]))
}

// appendText appends c as String writes it, without allocating.
func (c cost) appendText(b []byte) []byte {
	if c.sign() < 0 {
		b = append(b, '-')
		c = c.neg()
	}
	// The digits of hi:lo, from the right, in chunks of 19.
	var d [40]byte
	i := len(d)
	hi, lo := uint64(c.hi), c.lo
	for hi != 0 {
		qhi := hi / 1e19
		qlo, r := bits.Div64(hi%1e19, lo, 1e19)
		for range 19 {
			i--
			d[i] = byte('0' + r%10)
			r /= 10
		}
		hi, lo = qhi, qlo
	}
	for lo != 0 || i == len(d) {
		i--
		d[i] = byte('0' + lo%10)
		lo /= 10
	}
	digits := d[i:]
	for len(digits) > 1 && digits[0] == '0' {
		digits = digits[1:]
	}
	// The point goes costScale digits from the right; zeros at the end of
	// the fraction are trimmed.
	var whole, frac []byte
	pad := 0
	if len(digits) <= costScale {
		whole, frac, pad = []byte{'0'}, digits, costScale-len(digits)
	} else {
		whole, frac = digits[:len(digits)-costScale], digits[len(digits)-costScale:]
	}
	for len(frac) > 0 && frac[len(frac)-1] == '0' {
		frac = frac[:len(frac)-1]
	}
	b = append(b, whole...)
	if len(frac) == 0 {
		return b
	}
	b = append(b, '.')
	for range pad {
		b = append(b, '0')
	}
	return append(b, frac...)
}
