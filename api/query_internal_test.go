package api

import (
	"net/url"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// Query values must be UTF-8 (the gateway copies them into string fields,
// which gRPC refuses to marshal), and the query string must parse.
func TestNormalizeQueryRefusesBadBytes(t *testing.T) {
	route, err := newHTTPRoute(meterv1.HTTPRoute{Method: "GET", Path: "/v1/usage", FullMethod: meterv1.UsageService_GetUsage_FullMethodName})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		query string
		ok    bool
	}{
		{"start=2026-11-22T00:00:00Z&group_by=tenant_id", true},
		{"tenant_id=%E2%80%8B__idle__", true}, // valid UTF-8: the identifier rule answers
		{"tenant_id=Z%C3%BCrich+AG", true},
		{"a=%zz", false},
		{"group_by=m%80", false},
		{"tenant_id=acme%ff", false},
		{"t%ffenant_id=acme", false},
		{"tenant_id=" + "ac\xffme", false},
	} {
		u := &url.URL{Path: "/v1/usage", RawQuery: tt.query}
		err := route.normalizeQuery(u)
		if tt.ok != (err == nil) {
			t.Errorf("%s: got %v, want ok %v", tt.query, err, tt.ok)
		}
		if err != nil && status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: got %v, want INVALID_ARGUMENT", tt.query, err)
		}
	}
}
