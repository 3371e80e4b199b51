package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-openapi/loads"
	"github.com/go-openapi/spec"
	"github.com/go-openapi/strfmt"
	"github.com/go-openapi/validate"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/api"
	"tokenmeter/ingest"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/devenv"
	"tokenmeter/internal/testkit/billingtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
)

// loadOpenAPI loads the served document with go-openapi (the reference
// Swagger 2.0 implementation of go-swagger) and validates it against the
// Swagger 2.0 specification: its JSON schema and the semantic rules
// (unique operation ids, path parameters declared, references resolved).
func loadOpenAPI(t *testing.T, doc []byte) *loads.Document {
	t.Helper()
	d, err := loads.Analyzed(json.RawMessage(doc), "")
	if err != nil {
		t.Fatalf("load the OpenAPI document: %v", err)
	}
	if err := validate.Spec(d, strfmt.Default); err != nil {
		t.Fatalf("the OpenAPI document is not valid Swagger 2.0: %v", err)
	}
	return d
}

// TestOpenAPIDocument validates the generated document and checks what it
// must say: a description for every operation, parameter and field (from
// the proto comments), 64-bit integers as strings and timestamps as RFC
// 3339, and the error answers of every route.
func TestOpenAPIDocument(t *testing.T) {
	d := loadOpenAPI(t, meterv1.OpenAPI())
	sw := d.Spec()
	if sw.Info == nil || !strings.Contains(sw.Info.Description, "RFC 3339") || !strings.Contains(sw.Info.Description, "64-bit integers") {
		t.Error("the document's description does not state the JSON conventions (64-bit integers as strings, RFC 3339 timestamps)")
	}
	if _, ok := sw.SecurityDefinitions["ApiKey"]; !ok {
		t.Error("no ApiKey security definition")
	}
	bodyRoutes := 0
	for path, item := range sw.Paths.Paths {
		for method, op := range map[string]*spec.Operation{"GET": item.Get, "PUT": item.Put, "POST": item.Post, "DELETE": item.Delete, "PATCH": item.Patch} {
			if op == nil {
				continue
			}
			where := method + " " + path
			if op.Summary == "" && op.Description == "" {
				t.Errorf("%s: no description", where)
			}
			hasBody := false
			for _, p := range op.Parameters {
				if p.Description == "" && p.In != "body" {
					t.Errorf("%s: parameter %s has no description", where, p.Name)
				}
				hasBody = hasBody || p.In == "body"
			}
			want := []int{200, 400, 401, 403, 404, 500, 503}
			if hasBody {
				want = append(want, 413)
				bodyRoutes++
			}
			for _, code := range want {
				r, ok := op.Responses.StatusCodeResponses[code]
				if !ok || r.Description == "" {
					t.Errorf("%s: no described %d response", where, code)
					continue
				}
				if code != 200 && (r.Schema == nil || r.Schema.Ref.String() != "#/definitions/rpc.Status") {
					t.Errorf("%s: the %d response's schema is not the error object (rpc.Status)", where, code)
				}
			}
		}
	}
	if bodyRoutes != 6 {
		t.Errorf("%d routes take a body, want 6 (events, SLO set, price book, close, credit grant, void)", bodyRoutes)
	}

	// Every field of every message of the document: described, and typed
	// as protojson writes it (the proto descriptor says what it is).
	for name, def := range sw.Definitions {
		md := messageOf(name)
		// A request body without the path's fields is "<Method>Body".
		body := false
		if md == nil && strings.HasSuffix(name, "Body") {
			md, body = messageOf(strings.TrimSuffix(name, "Body")+"Request"), true
		}
		if md == nil {
			switch d, _ := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName("tokenmeter.v1." + strings.TrimPrefix(name, "v1."))); {
			case d != nil: // an enum of ours
				if _, ok := d.(protoreflect.EnumDescriptor); !ok || def.Description+def.Title == "" {
					t.Errorf("definition %s: not an enum with a description", name)
				}
			case name != "rpc.Status" && name != "Any" && name != "NullValue":
				t.Errorf("definition %s is no tokenmeter message", name)
			}
			continue // google.rpc.Status, Any, NullValue: described by their own protos
		}
		if !body && def.Description == "" && def.Title == "" {
			t.Errorf("definition %s: no description", name)
		}
		fields := md.Fields()
		for i := 0; i < fields.Len(); i++ {
			f := fields.Get(i)
			prop, ok := def.Properties[string(f.Name())]
			if !ok {
				if !body {
					t.Errorf("%s: field %s is not in the document", name, f.Name())
				}
				continue
			}
			// The proto comments are sentences: one that does not end as
			// a sentence was cut (protoc-gen-openapiv2 drops what follows
			// "(--", for one).
			if text := strings.TrimSpace(prop.Description + prop.Title); !strings.HasSuffix(text, ".") && !strings.HasSuffix(text, ")") {
				t.Errorf("%s.%s: description %q missing or cut short", name, f.Name(), text)
			}
			if f.IsList() {
				if prop.Items == nil || prop.Items.Schema == nil {
					t.Errorf("%s.%s: a list without items", name, f.Name())
					continue
				}
				prop = *prop.Items.Schema
			}
			switch {
			case f.IsMap():
			case f.Kind() == protoreflect.Int64Kind || f.Kind() == protoreflect.Uint64Kind || f.Kind() == protoreflect.Sint64Kind ||
				f.Kind() == protoreflect.Fixed64Kind || f.Kind() == protoreflect.Sfixed64Kind:
				if !prop.Type.Contains("string") || !strings.HasSuffix(prop.Format, "int64") {
					t.Errorf("%s.%s: a 64-bit integer documented as %v/%s, want a string (int64/uint64 format)", name, f.Name(), prop.Type, prop.Format)
				}
			case f.Message() != nil && f.Message().FullName() == "google.protobuf.Timestamp":
				if !prop.Type.Contains("string") || prop.Format != "date-time" {
					t.Errorf("%s.%s: a timestamp documented as %v/%s, want an RFC 3339 string (date-time)", name, f.Name(), prop.Type, prop.Format)
				}
			}
		}
	}
}

