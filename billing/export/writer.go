package export

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/parquet-go/parquet-go"

	"tokenmeter/billing"
	"tokenmeter/internal/safecsv"
)

// DefaultRowGroupRows is the default number of rows of a Parquet row group:
// what the writer holds in memory before writing it out.
const DefaultRowGroupRows = 64 * 1024

// ErrClosed marks a write to a closed Writer.
var ErrClosed = errors.New("export writer closed")

// Options shape an export.
type Options struct {
	// Finance adds the finance-only columns (allocated cost, margin) and,
	// in FOCUS files, the deployment names and price book versions. A
	// tenant's export leaves it false.
	Finance bool
	// RowGroupRows bounds a Parquet row group; DefaultRowGroupRows if zero.
	RowGroupRows int64
	// Accounts names the parties of FOCUS rows: the operator's provider,
	// publisher and invoice issuer names, each tenant's billing account id
	// and display name. Nil: billing.DefaultOperatorName, and each tenant's
	// id as its account and name.
	Accounts *billing.Accounts
	// ServiceName is FOCUS ServiceName; "<provider name> inference" when
	// empty.
	ServiceName string
	// GPUTimeWeights, when not nil, replaces DefaultGPUTimeWeights: the GPU
	// time of a token of each kind, by which a row's allocated cost is
	// split over its FOCUS rows.
	GPUTimeWeights *[3]uint64
}

func (o Options) gpuTimeWeights() [3]uint64 {
	if o.GPUTimeWeights != nil {
		return *o.GPUTimeWeights
	}
	return DefaultGPUTimeWeights
}

// Writer streams rows of type R (StatementRow or UsageCostRow) to an
// io.Writer in one format. It is not safe for concurrent use.
type Writer[R any] struct {
	enc    rowEncoder[R]
	rows   int64 // rows of the file
	in     int64 // rows given to Write
	err    error
	closed bool
}

// rowEncoder is one format's encoding of rows of type R.
type rowEncoder[R any] interface {
	// write encodes r and returns the number of rows it wrote to the file
	// (a FOCUS row of usage is one row per token kind; a native encoder
	// skips a statement's rounding row).
	write(r *R) (int, error)
	// flush writes buffered rows out, where the format allows.
	flush() error
	// close flushes and ends the output (the Parquet footer).
	close() error
}

// Write encodes one row. After an error, every later call returns it.
func (w *Writer[R]) Write(r R) error {
	if w.closed {
		return ErrClosed
	}
	if w.err != nil {
		return w.err
	}
	n, err := w.enc.write(&r)
	w.rows += int64(n)
	w.in++
	if err != nil {
		w.err = fmt.Errorf("export row %d: %w", w.in, err)
		return w.err
	}
	return nil
}

// Rows is the number of rows of the file written so far: FOCUS rows (one
// per token kind, rounding rows) in the FOCUS formats.
func (w *Writer[R]) Rows() int64 { return w.rows }

// Flush writes buffered CSV and JSON lines out to the io.Writer (for
// streaming responses); Parquet goes out a row group at a time.
func (w *Writer[R]) Flush() error {
	if w.err != nil || w.closed {
		return w.err
	}
	if err := w.enc.flush(); err != nil {
		w.err = fmt.Errorf("flush export: %w", err)
	}
	return w.err
}

// Close writes whatever is buffered and ends the output; it does not close
// the io.Writer. An empty export is a valid file (a CSV header, an empty
// JSON lines file, a Parquet file with no rows).
func (w *Writer[R]) Close() error {
	if w.closed {
		return w.err
	}
	w.closed = true
	if err := w.enc.close(); err != nil && w.err == nil {
		w.err = fmt.Errorf("close export: %w", err)
	}
	return w.err
}

// csvEncoder writes a header, then one record per row, through safecsv:
// numeric names the columns of numbers (counts and amounts), every other
// column is text, so that no cell opens as a spreadsheet formula.
type csvEncoder[R any] struct {
	cw     *safecsv.Writer
	record []string
	fill   func(r *R, record []string) ([]string, error)
}

func newCSV[R any](w io.Writer, header []string, numeric func(column string) bool, fill func(*R, []string) ([]string, error)) (*csvEncoder[R], error) {
	cw := safecsv.NewWriter(w, safecsv.Numeric(header, numeric))
	e := &csvEncoder[R]{cw: cw, record: make([]string, 0, len(header)), fill: fill}
	if err := e.cw.Write(header); err != nil {
		return nil, fmt.Errorf("write csv header: %w", err)
	}
	return e, nil
}

