package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"google.golang.org/protobuf/encoding/protojson"

	"tokenmeter/billing"
	"tokenmeter/billing/invoicehtml"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// runBillingInvoice prints the invoice of a tenant's closed statement.
func runBillingInvoice(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var conn connConfig
	var tenant, out string
	fs := newFlagSet("billing invoice", "PERIOD [--tenant T] [-o table|json|html]",
		"Prints the invoice of a tenant's statement of a closed PERIOD (the revision in\n"+
			"force) from GET /v1/billing/statements/PERIOD/invoice: its number, dates, lines\n"+
			"in the currency's minor unit, tax and total. -o html writes the printable page,\n"+
			"the one the API serves (meterctl billing invoice 2026-10 --tenant acme -o html > acme.html).", stderr)
	conn.register(fs)
	fs.StringVar(&tenant, "tenant", "", "tenant (required with a finance or admin key)")
	outputFlag(fs, &out, "table", "output: table, json or html")
	period, err := parseWithArg(fs, args, "PERIOD")
	if err != nil {
		return err
	}
	if err := errors.Join(resolveConn(&conn, getenv, out, "table", "json", "html")...); err != nil {
		return err
	}
	q := withTenant(url.Values{"format": {"json"}}, tenant)
	resp := &meterv1.GetInvoiceResponse{}
	if err := getJSON(ctx, conn, http.MethodGet, "/v1/billing/statements/"+url.PathEscape(period)+"/invoice", q, nil, resp); err != nil {
		return err
	}
	switch out {
	case "json":
		return writeJSON(stdout, resp)
	case "html":
		return invoicehtml.HTML(stdout, resp.GetInvoice())
	}
	return writeInvoice(stdout, resp.GetInvoice())
}

// writeInvoice prints an invoice or credit note as a table.
func writeInvoice(w io.Writer, inv *meterv1.Invoice) error {
	d := int(inv.GetMinorDigits())
	cur := inv.GetSubtotal().GetCurrency()
	amount := func(m *meterv1.Money) string { return billing.Money(m.GetNanos()).StringFixed(d) }
	what := "Invoice"
	if inv.GetKind() == string(billing.KindCreditNote) {
		what = "Credit note"
	}
	fmt.Fprintf(w, "%s %s of %s for %s (revision %d, statement %s)\n", what, inv.GetNumber(), inv.GetBuyer().GetName(), inv.GetPeriod(),
		inv.GetRevision(), inv.GetStatementHash())
	fmt.Fprintf(w, "Issued %s", inv.GetIssueDate())
	if inv.GetDueDate() != "" {
		fmt.Fprintf(w, ", due %s", inv.GetDueDate())
	}
	fmt.Fprintf(w, " by %s.\n", inv.GetSeller().GetName())
	if inv.GetCredits() != "" {
		fmt.Fprintf(w, "Cancels invoice %s: %s\n", inv.GetCredits(), inv.GetReason())
	}
	if inv.GetReplaces() != "" {
		fmt.Fprintf(w, "Replaces invoice %s.\n", inv.GetReplaces())
	}
	g := &grid{cols: []column{{head: "KIND"}, {head: "DESCRIPTION"}, {head: "QUANTITY"}, {head: "AMOUNT " + cur, num: true}}}
	for _, l := range inv.GetLines() {
		g.add(l.GetKind(), l.GetDescription(), l.GetQuantity(), amount(l.GetAmount()))
	}
	tax := "Tax"
	if inv.GetTaxName() != "" {
		tax = inv.GetTaxName()
	}
	g.add("", "Subtotal", "", amount(inv.GetSubtotal()))
	g.add("", tax+" at "+inv.GetTaxRate(), "", amount(inv.GetTax()))
	g.add("", "Total", "", amount(inv.GetTotal()))
	return g.writeTable(w)
}

// runBillingVoid voids a closed statement and reissues it.
func runBillingVoid(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var conn connConfig
	var tenant, hash, reason, out string
	fs := newFlagSet("billing void", "PERIOD --tenant T --hash H --reason R [-o table|json]",
		"Voids the statement of a tenant's closed PERIOD whose hash is H (the revision in\n"+
			"force: meterctl billing statement shows it) and reissues it, with POST\n"+
			"/v1/billing/statements/PERIOD:void: a new revision computed as a close would now,\n"+
			"a credit note of the old invoice and a new invoice. The old revision's bytes are\n"+
			"kept. Admin keys only; running it again with the same hash changes nothing.", stderr)
	conn.register(fs)
	fs.StringVar(&tenant, "tenant", "", "tenant (required)")
	fs.StringVar(&hash, "hash", "", "hash of the statement voided (required)")
	fs.StringVar(&reason, "reason", "", "why, printed on the credit note (required)")
	outputFlag(fs, &out, "table", "output: table or json")
	period, err := parseWithArg(fs, args, "PERIOD")
	if err != nil {
		return err
	}
	errs := resolveConn(&conn, getenv, out, "table", "json")
	for name, v := range map[string]string{"--tenant": tenant, "--hash": hash, "--reason": reason} {
		if v == "" {
			errs = append(errs, fmt.Errorf("%s is required", name))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	body, err := protojson.Marshal(&meterv1.VoidStatementRequest{TenantId: tenant, StatementHash: hash, Reason: reason})
	if err != nil {
		return err
	}
	resp := &meterv1.VoidStatementResponse{}
	if err := getJSON(ctx, conn, http.MethodPost, "/v1/billing/statements/"+url.PathEscape(period)+":void", nil, body, resp); err != nil {
		return err
	}
	if out == "json" {
		return writeJSON(stdout, resp)
	}
	fmt.Fprintf(stdout, "Voided revision %d (%s) of %s's %s; revision %d (%s) is in force.\n", resp.GetVoided().GetRevision(), resp.GetVoided().GetHash(),
		tenant, period, resp.GetReissued().GetRevision(), resp.GetReissued().GetHash())
	if err := writeInvoice(stdout, resp.GetCreditNote()); err != nil {
		return err
	}
	return writeInvoice(stdout, resp.GetInvoice())
}
