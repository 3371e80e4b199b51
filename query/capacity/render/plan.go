package render

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// planView is one deployment's plan in the HTML file.
type planView struct {
	Deployment, Load string
	Options          []optionView
	// Mix is the cheapest mix in one line, MixArithmetic its sum; MixNote
	// says why there is none.
	Mix, MixArithmetic, MixNote string
}

// optionView is one GPU type of a plan: "-" marks what the data does not
// support, NotEnoughData says why.
type optionView struct {
	GPUType, Sustainable, Price, CostPer1M, CostArithmetic string
	GPUs, CostPerHour, Arithmetic, NotEnoughData           string
}

// fleetPlanView is the sum of the deployments' mixes.
type fleetPlanView struct {
	Mix, CostPerHour, Missing string
}

// plans lays out the report's plans.
func plans(r *meterv1.CapacityReport) []planView {
	var out []planView
	for _, p := range r.GetPlans() {
		v := planView{Deployment: p.GetDeployment(), Load: p.GetLoadReason()}
		if p.GetLoadKnown() {
			v.Load = p.GetLoadFor() + ": " + grouped(p.GetLoadTokensPerSecond(), 1) + " tokens/s"
		}
		for _, o := range p.GetOptions() {
			ov := optionView{GPUType: o.GetGpuType(), Sustainable: "-", Price: "-", CostPer1M: "-", GPUs: "-", CostPerHour: "-",
				CostArithmetic: o.GetCostArithmetic(), Arithmetic: o.GetArithmetic(), NotEnoughData: o.GetNotEnoughData()}
			s := o.GetSustainable()
			bound := ""
			if s.GetLowerBound() {
				bound = "≥ "
			}
			if s.GetKnown() {
				ov.Sustainable = bound + grouped(s.GetTokensPerSecondPerGpu(), 1)
			}
			if o.GetPriced() {
				ov.Price = money(o.GetPricePerHour(), r.GetCurrency())
			}
			atMost := ""
			if s.GetLowerBound() {
				atMost = "≤ "
			}
			if o.GetCostKnown() {
				ov.CostPer1M = atMost + exact(o.GetCostPer_1MTokens(), r.GetCurrency())
			}
			if o.GetArithmetic() != "" {
				ov.GPUs = atMost + countInt(o.GetGpus())
				ov.CostPerHour = atMost + money(o.GetCostPerHour(), r.GetCurrency())
			}
			v.Options = append(v.Options, ov)
		}
		if p.GetMixKnown() {
			v.Mix = mixText(p.GetMix(), p.GetMixAtMost()) + ", " + money(p.GetMixCostPerHour(), r.GetCurrency()) + " per hour"
			v.MixArithmetic = p.GetMixArithmetic()
		} else {
			v.MixNote = p.GetMixReason()
		}
		out = append(out, v)
	}
	return out
}

// fleetPlan lays out the sum of the mixes; nil when no plan has one.
func fleetPlan(r *meterv1.CapacityReport) *fleetPlanView {
	f := r.GetFleetPlan()
	if f.GetDeployments() == 0 && len(f.GetMissing()) == 0 {
		return nil
	}
	v := &fleetPlanView{Mix: "none", CostPerHour: "-"}
	if f.GetDeployments() > 0 {
		v.Mix = mixText(f.GetParts(), f.GetAtMost()) + " for " + countInt(int64(f.GetDeployments())) + " deployment(s)"
		v.CostPerHour = money(f.GetCostPerHour(), r.GetCurrency()) + " per hour"
		if f.GetAtMost() {
			v.CostPerHour = "at most " + v.CostPerHour
		}
	}
	if m := f.GetMissing(); len(m) > 0 {
		v.Missing = countInt(int64(len(m))) + " deployment(s) without a mix (not enough data, see each): " + strings.Join(m, ", ")
	}
	return v
}

// mixText writes a mix as "3 × A100 + 5 × H100 = 8 GPUs".
func mixText(parts []*meterv1.CapacityMixPart, atMost bool) string {
	var terms []string
	var gpus int64
	for _, m := range parts {
		terms = append(terms, countInt(m.GetGpus())+" × "+m.GetGpuType())
		gpus += m.GetGpus()
	}
	if len(terms) == 0 {
		return "no GPU"
	}
	s := strings.Join(terms, " + ") + " = " + countInt(gpus) + " GPUs"
	if atMost {
		s = "at most " + s
	}
	return s
}

// exact is an amount to the nano-unit, trailing zeros trimmed to at least
// cents, with its currency: a cost per 1M tokens is often below a cent.
func exact(m *meterv1.Money, currency string) string {
	if m == nil {
		return "—"
	}
	a := m.GetAmount()
	if i := strings.IndexByte(a, '.'); i >= 0 {
		a = strings.TrimRight(a, "0")
		if len(a)-i-1 < 2 {
			a += strings.Repeat("0", 2-(len(a)-i-1))
		}
	}
	cur := m.GetCurrency()
	if cur == "" {
		cur = currency
	}
	return strings.TrimSpace(cur + " " + a)
}

// PlanText writes the report's fleet plan as text: for each deployment its
// load, a table of its GPU types (sustainable load, list price, cost per 1M
// tokens, GPUs and cost of the load on that type alone; "-" where the data
// does not support the figure, and why), its cheapest mix with the
// arithmetic, then the fleet's sum. Nothing when the report has no plan.
func PlanText(w io.Writer, r *meterv1.CapacityReport) error {
	ps := plans(r)
	if len(ps) == 0 {
		return nil
	}
	var b strings.Builder
	b.WriteString("\nFleet plan (each deployment's forecast peak on the GPU types it was measured on, at the price book's list prices):\n")
	for _, p := range ps {
		fmt.Fprintf(&b, "  %s: %s\n", p.Deployment, p.Load)
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "    GPU TYPE\tSUSTAINABLE TOK/S/GPU\tPRICE/GPU-HOUR\tCOST PER 1M TOKENS\tGPUS ALONE\tCOST/HOUR ALONE")
		var notes []string
		for _, o := range p.Options {
			fmt.Fprintf(tw, "    %s\t%s\t%s\t%s\t%s\t%s\n", o.GPUType, o.Sustainable, o.Price, o.CostPer1M, o.GPUs, o.CostPerHour)
			switch {
			case o.NotEnoughData != "":
				notes = append(notes, o.GPUType+": "+o.NotEnoughData)
			case o.CostArithmetic != "":
				notes = append(notes, o.GPUType+": "+o.CostArithmetic)
				if o.Arithmetic != "" {
					notes = append(notes, o.GPUType+": "+o.Arithmetic)
				}
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, n := range notes {
			fmt.Fprintf(&b, "      %s\n", n)
		}
		if p.Mix != "" {
			fmt.Fprintf(&b, "    cheapest mix: %s\n      %s\n", p.Mix, p.MixArithmetic)
		} else {
			fmt.Fprintf(&b, "    no mix: %s\n", p.MixNote)
		}
	}
	if f := fleetPlan(r); f != nil {
		if r.GetFleetPlan().GetDeployments() == 0 {
			b.WriteString("  fleet: no deployment has a mix\n")
		} else {
			fmt.Fprintf(&b, "  fleet: %s, %s\n", f.Mix, f.CostPerHour)
		}
		if f.Missing != "" {
			fmt.Fprintf(&b, "    %s\n", f.Missing)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
