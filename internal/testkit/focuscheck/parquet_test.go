package focuscheck

import (
	"bytes"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/decimal128"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
)

// writeParquet writes a two-row Parquet file with Arrow's writer: a
// DECIMAL(38, 9) BilledCost, a UTC ChargePeriodStart, a BillingPeriodStart
// that is not adjusted to UTC, a ListCost stored as text, a ChargeClass
// with an empty string, and FocusVersion metadata.
func writeParquet(t *testing.T) []byte {
	t.Helper()
	schema := arrow.NewSchema([]arrow.Field{
		{Name: "BilledCost", Type: &arrow.Decimal128Type{Precision: 38, Scale: 9}},
		{Name: "ChargePeriodStart", Type: &arrow.TimestampType{Unit: arrow.Microsecond, TimeZone: "UTC"}},
		{Name: "BillingPeriodStart", Type: &arrow.TimestampType{Unit: arrow.Microsecond}},
		{Name: "ListCost", Type: arrow.BinaryTypes.String},
		{Name: "ChargeClass", Type: arrow.BinaryTypes.String, Nullable: true},
	}, nil)
	b := array.NewRecordBuilder(memory.DefaultAllocator, schema)
	defer b.Release()
	at := time.Date(2026, 10, 20, 10, 0, 0, 0, time.UTC)
	b.Field(0).(*array.Decimal128Builder).AppendValues([]decimal128.Num{decimal128.FromI64(1_500_000_000), decimal128.FromI64(-7)}, nil)
	for _, f := range []int{1, 2} {
		b.Field(f).(*array.TimestampBuilder).AppendValues([]arrow.Timestamp{arrow.Timestamp(at.UnixMicro()), arrow.Timestamp(at.Add(time.Hour).UnixMicro())}, nil)
	}
	b.Field(3).(*array.StringBuilder).AppendValues([]string{"1.5", "0"}, nil)
	b.Field(4).(*array.StringBuilder).AppendNull()
	b.Field(4).(*array.StringBuilder).Append("")
	rec := b.NewRecordBatch()
	defer rec.Release()
	var buf bytes.Buffer
	w, err := pqarrow.NewFileWriter(schema, &buf, parquet.NewWriterProperties(), pqarrow.DefaultWriterProps())
	if err != nil {
		t.Fatal(err)
	}
	if err := w.AppendKeyValueMetadata("FocusVersion", "1.2"); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(rec); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestReadParquet reads values exactly (decimals with their scale, UTC
// timestamps to the second, nulls apart from empty strings) and the
// storage types the type rules judge.
func TestReadParquet(t *testing.T) {
	d, err := ReadParquet("t.parquet", writeParquet(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		row  int
		col  string
		want Cell
	}{
		{0, "BilledCost", Cell{Text: "1.500000000"}},
		{1, "BilledCost", Cell{Text: "-0.000000007"}},
		{0, "ChargePeriodStart", Cell{Text: "2026-10-20T10:00:00Z"}},
		{0, "ChargeClass", Cell{Null: true}},
		{1, "ChargeClass", Cell{Text: ""}},
	} {
		if got := d.Get(c.row, c.col); got != c.want {
			t.Errorf("row %d %s: %+v, want %+v", c.row, c.col, got, c.want)
		}
	}
	if d.Metadata["FocusVersion"] != "1.2" {
		t.Errorf("metadata %v", d.Metadata)
	}
	rules := map[string]Rule{}
	for _, r := range Rules() {
		rules[r.Name] = r
	}
	for name, fails := range map[string]bool{
		"BilledCost/TypeDecimal":          false,
		"ChargePeriodStart/TypeDateTime":  false,
		"BillingPeriodStart/TypeDateTime": true, // not adjusted to UTC
		"ListCost/TypeDecimal":            true, // a decimal stored as text
		"NullHandling/NoPlaceholders":     true, // "" for null
	} {
		if v := rules[name].Check(d, Profile{}); (len(v) > 0) != fails {
			t.Errorf("%s on the Parquet file: %v, want failing %v", name, v, fails)
		}
	}
}
