package export

import (
	"fmt"
	"io"
	"time"

	"tokenmeter/billing"
)

// NewUsageCostWriter streams detailed usage-and-cost rows to w in format f:
// the native columns (UsageCostColumns) in CSV, JSON lines and Parquet, or
// the FOCUS columns (FocusColumns) in focus-csv and focus-parquet. Margin is
// computed here: list charge − allocated cost, exact.
func NewUsageCostWriter(w io.Writer, f Format, opts Options) (*Writer[UsageCostRow], error) {
	var (
		enc rowEncoder[UsageCostRow]
		err error
	)
	switch f {
	case CSV:
		c := &usageCSV{finance: opts.Finance, start: rfc3339(), end: rfc3339(), bStart: rfc3339(), bEnd: rfc3339()}
		enc, err = newCSV(w, UsageCostColumns(opts.Finance), isNumberColumn, c.fill)
	case JSONLines:
		enc = newJSONL(w, usageJSONOf(opts.Finance))
	case Parquet:
		po := parquetOptions(opts, "usage_cost")
		if opts.Finance {
			enc = newParquet(w, po, func(r *UsageCostRow, p *usageFinanceParquet) error {
				margin, err := marginOf(r)
				if err != nil {
					return err
				}
				usageParquetOf(r, &p.usageParquet)
				p.AllocatedCost, p.Margin = moneyDecimal(r.AllocatedCost), moneyDecimal(margin)
				return nil
			})
		} else {
			enc = newParquet(w, po, func(r *UsageCostRow, p *usageParquet) error {
				usageParquetOf(r, p)
				return nil
			})
		}
	case FocusCSV, FocusParquet:
		enc, err = newFocus(w, f, opts, usageFocusLines)
	default:
		_, err = ParseFormat(string(f))
	}
	if err != nil {
		return nil, err
	}
	return &Writer[UsageCostRow]{enc: enc}, nil
}

// UsageCostColumns is the header of the usage-and-cost dataset in CSV, and
// its column names in JSON lines and Parquet.
func UsageCostColumns(finance bool) []string {
	cols := []string{
		"charge_period_start", "charge_period_end", "billing_period", "billing_period_start", "billing_period_end",
		"tenant", "model", "deployment", "requests", "input_tokens", "cached_input_tokens", "output_tokens",
		"currency", "input_per_1m", "cached_input_per_1m", "output_per_1m", "list_charge",
	}
	if finance {
		cols = append(cols, "allocated_cost", "margin")
	}
	return append(cols, "price_id", "price_book")
}

// marginOf is the row's list charge − allocated cost, or an error when it
// is out of the range of Money.
func marginOf(r *UsageCostRow) (billing.Money, error) {
	a, b := r.ListCharge, r.AllocatedCost
	m := a - b
	if (b > 0 && m > a) || (b < 0 && m < a) {
		return 0, fmt.Errorf("margin of %s's %s: list charge %s − allocated cost %s is out of range", r.Tenant, r.Model, a, b)
	}
	return m, nil
}

type usageCSV struct {
	finance                  bool
	start, end, bStart, bEnd timeText
	num                      fieldText
}

func (c *usageCSV) fill(r *UsageCostRow, rec []string) ([]string, error) {
	c.num.reset()
	for _, n := range [...]uint64{r.Requests, r.InputTokens, r.CachedInputTokens, r.OutputTokens} {
		c.num.uint(n)
	}
	for _, m := range [...]billing.Money{r.InputPer1M, r.CachedInputPer1M, r.OutputPer1M, r.ListCharge} {
		c.num.money(m)
	}
	if c.finance {
		margin, err := marginOf(r)
		if err != nil {
			return nil, err
		}
		c.num.money(r.AllocatedCost)
		c.num.money(margin)
	}
	num := c.num.fields()
	rec = append(rec, c.start.format(r.ChargePeriodStart), c.end.format(r.ChargePeriodEnd),
		r.BillingPeriod, c.bStart.format(r.BillingPeriodStart), c.bEnd.format(r.BillingPeriodEnd),
		r.Tenant, r.Model, r.Deployment)
	rec = append(rec, num[:4]...)
	rec = append(rec, r.Currency)
	rec = append(rec, num[4:]...)
	return append(rec, r.PriceID, r.PriceBook), nil
}

type usageJSON struct {
	ChargePeriodStart  time.Time      `json:"charge_period_start"`
	ChargePeriodEnd    time.Time      `json:"charge_period_end"`
	BillingPeriod      string         `json:"billing_period"`
	BillingPeriodStart time.Time      `json:"billing_period_start"`
	BillingPeriodEnd   time.Time      `json:"billing_period_end"`
	Tenant             string         `json:"tenant"`
	Model              string         `json:"model"`
	Deployment         string         `json:"deployment"`
	Requests           uint64         `json:"requests"`
	InputTokens        uint64         `json:"input_tokens"`
	CachedInputTokens  uint64         `json:"cached_input_tokens"`
	OutputTokens       uint64         `json:"output_tokens"`
	Currency           string         `json:"currency"`
	InputPer1M         billing.Money  `json:"input_per_1m"`
	CachedInputPer1M   billing.Money  `json:"cached_input_per_1m"`
	OutputPer1M        billing.Money  `json:"output_per_1m"`
	ListCharge         billing.Money  `json:"list_charge"`
	AllocatedCost      *billing.Money `json:"allocated_cost,omitempty"`
	Margin             *billing.Money `json:"margin,omitempty"`
	PriceID            string         `json:"price_id"`
	PriceBook          string         `json:"price_book"`
}

