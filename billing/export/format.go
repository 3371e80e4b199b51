package export

import (
	"errors"
	"fmt"
	"strings"
)

// ErrUnknownFormat marks an export format name ParseFormat does not know.
var ErrUnknownFormat = errors.New("unknown export format")

// Format is an export encoding.
type Format string

// The formats.
const (
	CSV          Format = "csv"
	JSONLines    Format = "jsonl"
	Parquet      Format = "parquet"
	FocusCSV     Format = "focus-csv"
	FocusParquet Format = "focus-parquet"
)

// Formats lists every format, in the order help texts name them.
func Formats() []Format { return []Format{CSV, JSONLines, Parquet, FocusCSV, FocusParquet} }

// ParseFormat reads a format name. Errors wrap ErrUnknownFormat and name
// the formats there are.
func ParseFormat(name string) (Format, error) {
	for _, f := range Formats() {
		if string(f) == name {
			return f, nil
		}
	}
	names := make([]string, 0, len(Formats()))
	for _, f := range Formats() {
		names = append(names, string(f))
	}
	return "", fmt.Errorf("%w %q: want one of %s", ErrUnknownFormat, name, strings.Join(names, ", "))
}

// ContentType is the format's HTTP media type.
func (f Format) ContentType() string {
	switch f {
	case CSV, FocusCSV:
		return "text/csv; charset=utf-8"
	case JSONLines:
		return "application/x-ndjson"
	case Parquet, FocusParquet:
		return "application/vnd.apache.parquet"
	}
	return "application/octet-stream"
}

// Extension is the file name extension of the format, with its dot.
func (f Format) Extension() string {
	switch f {
	case CSV, FocusCSV:
		return ".csv"
	case JSONLines:
		return ".jsonl"
	case Parquet, FocusParquet:
		return ".parquet"
	}
	return ""
}

// IsFocus reports whether f writes the FOCUS dataset.
func (f Format) IsFocus() bool { return f == FocusCSV || f == FocusParquet }
