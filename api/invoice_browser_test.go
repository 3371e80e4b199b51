package api_test

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/api"
	"tokenmeter/billing"
	"tokenmeter/billing/closing"
	"tokenmeter/billing/invoicehtml"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	"tokenmeter/internal/testkit/billingtest"
	"tokenmeter/internal/testkit/browsertest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
)

// invoiceAccounts is an accounts file with a seller, acme's buyer details
// and an 18% GST, and globex with no tax.
const invoiceAccounts = `{
 "operator": {"invoice_issuer_name": "Example Inference Ltd", "invoice_prefix": "EI-", "payment_terms_days": 14,
  "seller": {"name": "Example Inference", "legal_name": "Example Inference Ltd", "address": ["1 Main St", "Springfield"],
             "tax_id": "US12-3456789", "email": "billing@example.com"}},
 "tenants": [
  {"id": "acme", "name": "Acme Corp", "billing_account_id": "acme-billing", "tax_name": "GST", "tax_rate": "0.18",
   "buyer": {"name": "Acme Corp", "legal_name": "Acme Corp Pvt Ltd", "address": ["2 Park Rd", "Bengaluru <560001>"], "tax_id": "29ABCDE1234F1Z5", "email": "ap@acme.example"}},
  {"id": "globex", "name": "Globex"}
 ]}`

// startInvoiceAPI serves billingtest's October over the API with the
// accounts file above, lines per deployment, and October closed.
func startInvoiceAPI(t *testing.T) *billStack {
	t.Helper()
	store, _ := billingtest.New(t)
	acc, err := billing.ParseAccounts([]byte(invoiceAccounts))
	if err != nil {
		t.Fatal(err)
	}
	book, err := billing.ParsePriceBook([]byte(billingtest.Book))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := closing.NewService(closing.Deps{Reads: query.New(store, query.Config{}), Store: store,
		Prices: func(context.Context) (*billing.PriceBook, error) { return book, nil }},
		closing.Config{Accounts: acc, ByDeployment: true})
	if err != nil {
		t.Fatal(err)
	}
	s := startBillingAPI(t, store, svc, api.Config{})
	// acme's September, closed, then late usage of it, billed in October.
	sept := func(id string, day int) {
		chstoretest.Insert(t, store, []*meterv1.InferenceEvent{{EventId: id, TenantId: "acme", Model: "m", Deployment: "d",
			CompletedAt: timestamppb.New(time.Date(2026, 9, day, 12, 0, 0, 0, time.UTC)), PromptTokens: proto.Int64(123_457), OutputTokens: proto.Int64(7_891)}})
		billingtest.RollUp(t, store)
	}
	sept("sept-1", 10)
	if r := s.get(t, "POST", "/v1/billing/periods/2026-09:close", testKeys["admin"], `{"tenant_ids":["acme"]}`); r.code != 200 {
		t.Fatalf("close September: %d %s", r.code, r.body)
	}
	sept("sept-late", 20)
	closeOctober(t, s)
	return s
}

func invoicePath(tenant, format string) string {
	v := url.Values{"tenant_id": {tenant}}
	if format != "" {
		v.Set("format", format)
	}
	return "/v1/billing/statements/2026-10/invoice?" + v.Encode()
}

// printed reads a printed amount exactly.
func printed(t *testing.T, s string) billing.Money {
	t.Helper()
	m, err := billing.ParseMoney(strings.TrimSpace(s))
	if err != nil {
		t.Fatalf("printed amount %q: %v", s, err)
	}
	return m
}

// shownInvoice is what the browser shows of an invoice page.
type shownInvoice struct {
	Number   string   `json:"number"`
	Lines    []string `json:"lines"`
	Subtotal string   `json:"subtotal"`
	Tax      string   `json:"tax"`
	Total    string   `json:"total"`
	Buyer    string   `json:"buyer"`
	External int      `json:"external"`
}

