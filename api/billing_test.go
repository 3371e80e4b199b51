package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
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
	"tokenmeter/billing"
	"tokenmeter/billing/closing"
	"tokenmeter/billing/export"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/testkit/billingtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
)

// billingHour is the first hour of the test's usage (billingtest.Hour).
var billingHour = billingtest.Hour

// newBillingData is billingtest.New: usage of acme and globex in October
// 2026, costed, and the billing service over it.
func newBillingData(t *testing.T) (*chstore.Store, *closing.Service) { return billingtest.New(t) }

type billStack struct {
	srv    *api.Server
	client meterv1.BillingServiceClient
}

// startBillingAPI serves b (and usage from store) over loopback with the
// test keys until the test ends.
func startBillingAPI(t *testing.T, store *chstore.Store, b api.Billing, cfg api.Config) *billStack {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cfg.GRPCAddr, cfg.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	reads := query.New(store, query.Config{})
	srv, err := api.New(ctx, cfg, &api.Services{Keys: testKeySet(t), Usage: reads, Billing: b}, store.Ping,
		prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { srv.Run(ctx); close(done) }()
	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		cancel()
		<-done
	})
	return &billStack{srv: srv, client: meterv1.NewBillingServiceClient(conn)}
}

// restResp is a REST answer.
type restResp struct {
	code            int
	header, trailer http.Header
	body            []byte
	err             error // reading the body
}

func (s *billStack) get(t *testing.T, method, path, key, body string) restResp {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+s.srv.HTTPAddr()+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return restResp{code: resp.StatusCode, header: resp.Header, trailer: resp.Trailer, body: b, err: err}
}

// chunk is what the tests read of an export message.
type chunk interface {
	GetData() []byte
	GetContentType() string
	GetFileName() string
}

// drain reads an export stream to its end: the messages and the status.
func drain[M any, P interface {
	*M
	chunk
}](stream grpc.ServerStreamingClient[M], err error) ([]chunk, error) {
	if err != nil {
		return nil, err
	}
	var out []chunk
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, P(m))
	}
}

func joined(chunks []chunk) []byte {
	var b []byte
	for _, c := range chunks {
		b = append(b, c.GetData()...)
	}
	return b
}

// closeOctober closes October for acme and globex as admin over REST.
func closeOctober(t *testing.T, s *billStack) *meterv1.CloseBillingPeriodResponse {
	t.Helper()
	r := s.get(t, "POST", "/v1/billing/periods/2026-10:close", testKeys["admin"], `{"tenant_ids":["acme","globex"]}`)
	var resp meterv1.CloseBillingPeriodResponse
	if r.code != 200 || protojson.Unmarshal(r.body, &resp) != nil {
		t.Fatalf("close 2026-10: %d %s", r.code, r.body)
	}
	return &resp
}

func statementsExportPath(period, tenant, format string) string {
	v := url.Values{"format": {format}}
	if tenant != "" {
		v.Set("tenant_id", tenant)
	}
	return "/v1/billing/statements/" + period + "/export?" + v.Encode()
}

func usageCostExportPath(tenant, format string) string {
	v := url.Values{"format": {format}, "start": {billingHour.Format(time.RFC3339)},
		"end": {billingHour.Add(2 * time.Hour).Format(time.RFC3339)}, "step": {"hour"}}
	if tenant != "" {
		v.Set("tenant_id", tenant)
	}
	return "/v1/billing/usage-cost/export?" + v.Encode()
}

