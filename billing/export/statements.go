package export

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	"tokenmeter/billing"
)

// NewStatementWriter streams statement lines to w in format f: the native
// columns (StatementColumns) in CSV, JSON lines and Parquet, or the FOCUS
// columns (FocusColumns) in focus-csv and focus-parquet.
func NewStatementWriter(w io.Writer, f Format, opts Options) (*Writer[StatementRow], error) {
	var (
		enc rowEncoder[StatementRow]
		err error
	)
	switch f {
	case CSV:
		c := &statementCSV{finance: opts.Finance, periodStart: rfc3339(), periodEnd: rfc3339(), chargeStart: rfc3339(), chEnd: rfc3339()}
		enc, err = newCSV(w, StatementColumns(opts.Finance), isNumberColumn, c.fill)
	case JSONLines:
		enc = newJSONL(w, statementJSONOf(opts.Finance))
	case Parquet:
		po := parquetOptions(opts, "statement_lines")
		if opts.Finance {
			enc = newParquet(w, po, func(r *StatementRow, p *statementFinanceParquet) error {
				p.statementParquet = statementParquetOf(r)
				if r.Finance != nil {
					p.AllocatedCost, p.Margin = moneyDecimalPtr(r.Finance.AllocatedCost), moneyDecimalPtr(r.Finance.Margin)
				}
				return nil
			})
		} else {
			enc = newParquet(w, po, func(r *StatementRow, p *statementParquet) error {
				*p = statementParquetOf(r)
				return nil
			})
		}
	case FocusCSV, FocusParquet:
		enc, err = newFocus(w, f, opts, statementFocusLines)
	default:
		_, err = ParseFormat(string(f))
	}
	if err != nil {
		return nil, err
	}
	if !f.IsFocus() {
		enc = linesOnly{enc}
	}
	return &Writer[StatementRow]{enc: enc}, nil
}

// linesOnly is a native encoder of statement rows: one row per line, the
// charge and rounding rows left out.
type linesOnly struct{ rowEncoder[StatementRow] }

func (e linesOnly) write(r *StatementRow) (int, error) {
	if r.Kind != RowLine {
		return 0, nil
	}
	return e.rowEncoder.write(r)
}

// StatementColumns is the header of the statement-lines dataset in CSV,
// and its column names in JSON lines and Parquet.
func StatementColumns(finance bool) []string {
	cols := []string{
		"tenant", "period", "zone", "period_start", "period_end", "currency", "price_book", "statement_hash",
		"kind", "model", "deployment", "original_period", "charge_start", "charge_end", "price_id", "priced",
		"requests", "input_tokens", "cached_input_tokens", "output_tokens",
		"input_per_1m", "cached_input_per_1m", "output_per_1m", "charge",
	}
	if finance {
		cols = append(cols, "allocated_cost", "margin")
	}
	return cols
}

type statementCSV struct {
	finance                                    bool
	periodStart, periodEnd, chargeStart, chEnd timeText
}

func (c *statementCSV) fill(r *StatementRow, rec []string) ([]string, error) {
	l := &r.Line
	rec = append(rec, r.Tenant, r.Period, r.Zone, c.periodStart.format(r.PeriodStart), c.periodEnd.format(r.PeriodEnd),
		r.Currency, r.PriceBook, r.StatementHash,
		string(l.Kind), l.Model, l.Deployment, l.OriginalPeriod, c.chargeStart.format(l.ChargeStart), c.chEnd.format(l.ChargeEnd),
		l.PriceID, strconv.FormatBool(l.Priced),
		uintText(l.Requests), uintText(l.InputTokens), uintText(l.CachedInputTokens), uintText(l.OutputTokens),
		l.InputPer1M.String(), l.CachedInputPer1M.String(), l.OutputPer1M.String(), l.Charge.String())
	if c.finance {
		if r.Finance != nil {
			rec = append(rec, r.Finance.AllocatedCost.String(), r.Finance.Margin.String())
		} else {
			rec = append(rec, "", "")
		}
	}
	return rec, nil
}

