// Package servingtest is the brute force of the serving dimensions
// (engine, tensor_parallelism, model_version) that GetUsage and GetCost
// label their lines with, for the exact tests of the query and api
// packages: per (hour, deployment) the usage of each (tenant, model) line
// and the engines, TPs and versions its events carried.
package servingtest

import (
	"slices"
	"strconv"
	"strings"

	"tokenmeter/billing"
	"tokenmeter/internal/ident"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// DepHour is an hour (an index the test chooses) of a deployment.
type DepHour struct {
	H   int
	Dep string
}

// Line is a (tenant, model) cost line of a deployment-hour; the idle line
// is Line{Tenant: billing.IdleTenant}.
type Line struct {
	Tenant, Model string
}

// Hours accumulates events per deployment-hour.
type Hours struct {
	// Usage is each line's billing usage: requests, prompt and output
	// tokens, E2E milliseconds.
	Usage map[DepHour]map[Line]*billing.TenantUsage
	// Versions are the model versions each line's events carried.
	Versions map[DepHour]map[Line][]string
	// Engines and TPs are the engines and (non-zero) tensor
	// parallelisms each model's events carried, every tenant's.
	Engines, TPs map[DepHour]map[string][]string
}

// NewHours returns empty Hours.
func NewHours() *Hours {
	return &Hours{Usage: map[DepHour]map[Line]*billing.TenantUsage{}, Versions: map[DepHour]map[Line][]string{},
		Engines: map[DepHour]map[string][]string{}, TPs: map[DepHour]map[string][]string{}}
}

// Add counts event e in hour h of its deployment.
func (s *Hours) Add(h int, e *meterv1.InferenceEvent) {
	k := DepHour{h, e.GetDeployment()}
	if s.Usage[k] == nil {
		s.Usage[k], s.Versions[k] = map[Line]*billing.TenantUsage{}, map[Line][]string{}
		s.Engines[k], s.TPs[k] = map[string][]string{}, map[string][]string{}
	}
	l := Line{e.GetTenantId(), e.GetModel()}
	u := s.Usage[k][l]
	if u == nil {
		u = &billing.TenantUsage{Tenant: ident.Key(l.Tenant, l.Model)}
		s.Usage[k][l] = u
	}
	u.Requests++
	u.InputTokens += e.GetPromptTokens()
	u.OutputTokens += e.GetOutputTokens()
	u.E2EMillis += int64(e.GetE2EMs())
	s.Versions[k][l] = append(s.Versions[k][l], e.GetModelVersion())
	s.Engines[k][l.Model] = append(s.Engines[k][l.Model], e.GetEngine())
	if tp := e.GetTensorParallelism(); tp > 0 {
		s.TPs[k][l.Model] = append(s.TPs[k][l.Model], strconv.Itoa(int(tp)))
	}
}

// Usages is the usage of k's lines, for billing.AllocateHour, and the line
// of each usage's tenant key (billing.IdleTenant's is the idle line).
func (s *Hours) Usages(k DepHour) ([]billing.TenantUsage, map[string]Line) {
	var us []billing.TenantUsage
	of := map[string]Line{billing.IdleTenant: {Tenant: billing.IdleTenant}}
	for l, u := range s.Usage[k] {
		us = append(us, *u)
		of[u.Tenant] = l
	}
	return us, of
}

// Labels are line l's tenant_id, model, deployment, engine,
// tensor_parallelism and model_version in deployment-hour k: the line's
// model's engines and TPs and its own versions; the idle line's engines
// and TPs are the deployment's (every model's) and it has no version.
func (s *Hours) Labels(k DepHour, l Line) map[string]string {
	if l.Tenant == billing.IdleTenant {
		var engines, tps []string
		for m := range s.Engines[k] {
			engines, tps = append(engines, s.Engines[k][m]...), append(tps, s.TPs[k][m]...)
		}
		return map[string]string{"tenant_id": l.Tenant, "model": "", "deployment": k.Dep,
			"engine": Label(engines), "tensor_parallelism": Label(tps), "model_version": ""}
	}
	return map[string]string{"tenant_id": l.Tenant, "model": l.Model, "deployment": k.Dep,
		"engine": Label(s.Engines[k][l.Model]), "tensor_parallelism": Label(s.TPs[k][l.Model]),
		"model_version": Label(s.Versions[k][l])}
}

// Label is the serving label of values vs: the distinct values other than
// "" and "0" (an unreported engine, version or TP), sorted (numbers in
// numeric order) and joined by "+".
func Label(vs []string) string {
	var out []string
	for _, v := range vs {
		if v != "" && v != "0" && !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	slices.SortFunc(out, func(a, b string) int {
		x, errX := strconv.Atoi(a)
		y, errY := strconv.Atoi(b)
		if errX == nil && errY == nil {
			return x - y
		}
		return strings.Compare(a, b)
	})
	return strings.Join(out, "+")
}