// TestBillingRoleMatrix calls every billing method over gRPC and REST with
// every kind of key: a tenant key reads and exports its own tenant only,
// finance and admin every tenant, only admin closes, an ingest key nothing,
// and no key is 401.
func TestBillingRoleMatrix(t *testing.T) {
	store, svc := newBillingData(t)
	s := startBillingAPI(t, store, svc, api.Config{})
	closeOctober(t, s)
	start, end := timestamppb.New(billingHour), timestamppb.New(billingHour.Add(2*time.Hour))
	type call struct {
		name string
		rest func(key, tenant string) int
		grpc func(key, tenant string) codes.Code
	}
	calls := []call{
		{"periods",
			func(key, tenant string) int {
				return s.get(t, "GET", "/v1/billing/periods?tenant_id="+tenant, key, "").code
			},
			func(key, tenant string) codes.Code {
				_, err := s.client.ListBillingPeriods(withKey(key), &meterv1.ListBillingPeriodsRequest{TenantId: tenant})
				return status.Code(err)
			}},
		{"statement",
			func(key, tenant string) int {
				return s.get(t, "GET", "/v1/billing/statements/2026-10?tenant_id="+tenant, key, "").code
			},
			func(key, tenant string) codes.Code {
				_, err := s.client.GetStatement(withKey(key), &meterv1.GetStatementRequest{Period: "2026-10", TenantId: tenant})
				return status.Code(err)
			}},
		{"export statements",
			func(key, tenant string) int {
				return s.get(t, "GET", statementsExportPath("2026-10", tenant, "csv"), key, "").code
			},
			func(key, tenant string) codes.Code {
				_, err := drain(s.client.ExportStatements(withKey(key), &meterv1.ExportStatementsRequest{Period: "2026-10", TenantId: tenant, Format: "csv"}))
				return status.Code(err)
			}},
		{"export usage-cost",
			func(key, tenant string) int {
				return s.get(t, "GET", usageCostExportPath(tenant, "csv"), key, "").code
			},
			func(key, tenant string) codes.Code {
				_, err := drain(s.client.ExportUsageCost(withKey(key), &meterv1.ExportUsageCostRequest{Start: start, End: end, TenantId: tenant, Format: "csv"}))
				return status.Code(err)
			}},
		{"close",
			func(key, tenant string) int {
				return s.get(t, "POST", "/v1/billing/periods/2026-10:close", key, `{"tenant_ids":["`+tenant+`"],"grace":"0s"}`).code
			},
			func(key, tenant string) codes.Code {
				_, err := s.client.CloseBillingPeriod(withKey(key), &meterv1.CloseBillingPeriodRequest{Period: "2026-10", TenantIds: []string{tenant}, Grace: durationpb.New(0)})
				return status.Code(err)
			}},
	}
	const (
		ok     = codes.OK
		denied = codes.PermissionDenied
		unauth = codes.Unauthenticated
	)
	// want per key (and tenant asked): reads, then close.
	tests := []struct {
		who, key, tenant string
		read, close      codes.Code
	}{
		{"tenant own", testKeys["tenant"], "acme", ok, denied},
		{"tenant other", testKeys["tenant"], "globex", denied, denied},
		{"finance", testKeys["finance"], "globex", ok, denied},
		{"admin", testKeys["admin"], "globex", ok, ok},
		{"ingest", testKeys["ingest"], "acme", denied, denied},
		{"no key", "", "acme", unauth, unauth},
		{"unknown key", "wrong", "acme", unauth, unauth},
	}
	httpCode := map[codes.Code]int{codes.OK: 200, codes.Unauthenticated: 401, codes.PermissionDenied: 403}
	for _, tt := range tests {
		for _, c := range calls {
			want := tt.read
			if c.name == "close" {
				want = tt.close
			}
			t.Run(tt.who+"/"+c.name, func(t *testing.T) {
				if got := c.grpc(tt.key, tt.tenant); got != want {
					t.Errorf("gRPC: got %s, want %s", got, want)
				}
				if got := c.rest(tt.key, tt.tenant); got != httpCode[want] {
					t.Errorf("REST: got %d, want %d", got, httpCode[want])
				}
			})
		}
	}
}

