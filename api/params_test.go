package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/api"
	"tokenmeter/billing/closing"
	"tokenmeter/ingest"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/ident"
	"tokenmeter/internal/testkit/billingtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
)

// readStack is every read service over billingtest's data, over loopback.
type readStack struct {
	*billStack
	conn *grpc.ClientConn
}

func startReadAPI(t *testing.T, store *chstore.Store, b api.Billing, cfg api.Config) *readStack {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cfg.GRPCAddr, cfg.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	reads := query.New(store, query.Config{})
	srv, err := api.New(ctx, cfg, &api.Services{Keys: testKeySet(t), Usage: reads, Rollups: reads, Cost: reads, Prices: store,
		Billing: b, Reports: reads, Engine: reads}, store.Ping, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { srv.Run(ctx); close(done) }()
	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(16<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		cancel()
		<-done
	})
	return &readStack{billStack: &billStack{srv: srv, client: meterv1.NewBillingServiceClient(conn)}, conn: conn}
}

// TestIdentifierParamLimits sends a tenant_id (and a deployment, and a
// close's tenant list) of 200 KB, and of one byte over the limit of an
// event's identifiers, to every route that takes one, over gRPC and REST:
// each answers InvalidArgument / 400 naming the limit (a 200 KB tenant_id
// answered 500: the SQL exceeded ClickHouse's max_query_size). An id of
// exactly the limit is taken.
func TestIdentifierParamLimits(t *testing.T) {
	if got := ingest.DefaultLimits().MaxStringLen; got != ident.MaxLen {
		t.Fatalf("ident.MaxLen %d, an event's identifier limit %d: they must agree", ident.MaxLen, got)
	}
	store, svc := newBillingData(t)
	s := startReadAPI(t, store, svc, api.Config{})
	fin, admin := withKey(testKeys["finance"]), withKey(testKeys["admin"])
	usageC, metricsC, costC := meterv1.NewUsageServiceClient(s.conn), meterv1.NewMetricsServiceClient(s.conn), meterv1.NewCostServiceClient(s.conn)
	reportC := meterv1.NewReportServiceClient(s.conn)
	start, end := timestamppb.New(billingHour), timestamppb.New(billingHour.Add(2*time.Hour))
	rng := "start=" + url.QueryEscape(billingHour.Format(time.RFC3339)) + "&end=" + url.QueryEscape(billingHour.Add(2*time.Hour).Format(time.RFC3339))

	type call struct {
		name       string
		grpc       func(id string) error
		rest       func(id string) (method, path, key, body string)
		acceptsMax bool // an id of exactly the limit gets an answer other than 400
	}
	q := url.QueryEscape
	calls := []call{
		{"usage", func(id string) error {
			_, err := usageC.GetUsage(fin, &meterv1.GetUsageRequest{TenantId: id, Start: start, End: end})
			return err
		}, func(id string) (string, string, string, string) {
			return "GET", "/v1/usage?tenant_id=" + q(id) + "&" + rng, "finance", ""
		}, true},
		{"latency", func(id string) error {
			_, err := metricsC.GetLatency(fin, &meterv1.GetLatencyRequest{Selector: &meterv1.SeriesSelector{TenantId: id, Start: start, End: end}})
			return err
		}, func(id string) (string, string, string, string) {
			return "GET", "/v1/latency?tenant_id=" + q(id) + "&" + rng, "finance", ""
		}, true},
		{"cost", func(id string) error {
			_, err := costC.GetCost(fin, &meterv1.GetCostRequest{TenantId: id, Start: start, End: end})
			return err
		}, func(id string) (string, string, string, string) {
			return "GET", "/v1/cost?tenant_id=" + q(id) + "&" + rng, "finance", ""
		}, true},
		{"billing periods", func(id string) error {
			_, err := s.client.ListBillingPeriods(fin, &meterv1.ListBillingPeriodsRequest{TenantId: id})
			return err
		}, func(id string) (string, string, string, string) {
			return "GET", "/v1/billing/periods?tenant_id=" + q(id), "finance", ""
		}, true},
		{"statement", func(id string) error {
			_, err := s.client.GetStatement(fin, &meterv1.GetStatementRequest{Period: billingtest.Period, TenantId: id})
			return err
		}, func(id string) (string, string, string, string) {
			return "GET", "/v1/billing/statements/" + billingtest.Period + "?tenant_id=" + q(id), "finance", ""
		}, true},
		{"statement export", func(id string) error {
			_, err := drain(s.client.ExportStatements(fin, &meterv1.ExportStatementsRequest{Period: billingtest.Period, TenantId: id, Format: "csv"}))
			return err
		}, func(id string) (string, string, string, string) {
			return "GET", statementsExportPath(billingtest.Period, id, "csv"), "finance", ""
		}, true},
		{"usage-cost export", func(id string) error {
			_, err := drain(s.client.ExportUsageCost(fin, &meterv1.ExportUsageCostRequest{Start: start, End: end, TenantId: id, Format: "csv"}))
			return err
		}, func(id string) (string, string, string, string) {
			return "GET", usageCostExportPath(id, "csv"), "finance", ""
		}, true},
		{"close", func(id string) error {
			_, err := s.client.CloseBillingPeriod(admin, &meterv1.CloseBillingPeriodRequest{Period: "2026-09", TenantIds: []string{"acme", id}, Grace: durationpb.New(0)})
			return err
		}, func(id string) (string, string, string, string) {
			b, _ := json.Marshal(map[string]any{"tenant_ids": []string{"acme", id}})
			return "POST", "/v1/billing/periods/2026-09:close", "admin", string(b)
		}, true},
		{"capacity report deployment", func(id string) error {
			_, err := reportC.GetCapacityReport(fin, &meterv1.GetCapacityReportRequest{Start: start, End: end, Deployment: id})
			return err
		}, func(id string) (string, string, string, string) {
			return "GET", "/v1/reports/capacity?deployment=" + q(id) + "&" + rng, "finance", ""
		}, true},
	}
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			for _, id := range []string{strings.Repeat("t", 200<<10), strings.Repeat("é", ident.MaxLen/2) + "x"} {
				err := c.grpc(id)
				if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), fmt.Sprintf("limit is %d", ident.MaxLen)) ||
					len(status.Convert(err).Message()) > 500 {
					t.Errorf("gRPC, %d-byte id: %s %.300q; want InvalidArgument naming the limit, briefly", len(id), status.Code(err), status.Convert(err).Message())
				}
				method, path, key, body := c.rest(id)
				r := s.get(t, method, path, testKeys[key], body)
				var e struct {
					Code    int    `json:"code"`
					Message string `json:"message"`
				}
				if r.code != 400 || json.Unmarshal(r.body, &e) != nil || !strings.Contains(e.Message, fmt.Sprintf("limit is %d", ident.MaxLen)) {
					t.Errorf("REST, %d-byte id: %d %.300s; want 400 naming the limit", len(id), r.code, r.body)
				}
			}
			// Exactly the limit: not refused for its length (a tenant
			// without usage: an empty answer, 404 or 409).
			if err := c.grpc(strings.Repeat("é", ident.MaxLen/2)); status.Code(err) == codes.InvalidArgument || status.Code(err) == codes.Internal {
				t.Errorf("gRPC, an id of %d bytes: %v", ident.MaxLen, err)
			}
		})
	}
}

