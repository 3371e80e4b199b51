package export

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"

	"github.com/parquet-go/parquet-go"
)

// FocusMetadata is the FOCUS 1.2 metadata of a FOCUS file (specification
// "Metadata"): the data generator, and the schema the file follows. A FOCUS
// Parquet file carries it in its key-value metadata (keys FocusVersion,
// DataGenerator, SchemaId, and FocusSchema with this whole document as
// JSON); a FOCUS CSV has no place for it, so the export serves it beside
// the file (the REST export's X-Focus-* headers name the version, generator
// and schema id; FocusMetadataOf gives the document).
type FocusMetadata struct {
	// SchemaID identifies the column set: "tokenmeter-focus-1.2-" and the
	// first 12 hex digits of the SHA-256 of the column definitions, so a
	// schema that changes gets a new id and one that does not keeps it.
	SchemaID         string                  `json:"SchemaId"`
	FocusVersion     string                  `json:"FocusVersion"`
	DataGenerator    string                  `json:"DataGenerator"`
	ColumnDefinition []FocusColumnDefinition `json:"ColumnDefinition"`
}

// FocusColumnDefinition is one column of the schema.
type FocusColumnDefinition struct {
	ColumnName       string `json:"ColumnName"`
	DataType         string `json:"DataType"`
	NumericPrecision int    `json:"NumericPrecision,omitempty"`
	NumberScale      int    `json:"NumberScale,omitempty"`
	StringEncoding   string `json:"StringEncoding,omitempty"`
}

// focusColumnTypes are the FOCUS data types of the columns that are not
// strings; decimals give their scale.
var focusColumnTypes = map[string]FocusColumnDefinition{
	"BilledCost": {DataType: "DECIMAL", NumberScale: costScale}, "ContractedCost": {DataType: "DECIMAL", NumberScale: costScale},
	"EffectiveCost": {DataType: "DECIMAL", NumberScale: costScale}, "ListCost": {DataType: "DECIMAL", NumberScale: costScale},
	"x_Margin":            {DataType: "DECIMAL", NumberScale: costScale},
	"ContractedUnitPrice": {DataType: "DECIMAL", NumberScale: 9}, "ListUnitPrice": {DataType: "DECIMAL", NumberScale: 9},
	"PricingQuantity": {DataType: "DECIMAL", NumberScale: 9}, "ConsumedQuantity": {DataType: "DECIMAL", NumberScale: 9},
	"x_AllocatedCost":  {DataType: "DECIMAL", NumberScale: 9},
	"BillingPeriodEnd": {DataType: "DATETIME"}, "BillingPeriodStart": {DataType: "DATETIME"},
	"ChargePeriodEnd": {DataType: "DATETIME"}, "ChargePeriodStart": {DataType: "DATETIME"},
	"SkuPriceDetails": {DataType: "JSON"},
	"x_Tokens":        {DataType: "INTEGER"}, "x_Requests": {DataType: "INTEGER"}, "x_Priced": {DataType: "BOOLEAN"},
}

// FocusMetadataOf is the metadata of a FOCUS file written with opts.
func FocusMetadataOf(opts Options) FocusMetadata {
	provider, _, _ := opts.Accounts.Names()
	md := FocusMetadata{FocusVersion: FocusVersion, DataGenerator: provider}
	for _, c := range FocusColumns(opts.Finance) {
		d, ok := focusColumnTypes[c]
		if !ok {
			d = FocusColumnDefinition{DataType: "STRING", StringEncoding: "UTF-8"}
		}
		if d.DataType == "DECIMAL" {
			d.NumericPrecision = 38
		}
		d.ColumnName = c
		md.ColumnDefinition = append(md.ColumnDefinition, d)
	}
	cols, _ := json.Marshal(md.ColumnDefinition) // plain data: cannot fail
	sum := sha256.Sum256(slices.Concat([]byte(FocusVersion+"\x00"), cols))
	md.SchemaID = "tokenmeter-focus-" + FocusVersion + "-" + hex.EncodeToString(sum[:6])
	return md
}

// focusParquetMetadata is the FOCUS metadata as Parquet key-value metadata.
func focusParquetMetadata(opts Options) []parquet.WriterOption {
	md := FocusMetadataOf(opts)
	doc, _ := json.Marshal(md) // plain data: cannot fail
	return []parquet.WriterOption{
		parquet.KeyValueMetadata("FocusVersion", md.FocusVersion),
		parquet.KeyValueMetadata("DataGenerator", md.DataGenerator),
		parquet.KeyValueMetadata("SchemaId", md.SchemaID),
		parquet.KeyValueMetadata("FocusSchema", string(doc)),
		parquet.KeyValueMetadata("focus.version", md.FocusVersion),
	}
}