// TestBillingFinanceColumns checks that a tenant key reads and exports its
// statement and usage without the finance-only parts, and finance with
// them, and that a tenant key's export without tenant_id is its own only.
func TestBillingFinanceColumns(t *testing.T) {
	store, svc := newBillingData(t)
	s := startBillingAPI(t, store, svc, api.Config{})
	closeOctober(t, s)

	header := func(body []byte) string { h, _, _ := strings.Cut(string(body), "\n"); return h }
	for _, tt := range []struct {
		who, key string
		finance  bool
	}{{"tenant", testKeys["tenant"], false}, {"finance", testKeys["finance"], true}, {"admin", testKeys["admin"], true}} {
		t.Run(tt.who, func(t *testing.T) {
			r := s.get(t, "GET", statementsExportPath("2026-10", "acme", "csv"), tt.key, "")
			if r.code != 200 {
				t.Fatalf("export statements: %d %s", r.code, r.body)
			}
			if got, want := header(r.body), strings.Join(export.StatementColumns(tt.finance), ","); got != want {
				t.Errorf("statements CSV header %q, want %q", got, want)
			}
			r = s.get(t, "GET", usageCostExportPath("acme", "csv"), tt.key, "")
			if r.code != 200 {
				t.Fatalf("export usage-cost: %d %s", r.code, r.body)
			}
			if got, want := header(r.body), strings.Join(export.UsageCostColumns(tt.finance), ","); got != want {
				t.Errorf("usage-cost CSV header %q, want %q", got, want)
			}
			r = s.get(t, "GET", statementsExportPath("2026-10", "acme", "jsonl"), tt.key, "")
			if got := bytes.Contains(r.body, []byte(`"allocated_cost"`)); got != tt.finance {
				t.Errorf("statements JSON lines hold allocated_cost: %v, want %v\n%s", got, tt.finance, r.body)
			}
			var st meterv1.GetStatementResponse
			r = s.get(t, "GET", "/v1/billing/statements/2026-10?tenant_id=acme", tt.key, "")
			if r.code != 200 || protojson.Unmarshal(r.body, &st) != nil {
				t.Fatalf("statement: %d %s", r.code, r.body)
			}
			fin := st.GetStatement().GetFinance()
			if (fin != nil) != tt.finance {
				t.Errorf("statement has a finance part: %v, want %v", fin != nil, tt.finance)
			}
			if tt.finance && (fin.GetAllocatedCost().GetNanos() <= 0 || st.GetStatement().GetLines()[0].GetFinance() == nil) {
				t.Errorf("finance part %v: want allocated cost, per line too", fin)
			}
			if !st.GetStatement().GetClosed() || st.GetStatement().GetHash() == "" || st.GetStatement().GetClosedAt() == nil {
				t.Errorf("closed statement without closed, hash or closed_at: %v", st.GetStatement())
			}
		})
	}
	// A tenant key without tenant_id exports its own statement only.
	r := s.get(t, "GET", statementsExportPath("2026-10", "", "csv"), testKeys["tenant"], "")
	if r.code != 200 || bytes.Contains(r.body, []byte("globex")) || !bytes.Contains(r.body, []byte("acme")) {
		t.Errorf("tenant's export of every statement: %d\n%s", r.code, r.body)
	}
	// The finance usage export has cost, and margin = list charge - cost.
	r = s.get(t, "GET", usageCostExportPath("", "jsonl"), testKeys["finance"], "")
	var sumCost int64
	for _, line := range bytes.Split(bytes.TrimSpace(r.body), []byte("\n")) {
		var row struct {
			ListCharge, AllocatedCost, Margin billing.Money
		}
		var raw map[string]json.RawMessage
		if err := json.Unmarshal(line, &raw); err != nil {
			t.Fatal(err)
		}
		for k, dst := range map[string]*billing.Money{"list_charge": &row.ListCharge, "allocated_cost": &row.AllocatedCost, "margin": &row.Margin} {
			if err := json.Unmarshal(raw[k], dst); err != nil {
				t.Fatalf("%s of %s: %v", k, line, err)
			}
		}
		if row.Margin != row.ListCharge-row.AllocatedCost {
			t.Errorf("row %s: margin is not list charge - allocated cost", line)
		}
		sumCost += int64(row.AllocatedCost)
	}
	if sumCost <= 0 {
		t.Errorf("finance usage export has no allocated cost:\n%s", r.body)
	}
}