const readInvoice = `({
	number: document.querySelector("#number").textContent,
	lines: Array.from(document.querySelectorAll("tr.line td.amount")).map(td => td.textContent),
	subtotal: document.querySelector("#subtotal").textContent,
	tax: document.querySelector("#tax").textContent,
	total: document.querySelector("#total").textContent,
	buyer: document.querySelector("#buyer").textContent,
	external: document.scripts.length + document.querySelectorAll("[src],link,img,iframe").length,
})`

// openInvoice opens page (an invoice's HTML) from a file in Chromium, as a
// user would a download, checks it loads without errors or external
// fetches, keeps a screenshot named name and returns what it shows.
func openInvoice(t *testing.T, b *browsertest.Browser, page []byte, name string) shownInvoice {
	t.Helper()
	file := filepath.Join(t.TempDir(), name+".html")
	if err := os.WriteFile(file, page, 0o644); err != nil {
		t.Fatal(err)
	}
	p := b.Open(t, "file://"+file)
	p.Run(t, chromedp.WaitVisible(chromedp.CSS("#invoice")))
	if errs := p.Errors(); len(errs) > 0 {
		t.Errorf("%s: page errors: %q", name, errs)
	}
	shown := browsertest.Value(t, p, chromedp.Evaluate[shownInvoice](readInvoice))
	if shown.External != 0 {
		t.Errorf("%s: %d scripts or external elements, want none", name, shown.External)
	}
	p.Screenshot(t, name)
	return shown
}

// checkShown: the page's lines add up to its subtotal, which is the
// statement's total; tax and total are the invoice's; subtotal plus tax is
// the total.
func checkShown(t *testing.T, name string, shown shownInvoice, inv *meterv1.Invoice, statementTotal int64) {
	t.Helper()
	var sum billing.Money
	for _, l := range shown.Lines {
		sum += printed(t, l)
	}
	sub, tax, total := printed(t, shown.Subtotal), printed(t, shown.Tax), printed(t, shown.Total)
	if len(shown.Lines) != len(inv.GetLines()) || len(shown.Lines) == 0 {
		t.Errorf("%s: %d lines shown, the invoice has %d", name, len(shown.Lines), len(inv.GetLines()))
	}
	if sum != sub || int64(sub) != statementTotal || int64(sub) != inv.GetSubtotal().GetNanos() {
		t.Errorf("%s: lines add up to %s, subtotal shown %s, statement total %s", name, sum, sub, billing.Money(statementTotal))
	}
	if int64(tax) != inv.GetTax().GetNanos() || int64(total) != inv.GetTotal().GetNanos() || sub+tax != total {
		t.Errorf("%s: shown tax %s total %s; the invoice's %s and %s", name, tax, total, inv.GetTax().GetAmount(), inv.GetTotal().GetAmount())
	}
	if shown.Number != inv.GetNumber() {
		t.Errorf("%s: number %q, want %q", name, shown.Number, inv.GetNumber())
	}
}

