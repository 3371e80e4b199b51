package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net/url"
	"slices"
	"strings"
	"time"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

var (
	// hourSteps are the steps of cost and GPU usage, which are computed
	// per hour.
	hourSteps = []string{"total", "hour", "day", "month"}
	// costGroupFields are the dimensions cost groups by
	// (query.CostGroupFields).
	costGroupFields = []string{"tenant_id", "model", "deployment", "gpu_type", "engine", "tensor_parallelism", "model_version"}
	// busyPolicies and idlePolicies are the allocation policies, the
	// server's default first (billing.BusyPolicies, billing.IdlePolicies).
	busyPolicies = []string{"tokens", "weighted_tokens", "request_time"}
	idlePolicies = []string{"separate", "shared_weighted", "shared_even"}

	// costShape is the selector of GET /v1/cost: top-level parameters on
	// whole hours.
	costShape = selectorShape{unit: time.Hour, unitName: "hour", steps: hourSteps,
		groupFields: costGroupFields, tenant: true, nothing: "cost or usage"}
)

// idleTenant is the tenant_id of the series that hold idle cost under the
// "separate" idle policy (billing.IdleTenant).
const idleTenant = "__idle__"

// Decimals of money in tables: amounts to a hundredth of a cent, costs per
// 1k tokens (often below a cent) to six places. CSV has all nine.
const (
	moneyDecimals = 4
	per1kDecimals = 6
)

// costConfig is the configuration of "cost".
type costConfig struct {
	selectorConfig
	// BusyPolicy and IdlePolicy are the allocation policies asked for.
	BusyPolicy, IdlePolicy string
}

// Validate reports every problem at once.
func (c costConfig) Validate() error {
	errs := c.selectorConfig.validate()
	if !slices.Contains(busyPolicies, c.BusyPolicy) {
		errs = append(errs, fmt.Errorf("--busy-policy %q: want %s", c.BusyPolicy, strings.Join(busyPolicies, ", ")))
	}
	if !slices.Contains(idlePolicies, c.IdlePolicy) {
		errs = append(errs, fmt.Errorf("--idle-policy %q: want %s", c.IdlePolicy, strings.Join(idlePolicies, ", ")))
	}
	return errors.Join(errs...)
}

func parseCost(args []string, getenv func(string) string, now time.Time, stderr io.Writer) (costConfig, error) {
	var c costConfig
	err := parseSelectorFlags(&c.selectorConfig, "cost",
		"Prints the GPU cost allocated per step and group from GET /v1/cost, with a\n"+
			"SUMMARY row per group over the whole range. COST is BUSY (GPU time the group\n"+
			"used, split by --busy-policy) plus IDLE (its share of idle GPU time, placed by\n"+
			"--idle-policy). COST/1K_OUT and COST/1K_TOK are COST per 1,000 output tokens\n"+
			"and per 1,000 input and output tokens, BUSY/1K_OUT is BUSY per 1,000 output\n"+
			"tokens. UNATTR_REQ counts requests served by deployments without GPU samples:\n"+
			"their cost is unknown and not in COST. COST/REQ is COST per request, GPU_SEC\n"+
			"the GPU-seconds allocated to the group (split as COST is). Cost is computed\n"+
			"per hour, so --start and --end lie on whole hours. With --step total the\n"+
			"SUMMARY rows are the only rows. A table ends with the rows' gross margin:\n"+
			"their tokens at list prices (list_charge) against their GPU cost.", costShape,
		func(fs *flag.FlagSet) {
			fs.StringVar(&c.BusyPolicy, "busy-policy", busyPolicies[0], "how busy GPU cost is split: "+orList(busyPolicies))
			fs.StringVar(&c.IdlePolicy, "idle-policy", idlePolicies[0], "where idle GPU cost goes: separate (tenant "+idleTenant+"), shared_weighted or shared_even")
		}, args, getenv, now, stderr)
	if err != nil {
		return c, err
	}
	return c, c.Validate()
}

// query is the request as REST query parameters.
func (c costConfig) query() url.Values {
	q := c.selectorConfig.query()
	q.Set("busy_policy", c.BusyPolicy)
	q.Set("idle_policy", c.IdlePolicy)
	return q
}

