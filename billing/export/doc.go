// Package export writes billing data in the formats tenants and finance
// teams load: CSV, JSON lines, Parquet, and FOCUS 1.2 (the FinOps Open Cost
// and Usage Specification) as CSV or Parquet. It owns the encodings and the
// FOCUS mapping; it reads nothing from storage, computes no statement and
// decides no access (the caller passes rows it may export, and says whether
// the finance-only columns appear).
//
// Two datasets:
//
//   - statement lines (StatementRow): one row per line of one or many
//     statements, with the statement's tenant, period, zone, currency, price
//     book version and hash; with Options.Finance, the line's allocated cost
//     and margin (filled by the caller).
//   - detailed usage and cost (UsageCostRow): one row per tenant × model ×
//     deployment × hour (or day) under one token price, with list charge and,
//     with Options.Finance, allocated cost and margin.
//
// Encoders are streamed: Writer.Write takes one row at a time; CSV and JSON
// lines go out through a small buffer, Parquet in row groups of at most
// Options.RowGroupRows rows, so memory does not grow with the export's size.
// The same rows always give the same bytes: no timestamps, no creator string
// that varies with the build, no map iteration.
//
// # Money
//
// Money is exact. In CSV and JSON lines an amount is the shortest exact
// decimal string of billing.Money ("1.5", "0.000000001"; a JSON string, never
// a JSON number). In Parquet an amount is DECIMAL(38, 9) (a 16-byte
// big-endian FIXED_LEN_BYTE_ARRAY): the unscaled value is the amount in
// nano-units, so any reader that sums decimals sums exactly and gets the
// same totals as the statement. Times are UTC: RFC 3339 strings in CSV and
// JSON lines (FOCUS: YYYY-MM-DDTHH:mm:ssZ), TIMESTAMP(MICROS, UTC) in Parquet.
//
// # CSV and spreadsheets
//
// The CSV formats write through internal/safecsv, so that no cell opens as
// a formula in a spreadsheet whatever a tenant, model, deployment or price
// id holds. The count, quantity, price and amount columns (isNumberColumn)
// are plain numbers: a negative margin "-12.5" stays a number. Every other
// column is text, with an apostrophe in front of = + - @, tab or CR (and
// their full-width forms) wherever a cell could start: "=HYPERLINK(...)" is
// written "'=HYPERLINK(...)", a zone "+05:30" "'+05:30", "a;=1" "a;'=1".
// JSON lines and Parquet carry every value verbatim.
//
// # FOCUS mapping
//
// A FOCUS row is one token kind of one source row: input (uncached input
// tokens, priced at the input price), cached_input and output, so that a row
// has one unit price. Kinds with no tokens are left out, except input, which
// is always written (it carries x_Requests, so that requests are counted
// once). SkuId is "<model>:<kind>", SkuPriceId "<price id>:<kind>";
// ConsumedQuantity is the kind's tokens (ConsumedUnit "Tokens");
// PricingQuantity is tokens / 1,000,000 (PricingUnit "1000000 Tokens") and
// ListUnitPrice = ContractedUnitPrice the price per 1M tokens.
// BilledCost = EffectiveCost = ListCost = ContractedCost (list prices, no
// discounts or commitments): the source row's charge split over its kinds by
// largest remainder of the exact per-kind charges, so each kind is within a
// nano-unit of price × quantity and the kinds add up exactly to the row's
// charge (hence to the statement's). The allocated cost (x_AllocatedCost,
// finance only) is split over the kinds in proportion to their tokens, also
// by largest remainder; x_Margin = ListCost − x_AllocatedCost.
//
// A statement's adjustment line (late usage of a closed period) maps to
// ChargeCategory "Adjustment" with ChargeClass "Correction"; FOCUS then
// requires ConsumedQuantity and ConsumedUnit to be null, so the tokens are in
// x_Tokens (written on every row). Usage lines are ChargeCategory "Usage"
// with a null ChargeClass. SubAccountId is the tenant, ResourceId the
// deployment (null when the line is not per deployment), BillingAccountId
// the tenant unless FocusParty.BillingAccountID names one, ProviderName,
// PublisherName and InvoiceIssuerName "tokenmeter" unless configured,
// ServiceCategory "AI and Machine Learning", ServiceSubcategory "Generative
// AI", ChargeFrequency "Usage-Based", PricingCategory "Standard". The
// project's own dimensions follow the FOCUS columns as x_ columns.
package export