// TestBillingBadInput checks that bad requests are clear 400s (gRPC
// InvalidArgument), unknown tenants 404 (NotFound), and requests that the
// period's state refuses 409 (FailedPrecondition), each naming the problem.
func TestBillingBadInput(t *testing.T) {
	store, svc := newBillingData(t)
	s := startBillingAPI(t, store, svc, api.Config{})
	closeOctober(t, s)
	fin, admin := testKeys["finance"], testKeys["admin"]
	ctx := withKey(fin)
	exportCode := func(period, format string) error {
		_, err := drain(s.client.ExportStatements(ctx, &meterv1.ExportStatementsRequest{Period: period, TenantId: "acme", Format: format}))
		return err
	}
	start, end := timestamppb.New(billingHour), timestamppb.New(billingHour.Add(2*time.Hour))
	tests := []struct {
		name      string
		method    string
		path, key string
		body      string
		grpc      func() error
		want      codes.Code
		mention   string
	}{
		{"unknown format", "GET", statementsExportPath("2026-10", "acme", "xml"), fin, "",
			func() error { return exportCode("2026-10", "xml") }, codes.InvalidArgument, "csv, jsonl, parquet"},
		{"month 13", "GET", "/v1/billing/statements/2026-13?tenant_id=acme", fin, "",
			func() error {
				_, err := s.client.GetStatement(ctx, &meterv1.GetStatementRequest{Period: "2026-13", TenantId: "acme"})
				return err
			}, codes.InvalidArgument, "2026-13"},
		{"month name", "GET", "/v1/billing/statements/nov?tenant_id=acme", fin, "",
			func() error {
				_, err := s.client.GetStatement(ctx, &meterv1.GetStatementRequest{Period: "nov", TenantId: "acme"})
				return err
			}, codes.InvalidArgument, "YYYY-MM"},
		{"export month 13", "GET", statementsExportPath("2026-13", "acme", "csv"), fin, "",
			func() error { return exportCode("2026-13", "csv") }, codes.InvalidArgument, "2026-13"},
		{"export month name", "GET", statementsExportPath("nov", "acme", "csv"), fin, "",
			func() error { return exportCode("nov", "csv") }, codes.InvalidArgument, "YYYY-MM"},
		{"close month name", "POST", "/v1/billing/periods/nov:close", admin, "",
			func() error {
				_, err := s.client.CloseBillingPeriod(withKey(admin), &meterv1.CloseBillingPeriodRequest{Period: "nov"})
				return err
			}, codes.InvalidArgument, "YYYY-MM"},
		{"unknown tenant statement", "GET", "/v1/billing/statements/2026-10?tenant_id=nobody", fin, "",
			func() error {
				_, err := s.client.GetStatement(ctx, &meterv1.GetStatementRequest{Period: "2026-10", TenantId: "nobody"})
				return err
			}, codes.NotFound, "nobody"},
		{"unknown tenant periods", "GET", "/v1/billing/periods?tenant_id=nobody", fin, "",
			func() error {
				_, err := s.client.ListBillingPeriods(ctx, &meterv1.ListBillingPeriodsRequest{TenantId: "nobody"})
				return err
			}, codes.NotFound, "nobody"},
		{"statement without tenant", "GET", "/v1/billing/statements/2026-10", fin, "",
			func() error {
				_, err := s.client.GetStatement(ctx, &meterv1.GetStatementRequest{Period: "2026-10"})
				return err
			}, codes.InvalidArgument, "tenant_id"},
		{"usage-cost off the hour", "GET", strings.Replace(usageCostExportPath("", "csv"), "T10%3A00", "T10%3A30", 1), fin, "",
			func() error {
				_, err := drain(s.client.ExportUsageCost(ctx, &meterv1.ExportUsageCostRequest{Start: timestamppb.New(billingHour.Add(30 * time.Minute)), End: end, Format: "csv"}))
				return err
			}, codes.InvalidArgument, "hour"},
		{"usage-cost by week", "GET", strings.Replace(usageCostExportPath("", "csv"), "step=hour", "step=week", 1), fin, "",
			func() error {
				_, err := drain(s.client.ExportUsageCost(ctx, &meterv1.ExportUsageCostRequest{Start: start, End: end, Step: "week", Format: "csv"}))
				return err
			}, codes.InvalidArgument, "week"},
		{"export of an open period", "GET", statementsExportPath("2026-11", "acme", "csv"), fin, "",
			func() error { return exportCode("2026-11", "csv") }, codes.FailedPrecondition, "not closed"},
		{"close of a period not over", "POST", "/v1/billing/periods/2026-11:close", admin, `{"tenant_ids":["acme"]}`,
			func() error {
				_, err := s.client.CloseBillingPeriod(withKey(admin), &meterv1.CloseBillingPeriodRequest{Period: "2026-11", TenantIds: []string{"acme"}})
				return err
			}, codes.FailedPrecondition, "may close"},
		{"repricing a later period", "POST", "/v1/billing/periods/2026-10:close", admin, `{"reprice_periods":["2026-11"]}`,
			func() error {
				_, err := s.client.CloseBillingPeriod(withKey(admin), &meterv1.CloseBillingPeriodRequest{Period: "2026-10", RepricePeriods: []string{"2026-11"}})
				return err
			}, codes.InvalidArgument, "only periods before"},
		{"negative grace", "POST", "/v1/billing/periods/2026-10:close", admin, `{"grace":"-5s"}`,
			func() error {
				_, err := s.client.CloseBillingPeriod(withKey(admin), &meterv1.CloseBillingPeriodRequest{Period: "2026-10", Grace: durationpb.New(-5 * time.Second)})
				return err
			}, codes.InvalidArgument, "negative"},
	}
	// A route with a path variable and the wrong method: 405 naming the right one.
	if r := s.get(t, "DELETE", "/v1/billing/statements/2026-10", fin, ""); r.code != 405 || r.header.Get("Allow") != "GET" {
		t.Errorf("DELETE a statement: %d, Allow %q; want 405, Allow GET", r.code, r.header.Get("Allow"))
	}
	if r := s.get(t, "GET", "/v1/billing/periods/2026-10:close", admin, ""); r.code != 405 || r.header.Get("Allow") != "POST" {
		t.Errorf("GET a close: %d, Allow %q; want 405, Allow POST", r.code, r.header.Get("Allow"))
	}
	httpCode := map[codes.Code]int{codes.InvalidArgument: 400, codes.NotFound: 404, codes.FailedPrecondition: 409}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.grpc()
			if got := status.Code(err); got != tt.want || !strings.Contains(status.Convert(err).Message(), tt.mention) {
				t.Errorf("gRPC: got %s %q, want %s mentioning %q", got, status.Convert(err).Message(), tt.want, tt.mention)
			}
			r := s.get(t, tt.method, tt.path, tt.key, tt.body)
			var e struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			if r.code != httpCode[tt.want] || json.Unmarshal(r.body, &e) != nil || codes.Code(e.Code) != tt.want || !strings.Contains(e.Message, tt.mention) {
				t.Errorf("REST: got %d %s, want %d mentioning %q", r.code, r.body, httpCode[tt.want], tt.mention)
			}
		})
	}
}

