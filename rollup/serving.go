package rollup

import (
	"slices"
	"strconv"
	"strings"
	"time"
)

// The serving labels of an hour: which engine and tensor parallelism served
// a deployment's model. Events carry them, rollup rows do not (they would
// split every rollup level's rows for labels that belong to the
// deployment, not the request); the cost step resolves them per hour,
// deployment and model instead, onto each cost line and into
// serving_hour, which usage reads join.

// ServingRow is one combination of serving labels that events of an hour's
// (deployment, model) carried (CostStore.ServingOfHours).
type ServingRow struct {
	Hour              time.Time
	Deployment, Model string
	Engine            string
	// TensorParallelism is the number of GPUs a replica spans; 0: not
	// reported.
	TensorParallelism uint32
}

// ServingHourRow is one row of serving_hour: the labels (ServingLabel) of
// an hour's (deployment, model).
type ServingHourRow struct {
	Hour                                         time.Time
	Deployment, Model, Engine, TensorParallelism string
}

// ServingLabel is the label of a set of values: the distinct non-empty
// ones, sorted and joined by "+" ("sglang+vllm" for a deployment whose
// engine changed within the hour), or "" when none is non-empty. An
// empty value (not reported) yields to a reported one: it is missing
// information, not another engine.
func ServingLabel(values []string) string {
	var vs []string
	for _, v := range values {
		if v != "" && !slices.Contains(vs, v) {
			vs = append(vs, v)
		}
	}
	slices.Sort(vs)
	return strings.Join(vs, "+")
}

// tpLabel is ServingLabel of tensor parallelisms, in numeric order, 0 (not
// reported) left out.
func tpLabel(tps []uint32) string {
	var ns []uint32
	for _, n := range tps {
		if n != 0 && !slices.Contains(ns, n) {
			ns = append(ns, n)
		}
	}
	slices.Sort(ns)
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = strconv.FormatUint(uint64(n), 10)
	}
	return strings.Join(out, "+")
}

// ServingLabels resolves the serving rows of one hour into the labels of
// each (deployment, model), sorted by deployment and model.
func ServingLabels(hour time.Time, rows []ServingRow) []ServingHourRow {
	hour = hour.UTC().Truncate(time.Hour)
	type key struct{ dep, model string }
	type vals struct {
		engines []string
		tps     []uint32
	}
	by := map[key]*vals{}
	var keys []key
	for _, r := range rows {
		k := key{r.Deployment, r.Model}
		v := by[k]
		if v == nil {
			v = &vals{}
			by[k] = v
			keys = append(keys, k)
		}
		v.engines = append(v.engines, r.Engine)
		v.tps = append(v.tps, r.TensorParallelism)
	}
	slices.SortFunc(keys, func(a, b key) int {
		if c := strings.Compare(a.dep, b.dep); c != 0 {
			return c
		}
		return strings.Compare(a.model, b.model)
	})
	out := make([]ServingHourRow, len(keys))
	for i, k := range keys {
		out[i] = ServingHourRow{Hour: hour, Deployment: k.dep, Model: k.model,
			Engine: ServingLabel(by[k].engines), TensorParallelism: tpLabel(by[k].tps)}
	}
	return out
}

// LabelCost sets the engine and tensor parallelism of an hour's cost lines
// from its serving rows: a line's (deployment, model)'s, and for a line
// without a model (the idle line) its deployment's, every model together
// (the idle GPUs ran what the deployment ran). A line whose deployment
// sent no labelled event in the hour keeps empty labels.
func LabelCost(rows []CostRow, serving []ServingRow) {
	type key struct{ dep, model string }
	engines, tps := map[key][]string{}, map[key][]uint32{}
	for _, s := range serving {
		for _, k := range []key{{s.Deployment, s.Model}, {s.Deployment, ""}} {
			engines[k] = append(engines[k], s.Engine)
			tps[k] = append(tps[k], s.TensorParallelism)
		}
	}
	for i := range rows {
		k := key{rows[i].Deployment, rows[i].Model}
		rows[i].Engine, rows[i].TensorParallelism = ServingLabel(engines[k]), tpLabel(tps[k])
	}
}