type statementJSON struct {
	Tenant            string        `json:"tenant"`
	Period            string        `json:"period"`
	Zone              string        `json:"zone"`
	PeriodStart       time.Time     `json:"period_start"`
	PeriodEnd         time.Time     `json:"period_end"`
	Currency          string        `json:"currency"`
	PriceBook         string        `json:"price_book"`
	StatementHash     string        `json:"statement_hash"`
	Kind              string        `json:"kind"`
	Model             string        `json:"model"`
	Deployment        string        `json:"deployment"`
	OriginalPeriod    string        `json:"original_period"`
	ChargeStart       time.Time     `json:"charge_start"`
	ChargeEnd         time.Time     `json:"charge_end"`
	PriceID           string        `json:"price_id"`
	Priced            bool          `json:"priced"`
	Requests          uint64        `json:"requests"`
	InputTokens       uint64        `json:"input_tokens"`
	CachedInputTokens uint64        `json:"cached_input_tokens"`
	OutputTokens      uint64        `json:"output_tokens"`
	InputPer1M        billing.Money `json:"input_per_1m"`
	CachedInputPer1M  billing.Money `json:"cached_input_per_1m"`
	OutputPer1M       billing.Money `json:"output_per_1m"`
	Charge            billing.Money `json:"charge"`
}

type statementFinanceJSON struct {
	statementJSON
	AllocatedCost *billing.Money `json:"allocated_cost"`
	Margin        *billing.Money `json:"margin"`
}

func statementJSONOf(finance bool) func(*StatementRow) (any, error) {
	var base statementJSON
	var fin statementFinanceJSON
	return func(r *StatementRow) (any, error) {
		l := &r.Line
		base = statementJSON{
			Tenant: r.Tenant, Period: r.Period, Zone: r.Zone, PeriodStart: r.PeriodStart.UTC(), PeriodEnd: r.PeriodEnd.UTC(),
			Currency: r.Currency, PriceBook: r.PriceBook, StatementHash: r.StatementHash,
			Kind: string(l.Kind), Model: l.Model, Deployment: l.Deployment, OriginalPeriod: l.OriginalPeriod,
			ChargeStart: l.ChargeStart.UTC(), ChargeEnd: l.ChargeEnd.UTC(), PriceID: l.PriceID, Priced: l.Priced,
			Requests: l.Requests, InputTokens: l.InputTokens, CachedInputTokens: l.CachedInputTokens, OutputTokens: l.OutputTokens,
			InputPer1M: l.InputPer1M, CachedInputPer1M: l.CachedInputPer1M, OutputPer1M: l.OutputPer1M, Charge: l.Charge,
		}
		if !finance {
			return &base, nil
		}
		fin = statementFinanceJSON{statementJSON: base}
		if r.Finance != nil {
			fin.AllocatedCost, fin.Margin = &r.Finance.AllocatedCost, &r.Finance.Margin
		}
		return &fin, nil
	}
}

type statementParquet struct {
	Tenant            string    `parquet:"tenant"`
	Period            string    `parquet:"period"`
	Zone              string    `parquet:"zone"`
	PeriodStart       time.Time `parquet:"period_start,timestamp(microsecond)"`
	PeriodEnd         time.Time `parquet:"period_end,timestamp(microsecond)"`
	Currency          string    `parquet:"currency"`
	PriceBook         string    `parquet:"price_book"`
	StatementHash     string    `parquet:"statement_hash"`
	Kind              string    `parquet:"kind"`
	Model             string    `parquet:"model"`
	Deployment        string    `parquet:"deployment"`
	OriginalPeriod    string    `parquet:"original_period"`
	ChargeStart       time.Time `parquet:"charge_start,timestamp(microsecond)"`
	ChargeEnd         time.Time `parquet:"charge_end,timestamp(microsecond)"`
	PriceID           string    `parquet:"price_id"`
	Priced            bool      `parquet:"priced"`
	Requests          uint64    `parquet:"requests"`
	InputTokens       uint64    `parquet:"input_tokens"`
	CachedInputTokens uint64    `parquet:"cached_input_tokens"`
	OutputTokens      uint64    `parquet:"output_tokens"`
	InputPer1M        decimal16 `parquet:"input_per_1m,decimal(9:38)"`
	CachedInputPer1M  decimal16 `parquet:"cached_input_per_1m,decimal(9:38)"`
	OutputPer1M       decimal16 `parquet:"output_per_1m,decimal(9:38)"`
	Charge            decimal16 `parquet:"charge,decimal(9:38)"`
}