func (e *csvEncoder[R]) write(r *R) (int, error) {
	rec, err := e.fill(r, e.record[:0])
	if err != nil {
		return 0, err
	}
	e.record = rec
	if err := e.cw.Write(rec); err != nil { // the writer buffers and writes through: bounded
		return 0, err
	}
	return 1, nil
}

func (e *csvEncoder[R]) flush() error { return e.cw.Flush() }

func (e *csvEncoder[R]) close() error { return e.flush() }

// jsonlEncoder writes one JSON object per line.
type jsonlEncoder[R any] struct {
	bw   *bufio.Writer
	enc  *json.Encoder
	conv func(r *R) (any, error)
}

func newJSONL[R any](w io.Writer, conv func(*R) (any, error)) *jsonlEncoder[R] {
	bw := bufio.NewWriterSize(w, 64<<10)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	return &jsonlEncoder[R]{bw: bw, enc: enc, conv: conv}
}

func (e *jsonlEncoder[R]) write(r *R) (int, error) {
	v, err := e.conv(r)
	if err != nil {
		return 0, err
	}
	if err := e.enc.Encode(v); err != nil { // Encode ends the object with a newline
		return 0, err
	}
	return 1, nil
}

func (e *jsonlEncoder[R]) flush() error { return e.bw.Flush() }

func (e *jsonlEncoder[R]) close() error { return e.bw.Flush() }

// parquetBatch is how many rows go to the Parquet writer at once.
const parquetBatch = 1024

// parquetEncoder converts rows to the Parquet struct P and writes them in
// batches; the Parquet writer cuts row groups of at most RowGroupRows.
type parquetEncoder[R, P any] struct {
	pw    *parquet.GenericWriter[P]
	batch []P
	conv  func(r *R, p *P) error
}

// parquetOptions are the writer options of every Parquet export: fixed
// creator string (no build or version that varies), Snappy pages, bounded
// row groups, and the money encoding recorded in the footer.
func parquetOptions(opts Options, dataset string) []parquet.WriterOption {
	rows := opts.RowGroupRows
	if rows <= 0 {
		rows = DefaultRowGroupRows
	}
	return []parquet.WriterOption{
		parquet.CreatedBy("tokenmeter", "export", "1"),
		parquet.Compression(&parquet.Snappy),
		parquet.MaxRowsPerRowGroup(rows),
		parquet.KeyValueMetadata("tokenmeter.dataset", dataset),
		parquet.KeyValueMetadata("tokenmeter.money", "DECIMAL(38,9): unscaled values are nano-units of the row's currency"),
	}
}

func newParquet[R, P any](w io.Writer, opts []parquet.WriterOption, conv func(*R, *P) error) *parquetEncoder[R, P] {
	return &parquetEncoder[R, P]{
		pw:    parquet.NewGenericWriter[P](w, opts...),
		batch: make([]P, 0, parquetBatch),
		conv:  conv,
	}
}

func (e *parquetEncoder[R, P]) write(r *R) (int, error) {
	e.batch = e.batch[:len(e.batch)+1]
	p := &e.batch[len(e.batch)-1]
	var zero P
	*p = zero
	if err := e.conv(r, p); err != nil {
		e.batch = e.batch[:len(e.batch)-1]
		return 0, err
	}
	if len(e.batch) == cap(e.batch) {
		if err := e.writeBatch(); err != nil {
			return 0, err
		}
	}
	return 1, nil
}

func (e *parquetEncoder[R, P]) writeBatch() error {
	if len(e.batch) == 0 {
		return nil
	}
	_, err := e.pw.Write(e.batch)
	e.batch = e.batch[:0]
	if err != nil {
		return fmt.Errorf("write parquet rows: %w", err)
	}
	return nil
}

func (e *parquetEncoder[R, P]) flush() error { return e.writeBatch() }

func (e *parquetEncoder[R, P]) close() error {
	if err := e.writeBatch(); err != nil {
		return err
	}
	if err := e.pw.Close(); err != nil {
		return fmt.Errorf("close parquet: %w", err)
	}
	return nil
}