// TestBillingReexportIdentical closes October, then exports it twice in
// every format over REST and once over gRPC: the bytes are identical, the
// responses carry the format's Content-Type, a file name and (one tenant)
// the statement's hash; and the close, the periods and the statement all
// carry that hash.
func TestBillingReexportIdentical(t *testing.T) {
	store, svc := newBillingData(t)
	s := startBillingAPI(t, store, svc, api.Config{ExportChunkBytes: 512})
	closed := closeOctober(t, s)
	hashes := map[string]string{}
	for _, p := range closed.GetPeriods() {
		if !p.GetClosed() || p.GetHash() == "" || p.GetTotal().GetCurrency() != "USD" {
			t.Errorf("closed period %v: want closed, a hash and a USD total", p)
		}
		hashes[p.GetTenantId()] = p.GetHash()
	}
	if len(hashes) != 2 {
		t.Fatalf("close answered %v, want acme's and globex's", closed)
	}
	var periods meterv1.ListBillingPeriodsResponse
	r := s.get(t, "GET", "/v1/billing/periods", testKeys["tenant"], "")
	if r.code != 200 || protojson.Unmarshal(r.body, &periods) != nil || len(periods.GetPeriods()) < 2 {
		t.Fatalf("tenant's periods: %d %s", r.code, r.body)
	}
	if p := periods.GetPeriods()[0]; p.GetPeriod() != "2026-10" || !p.GetClosed() || p.GetHash() != hashes["acme"] {
		t.Errorf("first period %v, want 2026-10 closed with hash %s", p, hashes["acme"])
	}
	if p := periods.GetPeriods()[1]; p.GetPeriod() != "2026-11" || p.GetClosed() || p.GetHash() != "" {
		t.Errorf("second period %v, want 2026-11 open", p)
	}

	for _, f := range export.Formats() {
		for _, tenant := range []string{"acme", ""} {
			t.Run(fmt.Sprintf("%s/%q", f, tenant), func(t *testing.T) {
				path := statementsExportPath("2026-10", tenant, string(f))
				a := s.get(t, "GET", path, testKeys["finance"], "")
				b := s.get(t, "GET", path, testKeys["finance"], "")
				if a.code != 200 || a.err != nil || b.code != 200 || b.err != nil {
					t.Fatalf("export: %d %v %s; again %d %v", a.code, a.err, a.body, b.code, b.err)
				}
				if !bytes.Equal(a.body, b.body) || len(a.body) == 0 {
					t.Errorf("re-export differs (%d and %d bytes)", len(a.body), len(b.body))
				}
				if got := a.header.Get("Content-Type"); got != f.ContentType() {
					t.Errorf("Content-Type %q, want %q", got, f.ContentType())
				}
				_, params, err := mime.ParseMediaType(a.header.Get("Content-Disposition"))
				if err != nil || !strings.HasPrefix(params["filename"], "statements-2026-10") || !strings.HasSuffix(params["filename"], f.Extension()) {
					t.Errorf("Content-Disposition %q: want a statements-2026-10…%s file name", a.header.Get("Content-Disposition"), f.Extension())
				}
				if got := a.header.Get("X-Statement-Hash"); got != hashes[tenant] {
					t.Errorf("X-Statement-Hash %q, want %q", got, hashes[tenant])
				}
				chunks, err := drain(s.client.ExportStatements(withKey(testKeys["finance"]),
					&meterv1.ExportStatementsRequest{Period: "2026-10", TenantId: tenant, Format: string(f)}))
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(joined(chunks), a.body) {
					t.Errorf("gRPC export differs from REST's")
				}
				if f == export.Parquet || f == export.FocusParquet {
					if !bytes.HasPrefix(a.body, []byte("PAR1")) || !bytes.HasSuffix(a.body, []byte("PAR1")) {
						t.Errorf("not a Parquet file")
					}
				}
				if tenant != "" && chunks[0].(*meterv1.ExportStatementsResponse).GetStatementHash() != hashes[tenant] {
					t.Errorf("first chunk's statement hash %q, want %q", chunks[0].(*meterv1.ExportStatementsResponse).GetStatementHash(), hashes[tenant])
				}
			})
		}
	}
	// The statement read again carries the same hash.
	st, err := s.client.GetStatement(withKey(testKeys["tenant"]), &meterv1.GetStatementRequest{Period: "2026-10"})
	if err != nil || st.GetStatement().GetHash() != hashes["acme"] {
		t.Errorf("statement: %v, hash %q; want %q", err, st.GetStatement().GetHash(), hashes["acme"])
	}
}