func usageJSONOf(finance bool) func(*UsageCostRow) (any, error) {
	var v usageJSON
	var allocated, margin billing.Money
	return func(r *UsageCostRow) (any, error) {
		v = usageJSON{
			ChargePeriodStart: r.ChargePeriodStart.UTC(), ChargePeriodEnd: r.ChargePeriodEnd.UTC(),
			BillingPeriod: r.BillingPeriod, BillingPeriodStart: r.BillingPeriodStart.UTC(), BillingPeriodEnd: r.BillingPeriodEnd.UTC(),
			Tenant: r.Tenant, Model: r.Model, Deployment: r.Deployment,
			Requests: r.Requests, InputTokens: r.InputTokens, CachedInputTokens: r.CachedInputTokens, OutputTokens: r.OutputTokens,
			Currency: r.Currency, InputPer1M: r.InputPer1M, CachedInputPer1M: r.CachedInputPer1M, OutputPer1M: r.OutputPer1M,
			ListCharge: r.ListCharge, PriceID: r.PriceID, PriceBook: r.PriceBook,
		}
		if finance {
			m, err := marginOf(r)
			if err != nil {
				return nil, err
			}
			allocated, margin = r.AllocatedCost, m
			v.AllocatedCost, v.Margin = &allocated, &margin
		}
		return &v, nil
	}
}

type usageParquet struct {
	ChargePeriodStart  time.Time `parquet:"charge_period_start,timestamp(microsecond)"`
	ChargePeriodEnd    time.Time `parquet:"charge_period_end,timestamp(microsecond)"`
	BillingPeriod      string    `parquet:"billing_period"`
	BillingPeriodStart time.Time `parquet:"billing_period_start,timestamp(microsecond)"`
	BillingPeriodEnd   time.Time `parquet:"billing_period_end,timestamp(microsecond)"`
	Tenant             string    `parquet:"tenant"`
	Model              string    `parquet:"model"`
	Deployment         string    `parquet:"deployment"`
	Requests           uint64    `parquet:"requests"`
	InputTokens        uint64    `parquet:"input_tokens"`
	CachedInputTokens  uint64    `parquet:"cached_input_tokens"`
	OutputTokens       uint64    `parquet:"output_tokens"`
	Currency           string    `parquet:"currency"`
	InputPer1M         decimal16 `parquet:"input_per_1m,decimal(9:38)"`
	CachedInputPer1M   decimal16 `parquet:"cached_input_per_1m,decimal(9:38)"`
	OutputPer1M        decimal16 `parquet:"output_per_1m,decimal(9:38)"`
	ListCharge         decimal16 `parquet:"list_charge,decimal(9:38)"`
	PriceID            string    `parquet:"price_id"`
	PriceBook          string    `parquet:"price_book"`
}

type usageFinanceParquet struct {
	usageParquet
	AllocatedCost decimal16 `parquet:"allocated_cost,decimal(9:38)"`
	Margin        decimal16 `parquet:"margin,decimal(9:38)"`
}

func usageParquetOf(r *UsageCostRow, p *usageParquet) {
	*p = usageParquet{
		ChargePeriodStart: utcMicros(r.ChargePeriodStart), ChargePeriodEnd: utcMicros(r.ChargePeriodEnd),
		BillingPeriod: r.BillingPeriod, BillingPeriodStart: utcMicros(r.BillingPeriodStart), BillingPeriodEnd: utcMicros(r.BillingPeriodEnd),
		Tenant: r.Tenant, Model: r.Model, Deployment: r.Deployment,
		Requests: r.Requests, InputTokens: r.InputTokens, CachedInputTokens: r.CachedInputTokens, OutputTokens: r.OutputTokens,
		Currency: r.Currency, InputPer1M: moneyDecimal(r.InputPer1M), CachedInputPer1M: moneyDecimal(r.CachedInputPer1M),
		OutputPer1M: moneyDecimal(r.OutputPer1M), ListCharge: moneyDecimal(r.ListCharge),
		PriceID: r.PriceID, PriceBook: r.PriceBook,
	}
}

// usageFocusLines maps one usage row to its FOCUS source.
func usageFocusLines(r *UsageCostRow) (focusSource, error) {
	if r.CachedInputTokens > r.InputTokens {
		return focusSource{}, fmt.Errorf("%s usage of %s: cached input tokens %d above input tokens %d", r.Model, r.Tenant, r.CachedInputTokens, r.InputTokens)
	}
	return focusSource{
		tenant: r.Tenant, currency: r.Currency, period: r.BillingPeriod,
		billingStart: r.BillingPeriodStart, billingEnd: r.BillingPeriodEnd,
		chargeStart: r.ChargePeriodStart, chargeEnd: r.ChargePeriodEnd,
		model: r.Model, deployment: r.Deployment, region: r.Region, requests: r.Requests,
		tokens: [3]uint64{r.InputTokens - r.CachedInputTokens, r.CachedInputTokens, r.OutputTokens},
		priced: r.PriceID != "", prices: [3]billing.Money{r.InputPer1M, r.CachedInputPer1M, r.OutputPer1M},
		charge: r.ListCharge, priceID: r.PriceID, priceBook: r.PriceBook,
		hasCost: true, allocated: r.AllocatedCost,
	}, nil
}
