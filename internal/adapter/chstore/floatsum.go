package chstore

import "fmt"

// ClickHouse's sum of a Float64 column adds the rows in the order its
// threads, parts and shards hand them over, which changes from one run of
// a query to the next: the same read answered means that differed in the
// 16th digit. Reads sum Float64 columns with floatSum instead, in fixed
// point, where addition does not depend on the order.

const (
	// floatSumScale is the number of decimal places each value keeps in
	// the fixed-point sum (Decimal128: 38 digits, 23 before the point).
	floatSumScale = 15
	// floatSumLimit bounds the values summed in fixed point: 1e13 (300,000
	// years of seconds, 2.8 GWh in one row) leaves room for 1e10 such
	// values in one sum. Larger values (and NaN or infinities, which no
	// stored row holds) are summed as floats, in whatever order, and added
	// to the fixed-point sum, so that a sum never overflows: ClickHouse
	// 18.16 wraps an overflowing Decimal silently, current releases fail
	// the query.
	floatSumLimit = "1e13"
)

// floatSum is the SQL of an order-independent sum of the Float64
// expression x: the same rows give the same bits, whatever their order.
// Each value is cut to floatSumScale decimal places (an error under 1e-15
// a row) before the exact sum, which is then rounded to a Float64.
func floatSum(x string) string {
	return fmt.Sprintf("(toFloat64(sum(toDecimal128(if(abs(%[1]s) < %[2]s, %[1]s, 0), %[3]d))) + sum(if(abs(%[1]s) < %[2]s, 0, %[1]s)))",
		x, floatSumLimit, floatSumScale)
}
