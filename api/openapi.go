package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// OpenAPIPath is where the HTTP server serves the OpenAPI document of the
// REST API; it needs no key.
const OpenAPIPath = "/openapi.json"

// openAPIDocument is the OpenAPI document (meterv1.OpenAPI) of the gRPC
// services offered, given by full name ("tokenmeter.v1.UsageService"):
// the paths and tags of a service this server does not offer are left out,
// so that every path of the document is served. With every service
// offered it is the generated document byte for byte.
func openAPIDocument(offered map[string]bool) ([]byte, error) {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(meterv1.OpenAPI(), &doc); err != nil {
		return nil, fmt.Errorf("openapi: parse the generated document: %w", err)
	}
	var paths map[string]json.RawMessage
	if err := json.Unmarshal(doc["paths"], &paths); err != nil {
		return nil, fmt.Errorf("openapi: parse paths: %w", err)
	}
	// operationId is Service_Method (protoc-gen-openapiv2's default).
	serviceOf := func(operationID string) string {
		svc, _, _ := strings.Cut(operationID, "_")
		return "tokenmeter.v1." + svc
	}
	dropped := false
	for path, raw := range paths {
		var ops map[string]struct {
			OperationID string `json:"operationId"`
		}
		if err := json.Unmarshal(raw, &ops); err != nil {
			return nil, fmt.Errorf("openapi: parse path %s: %w", path, err)
		}
		for method, op := range ops {
			if op.OperationID == "" {
				return nil, fmt.Errorf("openapi: %s %s has no operationId", strings.ToUpper(method), path)
			}
			if !offered[serviceOf(op.OperationID)] {
				delete(paths, path)
				dropped = true
			}
		}
	}
	if !dropped {
		return meterv1.OpenAPI(), nil
	}
	var tags []struct {
		Name        string `json:"name"`
		Description string `json:"description,omitempty"`
	}
	if err := json.Unmarshal(doc["tags"], &tags); err != nil {
		return nil, fmt.Errorf("openapi: parse tags: %w", err)
	}
	kept := tags[:0]
	for _, tag := range tags {
		if offered["tokenmeter.v1."+tag.Name] {
			kept = append(kept, tag)
		}
	}
	var err error
	if doc["paths"], err = json.Marshal(paths); err != nil {
		return nil, err
	}
	if doc["tags"], err = json.Marshal(kept); err != nil {
		return nil, err
	}
	return json.MarshalIndent(doc, "", "  ")
}

// serveOpenAPI answers GET /openapi.json with doc. Any origin may read it
// (API tools in a browser import it from another origin); it holds no data.
func serveOpenAPI(doc []byte) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Access-Control-Allow-Origin", "*")
		h.Set("X-Content-Type-Options", "nosniff")
		w.Write(doc)
	})
}