func runCost(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := parseCost(args, getenv, time.Now(), stderr)
	if err != nil {
		return err
	}
	if validatedOnly(stdout, cfg.ValidateOnly) {
		return nil
	}
	all := &meterv1.GetCostResponse{}
	err = fetchPages(ctx, newClient(cfg.connConfig, 1), "/v1/cost", cfg.query(), cfg.pageTokenParam(), func(p *meterv1.GetCostResponse) {
		all.Series = append(all.Series, p.GetSeries()...)
		all.BusyPolicy, all.IdlePolicy, all.Currency = p.GetBusyPolicy(), p.GetIdlePolicy(), p.GetCurrency()
		all.PriceVersions = mergeVersions(all.PriceVersions, p.GetPriceVersions())
	})
	if err != nil {
		return err
	}
	table, err := cfg.writeSeries(stdout, all, len(all.GetSeries()), func(f cellFormat) *grid { return costGrid(cfg.selectorConfig, all, f) })
	if err != nil {
		return err
	}
	footer, warning := costNotes(all)
	return writeNotes(stdout, stderr, table, footer, warning)
}

// costNotes returns the footer of a cost table, which names the policies,
// currency and price versions, and a warning of usage whose cost is
// unknown, that of deployments without GPU samples ("" when there is none).
func costNotes(all *meterv1.GetCostResponse) (footer, warning string) {
	idle := ""
	if all.GetIdlePolicy() == "separate" {
		idle = " (idle cost in tenant " + idleTenant + ")"
	}
	footer = fmt.Sprintf("Busy policy %s, idle policy %s%s. %s", all.GetBusyPolicy(), all.GetIdlePolicy(), idle,
		priceNote(all.GetCurrency(), all.GetPriceVersions()))
	var req, in, out uint64
	var cost, charge int64 // nanos
	priced := false
	for _, s := range all.GetSeries() {
		req += s.GetSummary().GetUnattributedRequests()
		in += s.GetSummary().GetUnattributedInputTokens()
		out += s.GetSummary().GetUnattributedOutputTokens()
		cost += s.GetSummary().GetCost().GetNanos()
		if c := s.GetSummary().GetListCharge(); c != nil {
			charge += c.GetNanos()
			priced = true
		}
	}
	// The gross margin of the rows: what their tokens are charged at list
	// prices against what their GPUs cost (idle included, where the idle
	// policy puts it in the rows).
	if priced && charge > 0 && cost > 0 {
		cur := all.GetCurrency()
		footer += fmt.Sprintf("\nList charge %s %.2f against GPU cost %s %.2f: gross margin %.1f%%.", cur, float64(charge)/1e9,
			cur, float64(cost)/1e9, 100*(float64(charge)-float64(cost))/float64(charge))
	}
	if req > 0 || in > 0 || out > 0 {
		warning = fmt.Sprintf("%d requests ran on deployments without GPU samples: their cost is not included (%d input and %d output tokens)", req, in, out)
	}
	return footer, warning
}

// writeNotes writes the footer of a table, then the warning if there is
// one: under the table, or to stderr where stdout holds CSV or JSON for
// programs.
func writeNotes(stdout, stderr io.Writer, table bool, footer, warning string) error {
	w := stderr
	if table {
		w = stdout
		if _, err := fmt.Fprintf(w, "\n%s\n", footer); err != nil {
			return err
		}
	}
	if warning == "" {
		return nil
	}
	_, err := fmt.Fprintf(w, "warning: %s\n", warning)
	return err
}

// mergeVersions returns the price versions of both lists, sorted, each once.
func mergeVersions(a, b []string) []string {
	out := slices.Concat(a, b)
	slices.Sort(out)
	return slices.Compact(out)
}

// priceNote says what the amounts are in and which prices they come from.
func priceNote(currency string, versions []string) string {
	v := "none"
	if len(versions) > 0 {
		v = strings.Join(versions, ", ")
	}
	return fmt.Sprintf("Amounts in %s; price versions: %s.", cmp.Or(currency, "?"), v)
}

