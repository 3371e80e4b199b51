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
// The focus formats follow FOCUS 1.2. Every FOCUS column this mapping can
// fill is present (Mandatory, and the Conditional ones that apply to a
// provider of metered inference with published prices, sub-accounts and
// regions: SubAccountName, SkuId, SkuMeter, SkuPriceId, SkuPriceDetails,
// ListUnitPrice, ContractedUnitPrice, ConsumedQuantity/Unit, RegionId,
// RegionName, InvoiceId); the project's own dimensions follow as x_
// columns.
//
// Rows. A FOCUS row of usage is one token kind of a statement line or
// usage row under one price: input (uncached input tokens, priced at the
// input price), cached_input and output. Kinds with no tokens are left
// out, except input, which is always written: its first row carries
// x_Requests, so requests are counted once. Where a contract discounts
// part of a kind's tokens (billing.ChargeDiscount), the kind has a row per
// contracted price: the discounted tokens at theirs, the others at list;
// so each row has one ContractedUnitPrice. A statement then has a row per
// other charge (dedicated GPU-hours, commitment true-up, credit) and ends
// with exactly one rounding row (below). The native statement datasets stay
// one row per line.
//
// Units and exact costs. PricingUnit is "1000000 Tokens", the unit of the
// price book; PricingQuantity is tokens / 10^6 (exact, 6 decimals);
// ListUnitPrice is the list price per 1M tokens (exact, up to 9 decimals);
// ContractedUnitPrice the contract's price per 1M (the list price without
// a contract). ListCost = ListUnitPrice × PricingQuantity and
// ContractedCost = ContractedUnitPrice × PricingQuantity exactly, on every
// row: costs carry the product's own precision, 15 decimals (CSV: the
// shortest exact decimal; Parquet: DECIMAL(38, 15), unit prices and
// quantities DECIMAL(38, 9)). EffectiveCost = BilledCost = ContractedCost
// (nothing is amortized). ConsumedQuantity is the tokens, ConsumedUnit
// "Tokens". PricingCategory is "Standard", at list and at a contract's
// price alike (FOCUS: the agreed rate, negotiated discounts and tiers
// included; "Committed" is for commitment discounts, which are not
// offered).
//
// Rounding row. A statement is billed at its Total: the exact charge
// rounded once to the currency's minor unit. The exact row costs of a
// statement add up to a little more or less than that (and the line
// charges of the statement, rounded to the nano-unit per line, differ from
// them in the last nano-units), so each statement's rows end with one row
// ChargeCategory "Adjustment", ChargeClass null, ChargeFrequency
// "One-Time", no SKU, price or quantity, whose four costs are Total − the
// sum of the statement's other rows. The BilledCost of a statement's rows
// then sums to its payable Total exactly, in every format; a statement
// always has this row, even when it is 0, so every statement (and its
// InvoiceId) is in the file. Usage-and-cost files have no rounding row:
// they are not bills. Their rows are at list price (the price book that
// billed, or will bill, the row's period: closing): a contract's prices,
// tiers, allowances and dedicated GPU-hours apply to a whole period at its
// close, so only the statement files carry contracted costs, and for a
// tenant with a contract a usage-and-cost file's BilledCost is its list
// cost, not its invoice basis.
//
// Corrections. Late usage of a closed period (a statement's adjustment
// line) is ChargeCategory "Usage" with ChargeClass "Correction": it keeps
// its ConsumedQuantity, prices and SKU, so usage analytics count its
// tokens. A repricing line (a closed period repriced with the book in
// force now) is "Usage" + "Correction" too, a row per token kind
// (billing.Repriced): the kind's SKU, the period's tokens of the kind as
// PricingQuantity, the kind's part of the repricing as its costs, no unit
// prices (the row is a difference of two prices) and no ConsumedQuantity
// or x_Tokens (the tokens were consumed, and counted, in the period
// repriced). A repricing closed before lines carried the breakdown is one
// row of its amount, without SKU, price or quantity (FOCUS allows the
// nulls on a correction).
//
// Contract charges (billing.Charge). Discounts lower the ContractedCost,
// EffectiveCost and BilledCost of the rows of their line and kind as
// above; ListCost stays at list. Dedicated capacity
// (billing.ChargeDedicated) is a Usage row per deployment and rate:
// SkuId "dedicated-gpu-hour", SkuMeter "Dedicated GPU Hours", PricingUnit
// and ConsumedUnit "GPU-Hours", the GPU-hours as quantities (6 decimals),
// the contracted rate as both unit prices, PricingCategory "Standard";
// the tokens served on it are discounted to a price of 0. (It bills the
// GPU-hours the deployment used, not capacity held whether used or not, so
// the files have no CapacityReservation columns; nor CommitmentDiscount
// ones: a spend commitment's true-up is not a commitment discount.) A
// commitment's
// true-up is ChargeCategory "Adjustment", ChargeFrequency "Recurring"; a
// credit drawn is ChargeCategory "Credit", ChargeFrequency "One-Time";
// both are amounts without SKU, price or quantity, with ListCost =
// ContractedCost = EffectiveCost = BilledCost (FOCUS: a charge unrelated to
// other charges). The contract rounds each discount to the nano-unit; the
// rows' exact products differ from it by a few nano-units at most, which
// the rounding row takes.
//
// SKUs and prices. SkuId is "<model>:<kind>" (one SKU per model and token
// kind, whatever its price); SkuMeter "Input Tokens", "Cached Input
// Tokens" or "Output Tokens". SkuPriceId is "<price id>:<kind>#<8 hex>":
// the price book entry (model and effective time), the kind and the first
// 8 hex digits of the SHA-256 of the entry, kind, price and currency, so
// that a price edited in place (same model and start, another amount) has
// another SkuPriceId: one SkuPriceId, one ListUnitPrice, in any file.
// SkuPriceDetails is a FOCUS key-value JSON object of the price's
// properties that are not amounts or dates: {"x_Model": ..., "x_TokenKind":
// ...} ({"x_Kind": "dedicated GPU-hour"} for GPU-hours). Unpriced usage (a
// model without a list price) has null prices and SkuPriceId and costs 0;
// closes refuse it unless an admin flags it (closing).
//
// Parties and accounts (billing.Accounts, meterd --billing-accounts).
// ProviderName, PublisherName and InvoiceIssuerName are the operator's
// names (billing.DefaultOperatorName without a file); ServiceName
// "<provider name> inference". BillingAccountId is the tenant's
// billing_account_id (its id without one), BillingAccountName and
// SubAccountName its display name, SubAccountId the tenant id. InvoiceId
// is the number of the invoice of the statement revision in force
// (StatementRow.InvoiceID, filled by closing), on every row of the
// statement, null while none is issued. When the invoice has tax (a rate
// per tenant), a Tax row follows the rounding row (RowTax): ChargeCategory
// "Tax", BilledCost the invoice's tax (rounded once to the minor unit),
// ListCost, ContractedCost and EffectiveCost the rate × those of the
// statement's rows (FOCUS computes a tax from the charges it taxes), no
// SKU, price or quantity. So the BilledCost of an InvoiceId's rows adds up
// to the invoice's payable total, and the rows before the Tax row to the
// statement's Total.
//
// Regions. RegionId and RegionName are the region the deployment's GPU
// samples name (the GPU cost rows keep it per deployment-hour; the
// samples carry no display name, so RegionName repeats the id). A
// statement line not per deployment gets the one region of every
// deployment of the period; a deployment in several regions, or none
// known, gives a null region.
//
// Views. A tenant's file (Options.Finance false) has the same FOCUS
// columns but no deployment names (ResourceId, ResourceName, ResourceType
// and x_Deployment null) and no price book versions (x_PriceBook null);
// finance's adds x_AllocatedCost and x_Margin.
//
// # GPU cost in FOCUS
//
// The provider's own GPU cost is not a charge to the tenant: it appears
// only in finance's files, in x_AllocatedCost (the GPU cost allocated to
// the row under the price book's busy and idle policies) and x_Margin
// (BilledCost − x_AllocatedCost). No FOCUS cost column holds it, so a
// FinOps tool that loads these files beside the cloud's own bill (where
// the GPUs appear as the cloud's charges) counts the GPUs once, from the
// cloud's bill, and reads the tenants' revenue here; to see cost of
// revenue it reads x_AllocatedCost, which never adds to BilledCost. Idle
// GPU time is in x_AllocatedCost too, spread over the tenants when the
// idle policy shares it; the separate idle policy's __idle__ pseudo-tenant
// is not a billing account and has no FOCUS row (the native usage-and-cost
// formats, GetCost and the cost report still show it).
//
// A row's allocated cost is split over its token kinds by GPU time, not
// token count: each kind weighs its tokens × the GPU time of one of its
// tokens (DefaultGPUTimeWeights, tenths of an uncached input token's:
// uncached input 10, cached input 1, output 40; Options.GPUTimeWeights
// overrides them). Prefill computes a prompt's uncached tokens in parallel,
// a prefix-cache hit skips most of that work, and decode runs one forward
// step per output token, bound by memory bandwidth, so an output token
// takes about four times an input token's GPU time on the deployments we
// serve (the ratio of prefill to decode throughput per replica). The
// weights are fixed, not measured per row: a closed statement's file must
// come out byte for byte the same at every export, and latencies read from
// the rollups move with late events (and measure waiting, not GPU work,
// under batching). Within a
// kind, the cost is split over the kind's rows (contract prices) by
// tokens. Both splits are by largest remainder: the rows of a source add
// up to its allocated cost exactly.
package export
