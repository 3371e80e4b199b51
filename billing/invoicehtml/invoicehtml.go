// Package invoicehtml renders an invoice or credit note (the API's
// meterv1.Invoice) as a printable HTML page: one self-contained file, its
// style inline, no script and nothing fetched, readable from disk, A4 when
// printed. The API serves it (GET /v1/billing/statements/{period}/invoice)
// and meterctl writes it; what the document says is computed in package
// billing (invoice.go), never here.
package invoicehtml

import (
	"fmt"
	"html/template"
	"io"
	"strings"

	"tokenmeter/billing"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// Policy is the Content-Security-Policy the API serves the page with: it
// needs nothing but its inline style. The page carries metaPolicy, the same
// but sandbox (which a meta tag cannot set), for when it is opened from
// disk.
const Policy = metaPolicy + "; sandbox"

const metaPolicy = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

// FileName is the download name of inv's page: "EI-000042.html".
func FileName(inv *meterv1.Invoice) string {
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.' {
			return r
		}
		return '_'
	}, inv.GetNumber())
	if name == "" {
		name = "invoice"
	}
	return name + ".html"
}

// HTML writes inv's page to w.
func HTML(w io.Writer, inv *meterv1.Invoice) error {
	digits := int(inv.GetMinorDigits())
	amount := func(m *meterv1.Money) string { return billing.Money(m.GetNanos()).StringFixed(digits) }
	title := "Invoice"
	if inv.GetKind() == string(billing.KindCreditNote) {
		title = "Credit note"
	}
	rate := ""
	if r, err := billing.ParseWeight(inv.GetTaxRate()); err == nil && r > 0 {
		rate = strings.TrimSuffix(strings.TrimRight(billing.Money(r*100).StringFixed(9), "0"), ".") + "%"
	}
	data := struct {
		Inv      *meterv1.Invoice
		Title    string
		Currency string
		Rate     string
		Period   string
		Amount   func(*meterv1.Money) string
		Policy   string
	}{inv, title, inv.GetSubtotal().GetCurrency(), rate, periodSpan(inv), amount, metaPolicy}
	if err := page.Execute(w, data); err != nil {
		return fmt.Errorf("render invoice %s: %w", inv.GetNumber(), err)
	}
	return nil
}

// periodSpan is the billing period as dates in the tenant's zone.
func periodSpan(inv *meterv1.Invoice) string {
	zone, err := billing.ParseZone(inv.GetZone())
	if err != nil || inv.GetPeriodStart() == nil || inv.GetPeriodEnd() == nil {
		return inv.GetPeriod()
	}
	start := inv.GetPeriodStart().AsTime().In(zone)
	last := inv.GetPeriodEnd().AsTime().In(zone).AddDate(0, 0, -1)
	return fmt.Sprintf("%s (%s to %s, %s)", inv.GetPeriod(), start.Format("2 Jan 2006"), last.Format("2 Jan 2006"), inv.GetZone())
}

