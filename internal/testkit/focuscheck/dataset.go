// Package focuscheck checks a FOCUS 1.2 cost-and-usage file against the
// specification's rules, one named rule each: "Section/Requirement", the
// section being the Column ID or attribute of FOCUS_Spec v1.2
// (specification/columns/*.md, attributes/*.md, metadata/) whose
// requirement it checks, as the FinOps Foundation's validator groups its
// rules (model-1.2.json: ListUnitPrice-C-...). It is written from the
// specification's text, not from this project's exporter, so that a test
// that runs it on an export can fail when the exporter and the
// specification disagree. Conditions that depend on the provider (does it
// have regions, sub accounts, price lists?) are a Profile. It reads CSV (an empty field is
// null) and Parquet (read with Apache Arrow's reader, not the parquet-go
// writer the exporter uses).
package focuscheck

import (
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"math/big"
	"strconv"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet/file"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
)

// Kind is a column's storage type as the file declares it (Parquet); CSV
// columns have none (KindText).
type Kind string

// Kinds of columns.
const (
	KindText      Kind = ""                // CSV: the text is all there is
	KindDecimal   Kind = "decimal"         // Parquet DECIMAL
	KindFloat     Kind = "float"           // Parquet FLOAT/DOUBLE
	KindInteger   Kind = "integer"         // Parquet INT32/INT64
	KindString    Kind = "string"          // Parquet UTF-8 string
	KindTimestamp Kind = "timestamp"       // Parquet timestamp adjusted to UTC
	KindLocalTime Kind = "timestamp-local" // Parquet timestamp not adjusted to UTC
	KindOther     Kind = "other"
)

// Cell is one value: its text (a decimal's exact digits, a timestamp in
// RFC 3339 UTC) and whether it is null.
type Cell struct {
	Text string
	Null bool
}

// Dataset is a FOCUS file read into memory.
type Dataset struct {
	// Name names the file in messages.
	Name string
	// Format is "csv" or "parquet".
	Format  string
	Columns []string
	Kinds   []Kind
	Rows    [][]Cell
	// Metadata is the file's key-value metadata (Parquet).
	Metadata map[string]string
	index    map[string]int
}

// Has reports whether the dataset has column name.
func (d *Dataset) Has(name string) bool {
	_, ok := d.index[name]
	return ok
}

// Get is row r's value of column name; a missing column reads as null.
func (d *Dataset) Get(r int, name string) Cell {
	i, ok := d.index[name]
	if !ok {
		return Cell{Null: true}
	}
	return d.Rows[r][i]
}

// Kind is column name's kind.
func (d *Dataset) Kind(name string) Kind {
	if i, ok := d.index[name]; ok {
		return d.Kinds[i]
	}
	return KindOther
}

func (d *Dataset) indexColumns() error {
	d.index = make(map[string]int, len(d.Columns))
	for i, c := range d.Columns {
		if _, dup := d.index[c]; dup {
			return fmt.Errorf("%s: column %s appears twice", d.Name, c)
		}
		d.index[c] = i
	}
	return nil
}

// ReadCSV reads a FOCUS CSV file: a header row, then one row per charge;
// an empty field is null.
func ReadCSV(name string, r io.Reader) (*Dataset, error) {
	cr := csv.NewReader(r)
	header, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("%s: header: %w", name, err)
	}
	d := &Dataset{Name: name, Format: "csv", Columns: header, Kinds: make([]Kind, len(header))}
	if err := d.indexColumns(); err != nil {
		return nil, err
	}
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		row := make([]Cell, len(rec))
		for i, v := range rec {
			row[i] = Cell{Text: v, Null: v == ""}
		}
		d.Rows = append(d.Rows, row)
	}
	return d, nil
}

