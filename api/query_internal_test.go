package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestValidQuery(t *testing.T) {
	next := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })
	h := validQuery(next)
	for _, tt := range []struct {
		query string
		want  int
	}{
		{"start=2026-11-22T00:00:00Z&group_by=tenant_id", http.StatusTeapot},
		{"tenant_id=%E2%80%8B__idle__", http.StatusTeapot}, // valid UTF-8: the identifier rule answers
		{"tenant_id=Z%C3%BCrich+AG", http.StatusTeapot},
		{"a=%zz", http.StatusTeapot}, // does not parse: the gateway answers
		{"group_by=m%80", http.StatusBadRequest},
		{"tenant_id=acme%ff", http.StatusBadRequest},
		{"t%ffenant_id=acme", http.StatusBadRequest},
		{"tenant_id=" + "ac\xffme", http.StatusBadRequest},
	} {
		req := httptest.NewRequest(http.MethodGet, "/v1/usage", nil)
		req.URL.RawQuery = tt.query
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != tt.want {
			t.Errorf("%s: got %d, want %d", tt.query, rec.Code, tt.want)
			continue
		}
		if tt.want == http.StatusBadRequest {
			var body struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Code != 3 || body.Message == "" {
				t.Errorf("%s: got body %s (%v), want a JSON status with code 3", tt.query, rec.Body, err)
			}
		}
	}
}