// messageOf finds the tokenmeter message of a definition name (the
// "simple" naming strategy: the message name, nested ones dotted).
func messageOf(name string) protoreflect.MessageDescriptor {
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName("tokenmeter.v1." + name))
	if err != nil {
		return nil
	}
	md, _ := d.(protoreflect.MessageDescriptor)
	return md
}

// TestOpenAPIServedAndResponsesValidate runs a server with every service
// over real data (Kafka, ClickHouse, rollups, a closed period): the
// document is served at /openapi.json without a key; a request to every
// path of it is served (not a routing 404); and a real answer of every
// operation, and an error answer, validates against the document, JSON
// against its schema (with additionalProperties false: a field the
// document lacks fails) and files against its produces list.
func TestOpenAPIServedAndResponsesValidate(t *testing.T) {
	srv := startFullAPI(t)
	base := "http://" + srv.HTTPAddr()

	resp, err := http.Get(base + api.OpenAPIPath)
	if err != nil {
		t.Fatal(err)
	}
	served, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET %s: %d %s", api.OpenAPIPath, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	d := loadOpenAPI(t, served)
	expanded, err := d.Expanded()
	if err != nil {
		t.Fatal(err)
	}
	sw := expanded.Spec()
	strict(sw)

	hour := billingtest.Hour.Format(time.RFC3339)
	end := billingtest.Hour.Add(2 * time.Hour).Format(time.RFC3339)
	window := "start=" + hour + "&end=" + end
	event, _ := json.Marshal(map[string]any{"events": []any{map[string]any{
		"event_id": "openapi-1", "tenant_id": "acme", "model": "m", "deployment": "d",
		"completed_at": billingtest.Hour.Add(5 * time.Minute).Format(time.RFC3339), "prompt_tokens": "10", "output_tokens": "5",
		"ttft_ms": 12.5, "e2e_ms": 40}}})
	type call struct {
		method, path, query, key, body string
		contentType                    string // a file answer; "" for JSON
	}
	// One real call per operation; the test fails for an operation of the
	// document without one here.
	calls := map[string][]call{
		"IngestService_PublishEvents":       {{method: "POST", path: "/v1/events", key: "ingest", body: string(event)}},
		"UsageService_GetUsage":             {{method: "GET", path: "/v1/usage", query: window + "&granularity=hour&group_by=tenant_id,model", key: "finance"}},
		"MetricsService_GetLatency":         {{method: "GET", path: "/v1/latency", query: "selector.start=" + hour + "&selector.end=" + end + "&selector.step=hour&selector.group_by=model", key: "finance"}},
		"MetricsService_GetGoodput":         {{method: "GET", path: "/v1/goodput", query: "selector.start=" + hour + "&selector.end=" + end + "&selector.step=hour", key: "tenant"}},
		"MetricsService_GetTraffic":         {{method: "GET", path: "/v1/traffic", query: "selector.start=" + hour + "&selector.end=" + end + "&selector.step=hour", key: "finance"}},
		"CostService_GetCost":               {{method: "GET", path: "/v1/cost", query: window + "&step=hour&group_by=tenant_id", key: "finance"}},
		"CostService_GetGpuUsage":           {{method: "GET", path: "/v1/gpu-usage", query: window + "&step=hour&group_by=gpu_type", key: "finance"}},
		"AdminService_GetSloSet":            {{method: "GET", path: "/v1/admin/slo-set", key: "admin"}},
		"AdminService_PutSloSet":            {{method: "PUT", path: "/v1/admin/slo-set", key: "admin", body: `{"rules":[{"slo_class":"interactive","ttft_ms":300}]}`}},
		"AdminService_GetPriceBook":         {{method: "GET", path: "/v1/admin/price-book", key: "finance"}},
		"AdminService_PutPriceBook":         {{method: "PUT", path: "/v1/admin/price-book", key: "admin", body: billingtest.Book}},
		"BillingService_ListBillingPeriods": {{method: "GET", path: "/v1/billing/periods", query: "tenant_id=acme", key: "finance"}},
		"BillingService_CloseBillingPeriod": {{method: "POST", path: "/v1/billing/periods/" + billingtest.Period + ":close", key: "admin", body: `{"tenant_ids":["acme","globex"]}`}},
		"BillingService_GetStatement":       {{method: "GET", path: "/v1/billing/statements/" + billingtest.Period, query: "tenant_id=acme", key: "tenant"}},
		"BillingService_ExportStatements": {
			{method: "GET", path: "/v1/billing/statements/" + billingtest.Period + "/export", query: "format=csv", key: "finance", contentType: "text/csv"},
			{method: "GET", path: "/v1/billing/statements/" + billingtest.Period + "/export", query: "format=parquet&tenant_id=acme", key: "finance", contentType: "application/vnd.apache.parquet"},
		},
		"BillingService_ExportUsageCost": {{method: "GET", path: "/v1/billing/usage-cost/export", query: window + "&tenant_id=acme&format=jsonl", key: "tenant", contentType: "application/x-ndjson"}},
		"ReportService_GetCapacityReport": {
			{method: "GET", path: "/v1/reports/capacity", query: window, key: "finance"},
			{method: "GET", path: "/v1/reports/capacity", query: window + "&format=csv", key: "finance", contentType: "text/csv"},
			{method: "GET", path: "/v1/reports/capacity", query: window + "&format=html", key: "finance", contentType: "text/html"},
		},
		"EngineService_GetEngineStats": {{method: "GET", path: "/v1/engine-stats", query: window + "&step=hour&group_by=deployment", key: "admin"}},
		"CreditService_CreateCreditGrant": {{method: "POST", path: "/v1/billing/credits/grants", key: "admin",
			body: `{"grant_id":"openapi-1","tenant_id":"acme","kind":"prepaid","amount":"0.0001","effective_from":"2026-01-01T00:00:00Z","expires_at":"2027-01-01T00:00:00Z"}`}},
		"CreditService_GetCreditBalance": {{method: "GET", path: "/v1/billing/credits/balance", key: "tenant"}},
		"CreditService_ListCreditLedger": {{method: "GET", path: "/v1/billing/credits/ledger", query: "tenant_id=acme", key: "finance"}},
		"InvoiceService_GetInvoice": {
			{method: "GET", path: "/v1/billing/statements/" + billingtest.Period + "/invoice", query: "tenant_id=acme&format=json", key: "finance"},
			{method: "GET", path: "/v1/billing/statements/" + billingtest.Period + "/invoice", key: "tenant", contentType: "text/html"},
		},
		"InvoiceService_ListInvoices":           {{method: "GET", path: "/v1/billing/statements/" + billingtest.Period + "/invoices", query: "tenant_id=acme", key: "tenant"}},
		"InvoiceService_ListStatementRevisions": {{method: "GET", path: "/v1/billing/statements/" + billingtest.Period + "/revisions", query: "tenant_id=acme", key: "finance"}},
		// {statement_hash} is the hash of acme's statement in force.
		"InvoiceService_VoidStatement": {{method: "POST", path: "/v1/billing/statements/" + billingtest.Period + ":void", key: "admin",
			body: `{"tenant_id":"acme","statement_hash":"{statement_hash}","reason":"openapi"}`}},
	}

	do := func(c call, key string) (*http.Response, []byte) {
		t.Helper()
		path := c.path
		if c.query != "" {
			q, err := url.ParseQuery(c.query)
			if err != nil {
				t.Fatal(err)
			}
			path += "?" + q.Encode()
		}
		body := c.body
		if strings.Contains(body, "{statement_hash}") {
			_, st := restCall(t, srv, "GET", "/v1/billing/statements/"+billingtest.Period+"?tenant_id=acme", testKeys["finance"], "")
			var resp meterv1.GetStatementResponse
			if err := protojson.Unmarshal(st, &resp); err != nil {
				t.Fatalf("statement: %v: %s", err, st)
			}
			body = strings.ReplaceAll(body, "{statement_hash}", resp.GetStatement().GetHash())
		}
		return restCall(t, srv, c.method, path, key, body)
	}

	checked := 0
	for path, item := range sw.Paths.Paths {
		for method, op := range map[string]*spec.Operation{"GET": item.Get, "PUT": item.Put, "POST": item.Post, "DELETE": item.Delete, "PATCH": item.Patch} {
			if op == nil {
				continue
			}
			cs, ok := calls[op.ID]
			if !ok {
				t.Errorf("%s %s (%s): no call in this test; add one", method, path, op.ID)
				continue
			}
			for _, c := range cs {
				if c.method != method || !pathFits(path, c.path) {
					t.Fatalf("%s: call %s %s is not %s %s", op.ID, c.method, c.path, method, path)
				}
			}
			checked++
		}
	}
	if checked != len(calls) {
		t.Errorf("the document has %d operations, this test calls %d", checked, len(calls))
	}

	// In an order where each call finds what it needs: publish, admin
	// documents, reads, then close the period and export it.
	order := []string{"IngestService_PublishEvents", "AdminService_PutSloSet", "AdminService_GetSloSet", "AdminService_PutPriceBook",
		"AdminService_GetPriceBook", "UsageService_GetUsage", "MetricsService_GetLatency", "MetricsService_GetGoodput",
		"MetricsService_GetTraffic", "CostService_GetCost", "CostService_GetGpuUsage", "EngineService_GetEngineStats",
		"ReportService_GetCapacityReport", "BillingService_ListBillingPeriods", "CreditService_CreateCreditGrant", "BillingService_CloseBillingPeriod",
		"BillingService_GetStatement", "BillingService_ExportStatements", "BillingService_ExportUsageCost",
		"CreditService_GetCreditBalance", "CreditService_ListCreditLedger", "InvoiceService_GetInvoice", "InvoiceService_ListInvoices",
		"InvoiceService_ListStatementRevisions", "InvoiceService_VoidStatement"}
	if len(order) != len(calls) {
		t.Fatalf("order lists %d operations, calls %d", len(order), len(calls))
	}
	for _, id := range order {
		for _, c := range calls[id] {
			op, _ := operation(sw, c.method, c.path)
			where := fmt.Sprintf("%s (%s %s?%s)", id, c.method, c.path, c.query)
			resp, body := do(c, testKeys[c.key])
			if resp.StatusCode != 200 {
				t.Errorf("%s: %d %.300s", where, resp.StatusCode, body)
				continue
			}
			ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
			produces := op.Produces
			if len(produces) == 0 {
				produces = sw.Produces
			}
			if !slices.Contains(produces, ct) {
				t.Errorf("%s: Content-Type %s is not among the operation's produces %v", where, ct, produces)
			}
			if c.contentType != "" {
				if ct != c.contentType || len(body) == 0 {
					t.Errorf("%s: a %d-byte %s file, want %s", where, len(body), ct, c.contentType)
				}
				continue
			}
			validateJSON(t, where+" 200", op.Responses.StatusCodeResponses[200].Schema, body)
			if strings.Contains(string(body), `":null`) {
				t.Errorf("%s: the answer has a null, which the document does not allow: %.300s", where, body)
			}

			// The same route without a key: 401, with the error object.
			resp, body = do(c, "")
			if resp.StatusCode != 401 {
				t.Errorf("%s without a key: %d, want 401", where, resp.StatusCode)
				continue
			}
			validateJSON(t, where+" 401", op.Responses.StatusCodeResponses[401].Schema, body)
		}
	}

	// Required parameters: each query parameter of a read call, left out,
	// gets 400 exactly when the document marks it required. tenant_id is
	// required of some roles only, which its description says.
	for _, id := range order {
		for _, c := range calls[id] {
			if c.method != "GET" || c.query == "" {
				continue
			}
			op, _ := operation(sw, c.method, c.path)
			required := map[string]bool{}
			for _, p := range op.Parameters {
				if p.In == "query" {
					required[p.Name] = p.Required
				}
			}
			q, _ := url.ParseQuery(c.query)
			for name := range q {
				req, ok := required[name]
				if !ok {
					t.Errorf("%s: the call's parameter %s is not in the document (use the canonical names here)", id, name)
					continue
				}
				if name == "tenant_id" {
					continue
				}
				without := url.Values{}
				for k, v := range q {
					if k != name {
						without[k] = v
					}
				}
				short := c
				short.query = without.Encode()
				resp, body := do(short, testKeys[c.key])
				if got := resp.StatusCode == 400; got != req {
					t.Errorf("%s without %s: %d (%.150s); the document says required=%v", id, name, resp.StatusCode, body, req)
				}
			}
		}
	}

	// A wrong value and a wrong role: 400 and 403, answered with the error
	// object the document gives.
	for _, c := range []struct {
		call
		code int
	}{
		{call{method: "GET", path: "/v1/usage", query: "start=yesterday", key: "finance"}, 400},
		{call{method: "GET", path: "/v1/engine-stats", query: window, key: "tenant"}, 403},
		{call{method: "GET", path: "/v1/billing/statements/1999-01", query: "tenant_id=nobody", key: "finance"}, 404},
	} {
		resp, body := do(c.call, testKeys[c.key])
		if resp.StatusCode != c.code {
			t.Errorf("%s %s?%s: %d, want %d: %.200s", c.method, c.path, c.query, resp.StatusCode, c.code, body)
			continue
		}
		op, _ := operation(sw, c.method, c.path)
		validateJSON(t, fmt.Sprintf("%s %s %d", c.method, c.path, c.code), op.Responses.StatusCodeResponses[c.code].Schema, body)
	}

	// A path the document does not have is a routing 404; the probe above
	// would have told a path of the document the server lacks.
	if resp, _ := do(call{method: "GET", path: "/v1/no-such-route"}, testKeys["admin"]); resp.StatusCode != 404 {
		t.Errorf("an unknown route: %d, want 404", resp.StatusCode)
	}
}