type statementFinanceParquet struct {
	statementParquet
	AllocatedCost *decimal16 `parquet:"allocated_cost,decimal(9:38)"`
	Margin        *decimal16 `parquet:"margin,decimal(9:38)"`
}

func statementParquetOf(r *StatementRow) statementParquet {
	l := &r.Line
	return statementParquet{
		Tenant: r.Tenant, Period: r.Period, Zone: r.Zone,
		PeriodStart: utcMicros(r.PeriodStart), PeriodEnd: utcMicros(r.PeriodEnd),
		Currency: r.Currency, PriceBook: r.PriceBook, StatementHash: r.StatementHash,
		Kind: string(l.Kind), Model: l.Model, Deployment: l.Deployment, OriginalPeriod: l.OriginalPeriod,
		ChargeStart: utcMicros(l.ChargeStart), ChargeEnd: utcMicros(l.ChargeEnd), PriceID: l.PriceID, Priced: l.Priced,
		Requests: l.Requests, InputTokens: l.InputTokens, CachedInputTokens: l.CachedInputTokens, OutputTokens: l.OutputTokens,
		InputPer1M: moneyDecimal(l.InputPer1M), CachedInputPer1M: moneyDecimal(l.CachedInputPer1M),
		OutputPer1M: moneyDecimal(l.OutputPer1M), Charge: moneyDecimal(l.Charge),
	}
}

