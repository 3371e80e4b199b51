package meterv1

import (
	_ "embed"
	"fmt"
	"net/http"
	"strings"

	"go.yaml.in/yaml/v3"
)

// apiYAML is the HTTP rule file the gateway code is generated from, so that
// the server's HTTP checks read the same routes the gateway serves.
//
//go:embed api.yaml
var apiYAML []byte

// HTTPRoute is one REST route of api.yaml.
type HTTPRoute struct {
	// Method is the HTTP method, e.g. "GET".
	Method string
	// Path is the path template, e.g. "/v1/usage".
	Path string
	// FullMethod is the gRPC method, e.g. "/tokenmeter.v1.UsageService/GetUsage".
	FullMethod string
	// Body is the request field the body fills: "*" for the whole request,
	// a field name, or "" for no body.
	Body string
}

// HTTPRoutes returns the REST routes of api.yaml, in file order.
func HTTPRoutes() ([]HTTPRoute, error) {
	var doc struct {
		HTTP struct {
			Rules []map[string]string `yaml:"rules"`
		} `yaml:"http"`
	}
	if err := yaml.Unmarshal(apiYAML, &doc); err != nil {
		return nil, fmt.Errorf("parse api.yaml: %w", err)
	}
	var out []HTTPRoute
	for i, rule := range doc.HTTP.Rules {
		sel := rule["selector"]
		dot := strings.LastIndexByte(sel, '.')
		if dot < 0 {
			return nil, fmt.Errorf("api.yaml rule %d: selector %q is not service.Method", i, sel)
		}
		r := HTTPRoute{FullMethod: "/" + sel[:dot] + "/" + sel[dot+1:], Body: rule["body"]}
		for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
			if p, ok := rule[strings.ToLower(m)]; ok {
				r.Method, r.Path = m, p
			}
		}
		if r.Method == "" {
			return nil, fmt.Errorf("api.yaml rule %d (%s): no HTTP method", i, sel)
		}
		out = append(out, r)
	}
	return out, nil
}