// ReadParquet reads a FOCUS Parquet file.
func ReadParquet(name string, data []byte) (*Dataset, error) {
	rdr, err := file.NewParquetReader(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	defer rdr.Close()
	d := &Dataset{Name: name, Format: "parquet", Metadata: map[string]string{}}
	for _, kv := range rdr.MetaData().KeyValueMetadata() {
		if kv.Value != nil {
			d.Metadata[kv.Key] = *kv.Value
		}
	}
	fr, err := pqarrow.NewFileReader(rdr, pqarrow.ArrowReadProperties{}, memory.DefaultAllocator)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	tbl, err := fr.ReadTable(context.Background())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	defer tbl.Release()
	n := int(tbl.NumRows())
	d.Rows = make([][]Cell, n)
	for r := range d.Rows {
		d.Rows[r] = make([]Cell, tbl.NumCols())
	}
	for c := range int(tbl.NumCols()) {
		f := tbl.Schema().Field(c)
		d.Columns = append(d.Columns, f.Name)
		d.Kinds = append(d.Kinds, kindOf(f.Type))
		r := 0
		for _, chunk := range tbl.Column(c).Data().Chunks() {
			for i := range chunk.Len() {
				d.Rows[r][c] = cellOf(chunk, i)
				r++
			}
		}
	}
	if err := d.indexColumns(); err != nil {
		return nil, err
	}
	return d, nil
}

func kindOf(t arrow.DataType) Kind {
	switch t := t.(type) {
	case *arrow.Decimal128Type, *arrow.Decimal256Type:
		return KindDecimal
	case *arrow.Float32Type, *arrow.Float64Type:
		return KindFloat
	case *arrow.Int32Type, *arrow.Int64Type, *arrow.Uint32Type, *arrow.Uint64Type, *arrow.Int16Type, *arrow.Uint16Type, *arrow.Int8Type, *arrow.Uint8Type:
		return KindInteger
	case *arrow.StringType, *arrow.LargeStringType:
		return KindString
	case *arrow.TimestampType:
		if t.TimeZone == "UTC" || t.TimeZone == "+00:00" || t.TimeZone == "Z" {
			return KindTimestamp
		}
		return KindLocalTime
	}
	return KindOther
}

// cellOf is value i of a as a Cell: decimals with their exact digits,
// timestamps in RFC 3339 UTC to the second (or finer when not whole).
func cellOf(a arrow.Array, i int) Cell {
	if a.IsNull(i) {
		return Cell{Null: true}
	}
	switch a := a.(type) {
	case *array.Decimal128:
		scale := a.DataType().(*arrow.Decimal128Type).Scale
		return Cell{Text: decimalText(a.Value(i).BigInt(), scale)}
	case *array.Decimal256:
		scale := a.DataType().(*arrow.Decimal256Type).Scale
		return Cell{Text: decimalText(a.Value(i).BigInt(), scale)}
	case *array.Float64:
		return Cell{Text: strconv.FormatFloat(a.Value(i), 'f', -1, 64)}
	case *array.Float32:
		return Cell{Text: strconv.FormatFloat(float64(a.Value(i)), 'f', -1, 32)}
	case *array.String:
		return Cell{Text: a.Value(i)}
	case *array.LargeString:
		return Cell{Text: a.Value(i)}
	case *array.Timestamp:
		unit := a.DataType().(*arrow.TimestampType).Unit
		t := a.Value(i).ToTime(unit).UTC()
		layout := "2006-01-02T15:04:05Z"
		if t.Nanosecond() != 0 {
			layout = time.RFC3339Nano
		}
		return Cell{Text: t.Format(layout)}
	}
	return Cell{Text: a.ValueStr(i)}
}

// decimalText writes v × 10^-scale with exactly scale decimals.
func decimalText(v *big.Int, scale int32) string {
	neg := v.Sign() < 0
	digits := new(big.Int).Abs(v).String()
	if scale > 0 {
		for int32(len(digits)) <= scale {
			digits = "0" + digits
		}
		digits = digits[:int32(len(digits))-scale] + "." + digits[int32(len(digits))-scale:]
	}
	if neg {
		digits = "-" + digits
	}
	return digits
}