// TestBillingExportStreams exports more than one chunk: the file comes in
// several messages, only the first names it, rows count up, and the
// concatenation is the REST body.
func TestBillingExportStreams(t *testing.T) {
	store, svc := newBillingData(t)
	s := startBillingAPI(t, store, svc, api.Config{ExportChunkBytes: 256})
	req := &meterv1.ExportUsageCostRequest{Start: timestamppb.New(billingHour), End: timestamppb.New(billingHour.Add(2 * time.Hour)), Format: "csv"}
	chunks, err := drain(s.client.ExportUsageCost(withKey(testKeys["finance"]), req))
	if err != nil {
		t.Fatal(err)
	}
	if len(chunks) < 3 {
		t.Fatalf("%d chunks, want several of 256 bytes", len(chunks))
	}
	var rows int64
	for i, c := range chunks {
		m := c.(*meterv1.ExportUsageCostResponse)
		if len(m.GetData()) > 256 || (i < len(chunks)-1 && len(m.GetData()) != 256) {
			t.Errorf("chunk %d holds %d bytes, want 256 (the last at most)", i, len(m.GetData()))
		}
		if (i == 0) != (m.GetContentType() != "") || (i == 0) != (m.GetFileName() != "") {
			t.Errorf("chunk %d: content type %q, file name %q; want them on the first chunk only", i, m.GetContentType(), m.GetFileName())
		}
		if m.GetRows() < rows {
			t.Errorf("chunk %d: rows %d after %d", i, m.GetRows(), rows)
		}
		rows = m.GetRows()
	}
	body := joined(chunks)
	if lines := int64(bytes.Count(body, []byte("\n"))); rows != lines-1 {
		t.Errorf("last chunk counts %d rows, the file has %d", rows, lines-1)
	}
	r := s.get(t, "GET", usageCostExportPath("", "csv"), testKeys["finance"], "")
	if r.code != 200 || !bytes.Equal(r.body, body) {
		t.Errorf("REST export (%d, %d bytes) differs from gRPC's (%d bytes)", r.code, len(r.body), len(body))
	}
	if got := r.header.Get("Content-Disposition"); !strings.Contains(got, "usage-cost-20261020T10Z-20261020T12Z-hour.csv") {
		t.Errorf("Content-Disposition %q", got)
	}
	if got := r.trailer.Get("X-Export-Rows"); got != fmt.Sprint(rows) {
		t.Errorf("trailer X-Export-Rows %q, want %d", got, rows)
	}
}