// TestCloseTenantList: a close naming more than closing.MaxCloseTenants
// tenants (50,000 never answered) is refused at once with 400 naming the
// limit, over gRPC and REST; a list of the limit's length is taken (its
// unknown tenants are 404, after acme and globex are closed).
func TestCloseTenantList(t *testing.T) {
	store, svc := newBillingData(t)
	s := startReadAPI(t, store, svc, api.Config{})
	admin := withKey(testKeys["admin"])
	many := make([]string, 50_000)
	for i := range many {
		many[i] = fmt.Sprintf("tenant-%05d", i)
	}
	_, err := s.client.CloseBillingPeriod(admin, &meterv1.CloseBillingPeriodRequest{Period: billingtest.Period, TenantIds: many})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), fmt.Sprint(closing.MaxCloseTenants)) {
		t.Errorf("close of 50,000 tenants over gRPC: %v, want InvalidArgument naming %d", err, closing.MaxCloseTenants)
	}
	b, _ := json.Marshal(map[string]any{"tenant_ids": many[:closing.MaxCloseTenants+1]})
	if r := s.get(t, "POST", "/v1/billing/periods/"+billingtest.Period+":close", testKeys["admin"], string(b)); r.code != 400 ||
		!strings.Contains(string(r.body), fmt.Sprint(closing.MaxCloseTenants)) {
		t.Errorf("close of %d tenants over REST: %d %s, want 400 naming the limit", closing.MaxCloseTenants+1, r.code, r.body)
	}
	// The limit itself: acme and globex, then unknown tenants (404 at the
	// first; acme and globex, before it in name order, are closed).
	list := append([]string{"acme", "globex", "acme"}, many[:closing.MaxCloseTenants-3]...)
	_, err = s.client.CloseBillingPeriod(admin, &meterv1.CloseBillingPeriodRequest{Period: billingtest.Period, TenantIds: list})
	if status.Code(err) != codes.NotFound || !strings.Contains(status.Convert(err).Message(), "tenant-00000") {
		t.Errorf("close of %d tenants: %v, want NotFound naming tenant-00000", len(list), err)
	}
	resp, err := s.client.CloseBillingPeriod(admin, &meterv1.CloseBillingPeriodRequest{Period: billingtest.Period, TenantIds: []string{"globex", "acme", "globex"}})
	if err != nil || len(resp.GetPeriods()) != 2 {
		t.Errorf("close naming acme and globex (globex twice): %v, %v; want their two statements", resp, err)
	}
}

