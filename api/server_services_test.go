package api

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestNewRefusesServicesWithoutPriceBooks: cost and the capacity report
// label amounts with the price book in force; New refuses either without
// a place to read it.
func TestNewRefusesServicesWithoutPriceBooks(t *testing.T) {
	for name, svc := range map[string]*Services{
		"Cost":    {Keys: &Keys{}, Usage: struct{ UsageReader }{}, Cost: struct{ CostReader }{}},
		"Reports": {Keys: &Keys{}, Usage: struct{ UsageReader }{}, Reports: struct{ ReportReader }{}},
	} {
		_, err := New(t.Context(), Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"}, svc,
			func(context.Context) error { return nil }, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err == nil || !strings.Contains(err.Error(), "Services."+name+" needs Services.Prices") {
			t.Errorf("%s without price books: %v", name, err)
		}
	}
}

// TestNewRegistersOfferedServices checks that New serves a service over
// gRPC and REST exactly when Services has its backend. The backends here
// are never called: nothing but routing is asked.
func TestNewRegistersOfferedServices(t *testing.T) {
	base := Services{Keys: &Keys{}, Publisher: struct{ Publisher }{}, Usage: struct{ UsageReader }{}}
	all := base
	all.Rollups, all.Cost, all.Prices, all.Admin = struct{ RollupReader }{}, struct{ CostReader }{}, struct{ PriceBookStore }{}, struct{ AdminStore }{}
	all.Billing, all.Reports = struct{ Billing }{}, struct{ ReportReader }{}
	tests := []struct {
		name     string
		svc      *Services
		grpc     []string
		restPath map[string]bool // path: whether it is routed
	}{
		{"none", nil, nil, map[string]bool{"/v1/usage": false}},
		{"ingest and usage", &base,
			[]string{"tokenmeter.v1.IngestService", "tokenmeter.v1.UsageService"},
			map[string]bool{"/v1/usage": true, "/v1/latency": false, "/v1/cost": false, "/v1/admin/slo": false,
				"/v1/billing/periods": false, "/v1/billing/usage-cost/export": false}},
		{"all", &all,
			[]string{"tokenmeter.v1.AdminService", "tokenmeter.v1.BillingService", "tokenmeter.v1.CostService", "tokenmeter.v1.IngestService", "tokenmeter.v1.MetricsService", "tokenmeter.v1.ReportService", "tokenmeter.v1.UsageService"},
			map[string]bool{"/v1/usage": true, "/v1/latency": true, "/v1/cost": true, "/v1/reports/capacity": true,
				"/v1/billing/periods": true, "/v1/billing/statements/2026-10/export": true, "/v1/billing/usage-cost/export": true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			logger := slog.New(slog.NewTextHandler(io.Discard, nil))
			s, err := New(ctx, Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"}, tt.svc,
				func(context.Context) error { return nil }, prometheus.NewRegistry(), logger)
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() { s.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()

			var got []string
			for name := range s.grpc.GetServiceInfo() {
				got = append(got, name)
			}
			slices.Sort(got)
			if !slices.Equal(got, tt.grpc) {
				t.Errorf("gRPC services: got %v, want %v", got, tt.grpc)
			}
			for path, routed := range tt.restPath {
				resp, err := http.Get("http://" + s.HTTPAddr() + path)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if got := resp.StatusCode != http.StatusNotFound; got != routed {
					t.Errorf("GET %s: status %d, want routed %v", path, resp.StatusCode, routed)
				}
			}
		})
	}
}

// TestNewRefusesCostWithoutPrices checks that a cost service without a
// price book to read is refused at start, rather than answering with the
// empty book's currency and policies.
func TestNewRefusesCostWithoutPrices(t *testing.T) {
	svc := &Services{Keys: &Keys{}, Cost: struct{ CostReader }{}}
	_, err := New(t.Context(), Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"}, svc,
		func(context.Context) error { return nil }, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil || !strings.Contains(err.Error(), "Services.Prices") {
		t.Errorf("New with Cost and no Prices: err = %v, want one naming Services.Prices", err)
	}
}