// statementFocusLines maps one statement row to its FOCUS source.
func statementFocusLines(r *StatementRow) (focusSource, error) {
	l := &r.Line
	src := focusSource{
		tenant: r.Tenant, currency: r.Currency, period: r.Period, invoiceID: r.InvoiceID, region: r.Region,
		billingStart: r.PeriodStart, billingEnd: r.PeriodEnd, chargeStart: l.ChargeStart, chargeEnd: l.ChargeEnd,
		priceBook: r.PriceBook, statementHash: r.StatementHash,
	}
	switch r.Kind {
	case RowRounding:
		src.kind, src.total, src.chargeStart, src.chargeEnd = sourceRounding, r.Total, r.PeriodStart, r.PeriodEnd
		return src, nil
	case RowCharge:
		src, err := chargeFocusSource(src, r.Charge)
		if err == nil && r.Finance != nil {
			src.hasCost, src.allocated = true, r.Finance.AllocatedCost
		}
		return src, err
	case RowTax:
		if r.Tax == nil {
			return focusSource{}, fmt.Errorf("tax row of %s without its tax", r.Tenant)
		}
		src.kind, src.charge, src.taxRate, src.chargeStart, src.chargeEnd = sourceTax, r.Tax.Amount, r.Tax.Rate, r.PeriodStart, r.PeriodEnd
		src.text = r.Tax.Name + " at " + r.Tax.Rate.String() + " of the invoice's subtotal"
		return src, nil
	}
	if l.CachedInputTokens > l.InputTokens {
		return focusSource{}, fmt.Errorf("%s line of %s: cached input tokens %d above input tokens %d", l.Model, r.Tenant, l.CachedInputTokens, l.InputTokens)
	}
	switch l.Kind {
	case billing.LineAdjustment:
		src.kind = sourceLate
	case billing.LineRepricing:
		src.kind = sourceRepricing
	}
	src.originalPeriod, src.model, src.deployment, src.requests = l.OriginalPeriod, l.Model, l.Deployment, l.Requests
	src.tokens = [3]uint64{l.InputTokens - l.CachedInputTokens, l.CachedInputTokens, l.OutputTokens}
	src.priced = l.Priced && l.Kind != billing.LineRepricing
	src.prices = [3]billing.Money{l.InputPer1M, l.CachedInputPer1M, l.OutputPer1M}
	src.charge, src.priceID = l.Charge, l.PriceID
	if r := l.Repriced; l.Kind == billing.LineRepricing && r != nil {
		if r.CachedInputTokens > r.InputTokens {
			return focusSource{}, fmt.Errorf("repricing of %s for %s: cached input tokens %d above input tokens %d", l.Model, l.OriginalPeriod, r.CachedInputTokens, r.InputTokens)
		}
		src.tokens = [3]uint64{r.InputTokens - r.CachedInputTokens, r.CachedInputTokens, r.OutputTokens}
		src.repriced = &[3]billing.Money{r.InputCharge, r.CachedInputCharge, r.OutputCharge}
	}
	for _, d := range r.Discounts {
		k := slices.Index(tokenKinds[:], d.TokenKind)
		if l.Kind == billing.LineRepricing && k >= 0 {
			src.repricedDiscount[k] += d.Amount // the contract's part of the kind's difference
			continue
		}
		tokens, err := strconv.ParseUint(d.Quantity, 10, 64)
		if k < 0 || err != nil || d.Unit != "tokens" {
			return focusSource{}, fmt.Errorf("%s line of %s: discount %q: want tokens of input, cached_input or output", l.Model, r.Tenant, d.Rule)
		}
		price, err := billing.ParseMoney(d.UnitPrice)
		if err != nil {
			return focusSource{}, fmt.Errorf("%s line of %s: discount %q: unit price: %w", l.Model, r.Tenant, d.Rule, err)
		}
		src.discounts[k] = append(src.discounts[k], discountPart{tokens: tokens, price: price, rule: d.Rule})
	}
	if r.Finance != nil {
		src.hasCost, src.allocated = true, r.Finance.AllocatedCost
	}
	return src, nil
}

// chargeFocusSource is the FOCUS source of a statement's charge other than
// a discount.
func chargeFocusSource(src focusSource, c *billing.Charge) (focusSource, error) {
	if c == nil {
		return focusSource{}, fmt.Errorf("charge row of %s without its charge", src.tenant)
	}
	src.chargeStart, src.chargeEnd = c.ChargeStart, c.ChargeEnd
	src.model, src.deployment, src.charge, src.rule, src.text = c.Model, c.Deployment, c.Amount, c.Rule, c.Description
	src.originalPeriod = c.OriginalPeriod
	switch c.Kind {
	case billing.ChargeDedicated:
		src.kind, src.priced = sourceDedicated, true // x_Priced: at the contract's rate
		q, err := billing.ParseMoney(c.Quantity)     // GPU-hours: at most 6 decimals
		if err != nil || q < 0 || q%1000 != 0 {
			return focusSource{}, fmt.Errorf("dedicated charge of %s: GPU-hours %q: want at most 6 decimals", src.tenant, c.Quantity)
		}
		src.quantityMicro = uint64(q / 1000)
		if src.unitPrice, err = billing.ParseMoney(c.UnitPrice); err != nil {
			return focusSource{}, fmt.Errorf("dedicated charge of %s: unit price: %w", src.tenant, err)
		}
	case billing.ChargeCommitment:
		src.kind = sourceCommitment
	case billing.ChargeCredit:
		src.kind = sourceCredit
	default:
		return focusSource{}, fmt.Errorf("charge of %s: kind %q has no FOCUS mapping", src.tenant, c.Kind)
	}
	return src, nil
}