// TestRepriceOfUnclosedPeriod: a repricing of a period that was never
// closed is refused as such: FailedPrecondition / 409 saying it was never
// closed (it said "only the 12 periods before it can be repriced", which
// September is).
func TestRepriceOfUnclosedPeriod(t *testing.T) {
	store, svc := newBillingData(t)
	s := startReadAPI(t, store, svc, api.Config{})
	_, err := s.client.CloseBillingPeriod(withKey(testKeys["admin"]), &meterv1.CloseBillingPeriodRequest{Period: billingtest.Period, RepricePeriods: []string{"2026-09"}})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "2026-09 was never closed") {
		t.Errorf("gRPC: %v, want FailedPrecondition saying 2026-09 was never closed", err)
	}
	r := s.get(t, "POST", "/v1/billing/periods/"+billingtest.Period+":close", testKeys["admin"], `{"reprice_periods":["2026-09"]}`)
	if r.code != 409 || !strings.Contains(string(r.body), "2026-09 was never closed") {
		t.Errorf("REST: %d %s, want 409 saying 2026-09 was never closed", r.code, r.body)
	}
}

// TestTenantCostHidden: the provider's cost of serving a tenant is the
// operator's. A tenant key's /v1/cost carries its requests and tokens but
// no allocated cost (it read its own GPU cost, which its statements and
// exports hide); with api.Config.TenantCost (meterd --tenant-cost) the
// operator shows it: /v1/cost, the statement's finance part and the
// export's cost columns alike.
func TestTenantCostHidden(t *testing.T) {
	store, svc := newBillingData(t)
	closeReq := &meterv1.CloseBillingPeriodRequest{Period: billingtest.Period}
	for _, shown := range []bool{false, true} {
		t.Run(fmt.Sprintf("TenantCost=%v", shown), func(t *testing.T) {
			s := startReadAPI(t, store, svc, api.Config{TenantCost: shown})
			if _, err := s.client.CloseBillingPeriod(withKey(testKeys["admin"]), closeReq); err != nil {
				t.Fatal(err)
			}
			costC := meterv1.NewCostServiceClient(s.conn)
			req := &meterv1.GetCostRequest{Start: timestamppb.New(billingHour), End: timestamppb.New(billingHour.Add(2 * time.Hour)), GroupBy: []string{"tenant_id"}}
			all, err := costC.GetCost(withKey(testKeys["finance"]), req)
			if err != nil {
				t.Fatal(err)
			}
			var acme *meterv1.CostPoint
			for _, sr := range all.GetSeries() {
				if sr.GetGroup()["tenant_id"] == "acme" {
					acme = sr.GetSummary()
				}
			}
			if acme.GetCost().GetNanos() == 0 || acme.GetRequests() == 0 {
				t.Fatalf("finance's acme line has no cost: %v", acme)
			}
			viaGRPC, err := costC.GetCost(withKey(testKeys["tenant"]), &meterv1.GetCostRequest{Start: req.GetStart(), End: req.GetEnd()})
			if err != nil || len(viaGRPC.GetSeries()) != 1 {
				t.Fatalf("tenant's cost: %v %v", viaGRPC, err)
			}
			var viaREST meterv1.GetCostResponse
			r := s.get(t, "GET", "/v1/cost?start="+url.QueryEscape(billingHour.Format(time.RFC3339))+"&end="+url.QueryEscape(billingHour.Add(2*time.Hour).Format(time.RFC3339)), testKeys["tenant"], "")
			if r.code != 200 || protojson.Unmarshal(r.body, &viaREST) != nil || len(viaREST.GetSeries()) != 1 {
				t.Fatalf("tenant's cost over REST: %d %s", r.code, r.body)
			}
			for name, resp := range map[string]*meterv1.GetCostResponse{"gRPC": viaGRPC, "REST": &viaREST} {
				own := resp.GetSeries()[0].GetSummary()
				if own.GetRequests() != acme.GetRequests() || own.GetOutputTokens() != acme.GetOutputTokens() {
					t.Errorf("%s: the tenant's usage %d requests %d output tokens, finance sees %d, %d", name, own.GetRequests(), own.GetOutputTokens(), acme.GetRequests(), acme.GetOutputTokens())
				}
				costed := own.GetCost() != nil || own.GetBusyCost() != nil || own.GetIdleCost() != nil || own.GetCostPer_1KTokens() != ""
				if costed != shown {
					t.Errorf("%s: the tenant sees cost %v, busy %v, idle %v, per 1k %q; want shown=%v", name, own.GetCost(), own.GetBusyCost(), own.GetIdleCost(), own.GetCostPer_1KTokens(), shown)
				}
				if shown && own.GetCost().GetNanos() != acme.GetCost().GetNanos() {
					t.Errorf("%s: the tenant's cost %v, finance sees %v", name, own.GetCost(), acme.GetCost())
				}
				for _, p := range resp.GetSeries()[0].GetPoints() {
					if (p.GetCost() != nil) != shown {
						t.Errorf("%s: a point's cost %v, want shown=%v", name, p.GetCost(), shown)
					}
				}
			}
			st, err := s.client.GetStatement(withKey(testKeys["tenant"]), &meterv1.GetStatementRequest{Period: billingtest.Period})
			if err != nil {
				t.Fatal(err)
			}
			if (st.GetStatement().GetFinance() != nil) != shown {
				t.Errorf("the tenant's statement finance part %v, want shown=%v", st.GetStatement().GetFinance(), shown)
			}
			chunks, err := drain(s.client.ExportUsageCost(withKey(testKeys["tenant"]), &meterv1.ExportUsageCostRequest{
				Start: req.GetStart(), End: req.GetEnd(), Format: "csv"}))
			if err != nil {
				t.Fatal(err)
			}
			header, _, _ := strings.Cut(string(joined(chunks)), "\n")
			if strings.Contains(header, "allocated_cost") != shown {
				t.Errorf("the tenant's usage-cost export header %q, want allocated cost shown=%v", header, shown)
			}
		})
	}
}