// operation finds the document's operation serving method and a concrete
// path.
func operation(sw *spec.Swagger, method, path string) (*spec.Operation, string) {
	for template, item := range sw.Paths.Paths {
		if !pathFits(template, path) {
			continue
		}
		if op := map[string]*spec.Operation{"GET": item.Get, "PUT": item.Put, "POST": item.Post}[method]; op != nil {
			return op, template
		}
	}
	panic(fmt.Sprintf("no operation for %s %s", method, path))
}

// pathFits tells whether a concrete path fits a document path template
// ("{period}" takes one segment, with a ":verb" after it if the template
// has one).
func pathFits(template, path string) bool {
	ts, ps := strings.Split(template, "/"), strings.Split(path, "/")
	if len(ts) != len(ps) {
		return false
	}
	for i, seg := range ts {
		if j := strings.IndexByte(seg, '}'); strings.HasPrefix(seg, "{") && j > 0 {
			if verb := seg[j+1:]; !strings.HasSuffix(ps[i], verb) || len(ps[i]) == len(verb) {
				return false
			}
			continue
		}
		if seg != ps[i] {
			return false
		}
	}
	return true
}

// strict forbids, in every object schema of the document with declared
// properties, properties it does not declare: an answer with a field the
// document lacks then fails validation.
func strict(sw *spec.Swagger) {
	seen := map[*spec.Schema]bool{}
	var walk func(s *spec.Schema)
	walk = func(s *spec.Schema) {
		if s == nil || seen[s] {
			return
		}
		seen[s] = true
		if len(s.Properties) > 0 && s.AdditionalProperties == nil {
			s.AdditionalProperties = &spec.SchemaOrBool{Allows: false}
		}
		for k := range s.Properties {
			p := s.Properties[k]
			walk(&p)
			s.Properties[k] = p
		}
		if s.Items != nil {
			walk(s.Items.Schema)
		}
		if s.AdditionalProperties != nil {
			walk(s.AdditionalProperties.Schema)
		}
	}
	for _, item := range sw.Paths.Paths {
		for _, op := range []*spec.Operation{item.Get, item.Put, item.Post} {
			if op == nil {
				continue
			}
			for code, r := range op.Responses.StatusCodeResponses {
				walk(r.Schema)
				op.Responses.StatusCodeResponses[code] = r
			}
		}
	}
}