// TestInvoiceInBrowser closes October and opens each tenant's HTML invoice
// from the API in headless Chromium: it loads from disk with nothing
// fetched, its lines add up to the subtotal shown, which is the statement's
// total, and tax and total are the JSON invoice's. Then an admin voids
// acme's statement over REST: the credit note and the reissued invoice
// are checked the same way, and the original statement revision is
// unchanged. Screenshots: artifacts/invoice-*.png.
func TestInvoiceInBrowser(t *testing.T) {
	b := browsertest.New(t)
	s := startInvoiceAPI(t)
	for _, tenant := range []string{"acme", "globex"} {
		r := s.get(t, "GET", "/v1/billing/statements/2026-10?tenant_id="+tenant, testKeys["finance"], "")
		var st meterv1.GetStatementResponse
		if r.code != 200 || protojson.Unmarshal(r.body, &st) != nil {
			t.Fatalf("statement: %d %s", r.code, r.body)
		}
		r = s.get(t, "GET", invoicePath(tenant, "json"), testKeys["finance"], "")
		var inv meterv1.GetInvoiceResponse
		if r.code != 200 || protojson.Unmarshal(r.body, &inv) != nil {
			t.Fatalf("JSON invoice: %d %s", r.code, r.body)
		}
		page := s.get(t, "GET", invoicePath(tenant, ""), testKeys["finance"], "")
		if page.code != 200 || !strings.HasPrefix(page.header.Get("Content-Type"), "text/html") || page.header.Get("Content-Security-Policy") == "" {
			t.Fatalf("HTML invoice: %d %v %.200s", page.code, page.header, page.body)
		}
		shown := openInvoice(t, b, page.body, "invoice-"+tenant)
		checkShown(t, tenant, shown, inv.GetInvoice(), st.GetStatement().GetTotal().GetNanos())
		if inv.GetInvoice().GetStatementHash() != st.GetStatement().GetHash() {
			t.Errorf("%s: invoice of statement %s, the statement is %s", tenant, inv.GetInvoice().GetStatementHash(), st.GetStatement().GetHash())
		}
		if tenant == "acme" && (!strings.Contains(shown.Buyer, "Bengaluru <560001>") || inv.GetInvoice().GetTaxRate() != "0.18" ||
			inv.GetInvoice().GetIssueDate() == "" || inv.GetInvoice().GetDueDate() == "") {
			t.Errorf("acme's invoice: buyer %q, rate %s, issued %s, due %s", shown.Buyer, inv.GetInvoice().GetTaxRate(),
				inv.GetInvoice().GetIssueDate(), inv.GetInvoice().GetDueDate())
		}
	}

	// The void, over REST.
	before := listRevisions(t, s, "acme")
	if len(before) != 1 {
		t.Fatalf("%d revisions before the void", len(before))
	}
	body := `{"tenant_id": "acme", "statement_hash": "` + before[0].GetHash() + `", "reason": "GST rate applies from October"}`
	for _, key := range []string{"tenant", "finance"} {
		if r := s.get(t, "POST", "/v1/billing/statements/2026-10:void", testKeys[key], body); r.code != 403 {
			t.Errorf("void with a %s key: %d, want 403", key, r.code)
		}
	}
	r := s.get(t, "POST", "/v1/billing/statements/2026-10:void", testKeys["admin"], body)
	var void meterv1.VoidStatementResponse
	if r.code != 200 || protojson.Unmarshal(r.body, &void) != nil {
		t.Fatalf("void: %d %s", r.code, r.body)
	}
	if again := s.get(t, "POST", "/v1/billing/statements/2026-10:void", testKeys["admin"], body); again.code != 200 || !strings.Contains(string(again.body), void.GetInvoice().GetNumber()) {
		t.Errorf("void retried: %d %s", again.code, again.body)
	}
	stale := strings.Replace(body, before[0].GetHash(), "0123", 1)
	if r := s.get(t, "POST", "/v1/billing/statements/2026-10:void", testKeys["admin"], stale); r.code != 409 {
		t.Errorf("void of a stale hash: %d, want 409", r.code)
	}
	after := listRevisions(t, s, "acme")
	if len(after) != 2 || after[0].GetContent() != before[0].GetContent() || after[0].GetHash() != before[0].GetHash() || !after[1].GetInForce() {
		t.Fatalf("revisions after the void: %d; the original must be unchanged", len(after))
	}
	if void.GetVoided().GetContent() != before[0].GetContent() || void.GetReissued().GetHash() != after[1].GetHash() {
		t.Error("the void's answer differs from the stored revisions")
	}
	// The reissued invoice is the one served now; the credit note is in
	// the tenant's documents.
	r = s.get(t, "GET", invoicePath("acme", ""), testKeys["tenant"], "")
	if r.code != 200 {
		t.Fatalf("tenant's invoice: %d %s", r.code, r.body)
	}
	var st meterv1.GetStatementResponse
	if g := s.get(t, "GET", "/v1/billing/statements/2026-10?tenant_id=acme", testKeys["tenant"], ""); g.code != 200 || protojson.Unmarshal(g.body, &st) != nil {
		t.Fatalf("statement: %d %s", g.code, g.body)
	}
	if st.GetStatement().GetHash() != after[1].GetHash() {
		t.Errorf("statement in force %s, want the reissue %s", st.GetStatement().GetHash(), after[1].GetHash())
	}
	checkShown(t, "reissued", openInvoice(t, b, r.body, "invoice-acme-reissued"), void.GetInvoice(), st.GetStatement().GetTotal().GetNanos())
	docs := s.get(t, "GET", "/v1/billing/statements/2026-10/invoices?tenant_id=acme", testKeys["tenant"], "")
	var list meterv1.ListInvoicesResponse
	if docs.code != 200 || protojson.Unmarshal(docs.body, &list) != nil || len(list.GetDocuments()) != 3 {
		t.Fatalf("documents: %d %.300s", docs.code, docs.body)
	}
	cn := list.GetDocuments()[1]
	if cn.GetKind() != "credit_note" || cn.GetCredits() != list.GetDocuments()[0].GetNumber() || cn.GetNumber() != void.GetCreditNote().GetNumber() {
		t.Errorf("documents: %s %s credits %s", cn.GetKind(), cn.GetNumber(), cn.GetCredits())
	}
	var page strings.Builder
	if err := invoicehtml.HTML(&page, cn); err != nil {
		t.Fatal(err)
	}
	orig := list.GetDocuments()[0]
	checkShown(t, "credit note", openInvoice(t, b, []byte(page.String()), "invoice-acme-credit-note"), cn, -orig.GetSubtotal().GetNanos())
	if cn.GetTotal().GetNanos() != -orig.GetTotal().GetNanos() {
		t.Errorf("credit note total %s, the invoice's %s", cn.GetTotal().GetAmount(), orig.GetTotal().GetAmount())
	}

	// A second void voids the reissue (revision 1).
	body = `{"tenant_id": "acme", "statement_hash": "` + after[1].GetHash() + `", "reason": "second thoughts"}`
	r = s.get(t, "POST", "/v1/billing/statements/2026-10:void", testKeys["admin"], body)
	var second meterv1.VoidStatementResponse
	if r.code != 200 || protojson.Unmarshal(r.body, &second) != nil {
		t.Fatalf("second void: %d %s", r.code, r.body)
	}
	if second.GetVoided().GetRevision() != 1 || second.GetReissued().GetRevision() != 2 || second.GetCreditNote().GetCredits() != void.GetInvoice().GetNumber() {
		t.Errorf("second void: revision %d -> %d, credits %s", second.GetVoided().GetRevision(), second.GetReissued().GetRevision(), second.GetCreditNote().GetCredits())
	}

	// Roles: a tenant key sees its own tenant only; without a key, 401.
	for _, c := range []struct {
		path, key string
		want      int
	}{
		{invoicePath("globex", ""), testKeys["tenant"], 403},
		{invoicePath("acme", ""), "", 401},
		{invoicePath("acme", ""), testKeys["ingest"], 403},
		{invoicePath("acme", "pdf"), testKeys["finance"], 400},
		{"/v1/billing/statements/2026-08/invoice?tenant_id=acme", testKeys["finance"], 409},
		{"/v1/billing/statements/2026-10/revisions?tenant_id=globex", testKeys["tenant"], 403},
	} {
		if r := s.get(t, "GET", c.path, c.key, ""); r.code != c.want {
			t.Errorf("GET %s: %d, want %d (%.200s)", c.path, r.code, c.want, r.body)
		}
	}
}

func listRevisions(t *testing.T, s *billStack, tenant string) []*meterv1.StatementRevision {
	t.Helper()
	r := s.get(t, "GET", "/v1/billing/statements/2026-10/revisions?tenant_id="+tenant, testKeys["finance"], "")
	var resp meterv1.ListStatementRevisionsResponse
	if r.code != 200 || protojson.Unmarshal(r.body, &resp) != nil {
		t.Fatalf("revisions: %d %s", r.code, r.body)
	}
	return resp.GetRevisions()
}