// costGrid has a row per step and group and a summary row per group.
func costGrid(cfg selectorConfig, all *meterv1.GetCostResponse, f cellFormat) *grid {
	g := moneyGrid(cfg.GroupBy, f,
		column{head: "COST", csvHead: "cost", num: true},
		column{head: "BUSY", csvHead: "busy_cost", num: true},
		column{head: "IDLE", csvHead: "idle_cost", num: true},
		column{head: "REQUESTS", csvHead: "requests", num: true},
		column{head: "INPUT", csvHead: "input_tokens", num: true},
		column{head: "OUTPUT", csvHead: "output_tokens", num: true},
		column{head: "COST/1K_OUT", csvHead: "cost_per_1k_output_tokens", num: true},
		column{head: "COST/1K_TOK", csvHead: "cost_per_1k_tokens", num: true},
		column{head: "BUSY/1K_OUT", csvHead: "busy_cost_per_1k_output_tokens", num: true},
		column{head: "UNATTR_REQ", csvHead: "unattributed_requests", num: true},
		column{head: "COST/REQ", csvHead: "cost_per_request", num: true},
		column{head: "GPU_SEC", csvHead: "gpu_seconds", num: true})
	cur := all.GetCurrency()
	seriesRows(cfg, f, all.GetSeries(), func(group []string, start string, p *meterv1.CostPoint) {
		g.add(append(f.lead(group, start, p.GetCost(), cur),
			f.money(p.GetCost(), cur), f.money(p.GetBusyCost(), cur), f.money(p.GetIdleCost(), cur),
			f.count(p.GetRequests()), f.count(p.GetInputTokens()), f.count(p.GetOutputTokens()),
			f.decimal(cur, p.GetCostPer_1KOutputTokens(), per1kDecimals), f.decimal(cur, p.GetCostPer_1KTokens(), per1kDecimals),
			f.decimal(cur, p.GetBusyCostPer_1KOutputTokens(), per1kDecimals), f.count(p.GetUnattributedRequests()),
			f.decimal(cur, p.GetCostPerRequest(), per1kDecimals), cmp.Or(p.GetGpuSeconds(), f.missing()))...)
	})
	return g
}

// moneyGrid is a grid with the group-by columns, START, in CSV a currency
// column (tables write the currency in each amount), then cols.
func moneyGrid(groupBy []string, f cellFormat, cols ...column) *grid {
	lead := append(groupByColumns(groupBy), column{head: "START", csvHead: "start"})
	if f.csv {
		lead = append(lead, column{head: "CURRENCY", csvHead: "currency"})
	}
	return &grid{cols: append(lead, cols...)}
}

// lead is the first cells of a moneyGrid row: the group, START, and in
// CSV the currency of m (cur when m names none).
func (f cellFormat) lead(group []string, start string, m *meterv1.Money, cur string) []string {
	cells := append(slices.Clone(group), start)
	if f.csv {
		cells = append(cells, cmp.Or(m.GetCurrency(), cur))
	}
	return cells
}

// money is an amount of m's currency (cur when m names none): in tables
// the currency and the amount rounded to moneyDecimals, in CSV the exact
// amount. An amount the answer left out (the provider's cost, which a
// tenant key sees only where the operator opted in) is a missing value,
// not zero.
func (f cellFormat) money(m *meterv1.Money, cur string) string {
	if m == nil {
		return f.missing()
	}
	amount := m.GetAmount()
	if amount == "" {
		amount = nanosDecimal(m.GetNanos())
	}
	return f.decimal(cmp.Or(m.GetCurrency(), cur), amount, moneyDecimals)
}

// decimal is an amount of currency cur given as a decimal string: in tables
// the currency and the amount rounded to decimals places (half away from
// zero; an amount that is not zero never shows as zero), in CSV the string
// itself. An empty string (a cost per 1k of no tokens) is a missing value.
func (f cellFormat) decimal(cur, s string, decimals int) string {
	if s == "" {
		return f.missing()
	}
	if f.csv {
		return s
	}
	return cur + " " + roundDecimal(s, decimals)
}

// roundDecimal rounds the decimal string s to decimals places; a value
// that is not zero but rounds to zero is written as a bound, e.g.
// "<0.0001". What does not parse is returned as it is.
func roundDecimal(s string, decimals int) string {
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		return s
	}
	out := r.FloatString(decimals)
	if r.Sign() == 0 || strings.Trim(out, "-0.") != "" {
		return out
	}
	least := "1"
	if decimals > 0 {
		least = "0." + strings.Repeat("0", decimals-1) + "1"
	}
	if r.Sign() > 0 {
		return "<" + least
	}
	return ">-" + least
}

// nanosDecimal writes n units of 1e-9 as a decimal with nine places, as
// Money.amount holds them.
func nanosDecimal(n int64) string {
	sign, u := "", uint64(n)
	if n < 0 {
		sign, u = "-", -uint64(n)
	}
	return fmt.Sprintf("%s%d.%09d", sign, u/1e9, u%1e9)
}