// validateJSON validates a JSON answer against a schema of the document.
func validateJSON(t *testing.T, where string, schema *spec.Schema, body []byte) {
	t.Helper()
	if schema == nil {
		t.Errorf("%s: the document gives no schema", where)
		return
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		t.Errorf("%s: not JSON: %v: %.200s", where, err, body)
		return
	}
	if err := validate.AgainstSchema(schema, v, strfmt.Default); err != nil {
		t.Errorf("%s: the answer does not validate against the document: %v\n%.500s", where, err, body)
	}
}

// startFullAPI serves every service over billingtest's data (events, GPU
// samples, a price book, rolled up) plus engine samples, with a Kafka
// broker behind ingest, until the test ends.
func startFullAPI(t *testing.T) *api.Server {
	t.Helper()
	store, billingSvc := billingtest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	var batch chstore.EngineBatch
	for i := range 60 {
		batch.Append(&meterv1.EngineSample{SampleId: fmt.Sprint("s", i), Deployment: "d", Engine: "vllm", Replica: "d-0", Model: "m",
			SampledAt: timestamppb.New(billingtest.Hour.Add(time.Duration(i) * time.Minute)), IntervalS: 60, Source: "scrape",
			Running: proto.Uint32(uint32(i % 9)), Waiting: proto.Uint32(uint32(i % 4)), KvCacheUsage: proto.Float64(0.5),
			PrefixCacheQueries: proto.Uint64(100), PrefixCacheHits: proto.Uint64(40), Preemptions: proto.Uint64(uint64(i % 2))}, time.Now())
	}
	if err := store.InsertEngineSamples(ctx, &batch); err != nil {
		t.Fatal(err)
	}
	billingtest.RollUp(t, store)

	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	broker, err := devenv.StartKafka(devenv.KafkaConfig{Addr: "127.0.0.1:0", Topics: []string{ingest.DefaultEventsTopic, ingest.DefaultDLQTopic}})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	pub, err := ingest.NewPublisher(ingest.PublisherConfig{Brokers: []string{broker.Addr()}, WriteTimeout: 5 * time.Second}, reg, logger, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	reads := query.New(store, query.Config{})
	srv, err := api.New(ctx, api.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"},
		&api.Services{Keys: testKeySet(t), Publisher: pub, Usage: reads, Rollups: reads, Cost: reads, Prices: store, Admin: store,
			Billing: billingSvc, Reports: reads, Engine: reads}, store.Ping, reg, logger)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { srv.Run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		<-done
		pub.Close()
		broker.Close()
	})
	return srv
}
