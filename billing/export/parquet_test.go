package export_test

import (
	"bytes"
	"context"
	"math/big"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet/file"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"

	"tokenmeter/billing"
	"tokenmeter/billing/export"
)

// arrowTable reads a Parquet file with Apache Arrow's reader, a different
// implementation from the writer's (parquet-go).
func arrowTable(t *testing.T, data []byte) (arrow.Table, *file.Reader) {
	t.Helper()
	rdr, err := file.NewParquetReader(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("arrow parquet reader: %v", err)
	}
	fr, err := pqarrow.NewFileReader(rdr, pqarrow.ArrowReadProperties{}, memory.DefaultAllocator)
	if err != nil {
		t.Fatal(err)
	}
	tbl, err := fr.ReadTable(context.Background())
	if err != nil {
		t.Fatalf("read table: %v", err)
	}
	t.Cleanup(tbl.Release)
	return tbl, rdr
}

func column(t *testing.T, tbl arrow.Table, name string) *arrow.Chunked {
	t.Helper()
	idx := tbl.Schema().FieldIndices(name)
	if len(idx) != 1 {
		t.Fatalf("column %s: found %d times in %s", name, len(idx), tbl.Schema())
	}
	return tbl.Column(idx[0]).Data()
}

// decimalSum sums a DECIMAL(38, 9) column exactly, in nano-units, and
// counts its nulls.
func decimalSum(t *testing.T, tbl arrow.Table, name string) (*big.Int, int) {
	t.Helper()
	return decimalSumScale(t, tbl, name, 9)
}

// decimalSumScale is the sum of a DECIMAL(38, scale) column's unscaled
// values, and its nulls.
func decimalSumScale(t *testing.T, tbl arrow.Table, name string, scale int32) (*big.Int, int) {
	t.Helper()
	sum, nulls := new(big.Int), 0
	col := column(t, tbl, name)
	if dt, ok := col.DataType().(*arrow.Decimal128Type); !ok || dt.Precision != 38 || dt.Scale != scale {
		t.Fatalf("column %s is %s, want decimal(38, %d)", name, col.DataType(), scale)
	}
	for _, c := range col.Chunks() {
		a := c.(*array.Decimal128)
		for i := range a.Len() {
			if a.IsNull(i) {
				nulls++
				continue
			}
			sum.Add(sum, a.Value(i).BigInt())
		}
	}
	return sum, nulls
}

func uintSum(t *testing.T, tbl arrow.Table, name string) uint64 {
	t.Helper()
	var sum uint64
	for _, c := range column(t, tbl, name).Chunks() {
		a, ok := c.(*array.Uint64)
		if !ok {
			t.Fatalf("column %s is %s, want uint64", name, c.DataType())
		}
		for i := range a.Len() {
			sum += a.Value(i)
		}
	}
	return sum
}

// TestParquetReadByArrow writes the usage dataset in Parquet with small row
// groups and reads it back with Arrow: the row count, the row groups, the
// token sums and the exact sums of list charge, allocated cost and margin
// are those of the rows.
func TestParquetReadByArrow(t *testing.T) {
	rows := usageRows(t, 10_000)
	data := encodeUsage(t, export.Parquet, export.Options{Finance: true, RowGroupRows: 4096}, rows)
	tbl, rdr := arrowTable(t, data)
	if tbl.NumRows() != int64(len(rows)) {
		t.Fatalf("got %d rows, want %d", tbl.NumRows(), len(rows))
	}
	if got := rdr.NumRowGroups(); got != 3 {
		t.Errorf("got %d row groups, want 3 of at most 4096 rows", got)
	}
	var charge, cost, margin big.Int
	var input uint64
	for _, r := range rows {
		charge.Add(&charge, big.NewInt(int64(r.ListCharge)))
		cost.Add(&cost, big.NewInt(int64(r.AllocatedCost)))
		margin.Add(&margin, big.NewInt(int64(r.ListCharge-r.AllocatedCost)))
		input += r.InputTokens
	}
	for name, want := range map[string]*big.Int{"list_charge": &charge, "allocated_cost": &cost, "margin": &margin} {
		if got, nulls := decimalSum(t, tbl, name); got.Cmp(want) != 0 || nulls != 0 {
			t.Errorf("sum of %s: got %s nano-units (%d nulls), want %s", name, got, nulls, want)
		}
	}
	if got := uintSum(t, tbl, "input_tokens"); got != input {
		t.Errorf("sum of input_tokens: got %d, want %d", got, input)
	}
	ts := column(t, tbl, "charge_period_start").DataType().(*arrow.TimestampType)
	if ts.Unit != arrow.Microsecond || ts.TimeZone != "UTC" {
		t.Errorf("charge_period_start is %s, want timestamp[us, UTC]", ts)
	}
	first := column(t, tbl, "charge_period_start").Chunk(0).(*array.Timestamp).Value(0).ToTime(arrow.Microsecond)
	if !first.Equal(rows[0].ChargePeriodStart) {
		t.Errorf("first charge_period_start %s, want %s", first, rows[0].ChargePeriodStart)
	}
	if got := rdr.MetaData().GetCreatedBy(); got != "tokenmeter version export(build 1)" {
		t.Errorf("created_by %q", got)
	}

	// Statements: the charge column adds up to the statements' charges.
	st1, st2 := testStatement(t, "acme"), testStatement(t, "globex")
	stData := encodeStatements(t, export.Parquet, export.Options{}, append(export.StatementRows(st1), export.StatementRows(st2)...))
	stTbl, _ := arrowTable(t, stData)
	want := big.NewInt(int64(st1.Charge + st2.Charge))
	if got, _ := decimalSum(t, stTbl, "charge"); got.Cmp(want) != 0 {
		t.Errorf("statement charges: got %s, want %s", got, want)
	}
	if len(stTbl.Schema().FieldIndices("allocated_cost")) != 0 {
		t.Error("statement Parquet without finance has allocated_cost")
	}
}

// TestParquetNegativeMoney checks the two's complement of DECIMAL(38, 9):
// a negative margin reads back negative and exact.
func TestParquetNegativeMoney(t *testing.T) {
	rows := usageRows(t, 2)
	rows[0].ListCharge, rows[0].AllocatedCost = 1, 3_000_000_000_000_000_001
	rows[1].ListCharge, rows[1].AllocatedCost = billing.Money(9_000_000_000_000_000_000), 0
	tbl, _ := arrowTable(t, encodeUsage(t, export.Parquet, export.Options{Finance: true}, rows))
	col := column(t, tbl, "margin").Chunk(0).(*array.Decimal128)
	if got := col.Value(0).BigInt().String(); got != "-3000000000000000000" {
		t.Errorf("negative margin: got %s nano-units", got)
	}
	if got := col.Value(1).BigInt().String(); got != "9000000000000000000" {
		t.Errorf("large margin: got %s nano-units", got)
	}
}