var page = template.Must(template.New("invoice").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{{.Policy}}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}} {{.Inv.GetNumber}}</title>
<style>
@page { size: A4; margin: 18mm 16mm; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; color: #1d2330; margin: 0; background: #eef0f4; }
main { max-width: 820px; margin: 24px auto; background: #fff; padding: 40px 48px; box-shadow: 0 1px 4px rgba(0,0,0,.12); }
header { display: flex; justify-content: space-between; align-items: flex-start; gap: 24px; border-bottom: 2px solid #1d2330; padding-bottom: 16px; }
h1 { font-size: 28px; margin: 0 0 4px; letter-spacing: .02em; }
h1.credit { color: #9b1c1c; }
.meta { text-align: right; }
.meta dl { display: grid; grid-template-columns: auto auto; gap: 2px 12px; margin: 0; }
.meta dt { color: #5b6473; }
.meta dd { margin: 0; font-weight: 600; }
.parties { display: grid; grid-template-columns: 1fr 1fr; gap: 24px; margin: 24px 0; }
.party h2 { font-size: 12px; text-transform: uppercase; letter-spacing: .08em; color: #5b6473; margin: 0 0 6px; }
.party p { margin: 0; }
.note { background: #fdf3f3; border-left: 4px solid #9b1c1c; padding: 8px 12px; margin: 0 0 16px; }
table { width: 100%; border-collapse: collapse; }
th { text-align: left; font-size: 12px; text-transform: uppercase; letter-spacing: .06em; color: #5b6473; border-bottom: 1px solid #c8cdd6; padding: 6px 8px; }
td { padding: 6px 8px; border-bottom: 1px solid #e6e9ee; vertical-align: top; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td .detail { display: block; color: #5b6473; font-size: 12px; }
tfoot td { border: none; }
tfoot tr.total td { font-weight: 700; font-size: 16px; border-top: 2px solid #1d2330; }
.rules { color: #5b6473; font-size: 11px; margin-top: 24px; }
@media print { body { background: #fff; } main { box-shadow: none; margin: 0; max-width: none; padding: 0; } }
</style>
</head>
<body>
<main id="invoice" data-number="{{.Inv.GetNumber}}" data-kind="{{.Inv.GetKind}}" data-currency="{{.Currency}}" data-minor-digits="{{.Inv.GetMinorDigits}}" data-statement-hash="{{.Inv.GetStatementHash}}">
<header>
<div>
<h1{{if .Inv.GetCredits}} class="credit"{{end}}>{{.Title}}</h1>
<div class="seller">
<strong>{{.Inv.GetSeller.GetName}}</strong>
{{with .Inv.GetSeller.GetLegalName}}<br>{{.}}{{end}}
{{range .Inv.GetSeller.GetAddress}}<br>{{.}}{{end}}
{{with .Inv.GetSeller.GetTaxId}}<br>Tax ID {{.}}{{end}}
{{with .Inv.GetSeller.GetEmail}}<br>{{.}}{{end}}
</div>
</div>
<div class="meta">
<dl>
<dt>Number</dt><dd id="number">{{.Inv.GetNumber}}</dd>
<dt>Issue date</dt><dd id="issue-date">{{.Inv.GetIssueDate}}</dd>
{{with .Inv.GetDueDate}}<dt>Due date</dt><dd id="due-date">{{.}}</dd>{{end}}
<dt>Period</dt><dd>{{.Period}}</dd>
<dt>Account</dt><dd>{{.Inv.GetBillingAccountId}}</dd>
{{if .Inv.GetRevision}}<dt>Revision</dt><dd>{{.Inv.GetRevision}}</dd>{{end}}
</dl>
</div>
</header>
<section class="parties">
<div class="party" id="buyer">
<h2>Bill to</h2>
<p><strong>{{.Inv.GetBuyer.GetName}}</strong>
{{with .Inv.GetBuyer.GetLegalName}}<br>{{.}}{{end}}
{{range .Inv.GetBuyer.GetAddress}}<br>{{.}}{{end}}
{{with .Inv.GetBuyer.GetTaxId}}<br>Tax ID {{.}}{{end}}
{{with .Inv.GetBuyer.GetEmail}}<br>{{.}}{{end}}</p>
</div>
<div class="party">
<h2>Statement</h2>
<p>Tenant {{.Inv.GetTenantId}}<br><code>{{.Inv.GetStatementHash}}</code></p>
</div>
</section>
{{with .Inv.GetCredits}}<p class="note" id="credits">This credit note cancels invoice <strong>{{.}}</strong>{{with $.Inv.GetReason}}: {{.}}{{end}}.</p>{{end}}
{{with .Inv.GetReplaces}}<p class="note" id="replaces">This invoice replaces invoice <strong>{{.}}</strong>, cancelled by a credit note.</p>{{end}}
<table>
<thead><tr><th>Description</th><th>Quantity</th><th class="num">Amount ({{.Currency}})</th></tr></thead>
<tbody>
{{range .Inv.GetLines}}<tr class="line" data-kind="{{.GetKind}}" data-amount="{{call $.Amount .GetAmount}}" data-exact="{{.GetExact.GetAmount}}">
<td>{{.GetDescription}}<span class="detail">{{.GetKind}}{{with .GetUnitPrice}} · {{.}}{{end}}</span></td>
<td>{{.GetQuantity}}{{with .GetUnit}} {{.}}{{end}}</td>
<td class="num amount">{{call $.Amount .GetAmount}}</td>
</tr>
{{end}}</tbody>
<tfoot>
<tr class="subtotal"><td colspan="2">Subtotal</td><td class="num" id="subtotal" data-value="{{call .Amount .Inv.GetSubtotal}}">{{call .Amount .Inv.GetSubtotal}}</td></tr>
<tr class="tax"><td colspan="2">{{with .Inv.GetTaxName}}{{.}}{{else}}Tax{{end}}{{with .Rate}} at {{.}}{{end}}</td><td class="num" id="tax" data-value="{{call .Amount .Inv.GetTax}}">{{call .Amount .Inv.GetTax}}</td></tr>
<tr class="total"><td colspan="2">{{if .Inv.GetCredits}}Total credited{{else}}Total due{{end}} ({{.Currency}})</td><td class="num" id="total" data-value="{{call .Amount .Inv.GetTotal}}">{{call .Amount .Inv.GetTotal}}</td></tr>
</tfoot>
</table>
<p class="rules">Lines: {{.Inv.GetLineRounding}}. Tax: {{.Inv.GetTaxRounding}}.</p>
</main>
</body>
</html>
`))