// failingBilling fails an export midway: it streams the real rows three
// times over, then returns a backend error.
type failingBilling struct {
	api.Billing
	delay time.Duration // before each row
	fail  bool
}

func (f *failingBilling) EachUsageCost(ctx context.Context, q closing.UsageCostQuery, fn func(*export.UsageCostRow) error) error {
	for range 3 {
		err := f.Billing.EachUsageCost(ctx, q, func(r *export.UsageCostRow) error {
			time.Sleep(f.delay)
			return fn(r)
		})
		if err != nil {
			return err
		}
	}
	if f.fail {
		return errors.New("clickhouse: connection reset by peer")
	}
	return nil
}

// TestBillingExportFailsMidway checks that an export that fails after its
// first chunk is not a file that looks whole: the REST response is cut off
// (the client reads an unexpected EOF) and the gRPC stream ends with an
// error, not with OK, and the backend's text is not shown.
func TestBillingExportFailsMidway(t *testing.T) {
	store, svc := newBillingData(t)
	s := startBillingAPI(t, store, &failingBilling{Billing: svc, fail: true}, api.Config{ExportChunkBytes: 256})
	chunks, err := drain(s.client.ExportUsageCost(withKey(testKeys["finance"]), &meterv1.ExportUsageCostRequest{
		Start: timestamppb.New(billingHour), End: timestamppb.New(billingHour.Add(2 * time.Hour)), Format: "csv"}))
	if len(chunks) == 0 || status.Code(err) != codes.Internal || strings.Contains(err.Error(), "clickhouse") {
		t.Errorf("gRPC: %d chunks, then %v; want some chunks, then Internal without the backend's text", len(chunks), err)
	}
	r := s.get(t, "GET", usageCostExportPath("", "csv"), testKeys["finance"], "")
	if r.code != 200 || len(r.body) == 0 || !errors.Is(r.err, io.ErrUnexpectedEOF) || r.trailer.Get("X-Export-Rows") != "" {
		t.Errorf("REST: %d, %d bytes, read error %v, rows trailer %q; want 200, some bytes, then an unexpected EOF and no trailer",
			r.code, len(r.body), r.err, r.trailer.Get("X-Export-Rows"))
	}
}

// TestBillingExportOutlivesTimeouts streams an export that takes longer
// than the server's read and write timeouts: it completes, because the
// write deadline is renewed per chunk.
func TestBillingExportOutlivesTimeouts(t *testing.T) {
	store, svc := newBillingData(t)
	s := startBillingAPI(t, store, &failingBilling{Billing: svc, delay: 40 * time.Millisecond},
		api.Config{ExportChunkBytes: 256, ReadTimeout: 300 * time.Millisecond, WriteTimeout: 300 * time.Millisecond})
	begin := time.Now()
	r := s.get(t, "GET", usageCostExportPath("", "csv"), testKeys["finance"], "")
	if r.code != 200 || r.err != nil {
		t.Fatalf("slow export: %d, %v", r.code, r.err)
	}
	if took := time.Since(begin); took < 600*time.Millisecond {
		t.Fatalf("export took %s, want longer than the timeouts (the test needs more rows)", took)
	}
	if lines := bytes.Count(r.body, []byte("\n")); lines < 10 {
		t.Errorf("export holds %d lines", lines)
	}
}
