package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// runBillingCredits prints a tenant's credit grants and balances, and with
// --ledger its ledger.
func runBillingCredits(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var conn connConfig
	var tenant, out string
	var ledger bool
	fs := newFlagSet("billing credits", "[--tenant T] [--ledger] [-o table|json]",
		"Prints a tenant's credit grants from GET /v1/billing/credits/balance, in the order\n"+
			"statements draw on them (promotional before prepaid, then priority, earliest\n"+
			"expiry), each with what was drawn, what expired and what is left; with --ledger,\n"+
			"the ledger from GET /v1/billing/credits/ledger instead: each draw and expiry a\n"+
			"closed statement made, oldest first. A tenant key reads its own tenant; finance\n"+
			"and admin keys every tenant without --tenant.", stderr)
	conn.register(fs)
	fs.StringVar(&tenant, "tenant", "", "tenant (default: a tenant key's own; every tenant for finance and admin keys)")
	fs.BoolVar(&ledger, "ledger", false, "print the ledger rather than the balances")
	outputFlag(fs, &out, "table", "output: table or json")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := errors.Join(resolveConn(&conn, getenv, out, "table", "json")...); err != nil {
		return err
	}
	q := withTenant(url.Values{}, tenant)
	ts := func(p interface{ AsTime() time.Time }) string { return p.AsTime().UTC().Format(time.RFC3339) }
	if ledger {
		resp := &meterv1.ListCreditLedgerResponse{}
		if err := getJSON(ctx, conn, http.MethodGet, "/v1/billing/credits/ledger", q, nil, resp); err != nil {
			return err
		}
		if out == "json" {
			return writeJSON(stdout, resp)
		}
		g := &grid{cols: []column{{head: "AT"}, {head: "TENANT"}, {head: "GRANT"}, {head: "KIND"}, {head: "PERIOD"}, {head: "CHANGE", num: true}, {head: "STATEMENT"}}}
		for _, e := range resp.GetEntries() {
			g.add(ts(e.GetAt()), e.GetTenantId(), e.GetGrantId(), e.GetKind(), e.GetPeriod(), exactMoney(e.GetChange()), e.GetStatementHash())
		}
		return g.writeTable(stdout)
	}
	resp := &meterv1.GetCreditBalanceResponse{}
	if err := getJSON(ctx, conn, http.MethodGet, "/v1/billing/credits/balance", q, nil, resp); err != nil {
		return err
	}
	if out == "json" {
		return writeJSON(stdout, resp)
	}
	g := &grid{cols: []column{{head: "TENANT"}, {head: "GRANT"}, {head: "KIND"}, {head: "PRIORITY", num: true}, {head: "FROM"}, {head: "EXPIRES"}}}
	g.cols = append(g.cols, numColumns("GRANTED", "DRAWN", "EXPIRED", "REMAINING")...)
	for _, b := range resp.GetGrants() {
		gr := b.GetGrant()
		expires := "never"
		if gr.GetExpiresAt() != nil {
			expires = ts(gr.GetExpiresAt())
		}
		g.add(gr.GetTenantId(), gr.GetGrantId(), gr.GetKind(), fmt.Sprint(gr.GetPriority()), ts(gr.GetEffectiveFrom()), expires,
			exactMoney(gr.GetAmount()), exactMoney(b.GetDrawn()), exactMoney(b.GetExpired()), exactMoney(b.GetRemaining()))
	}
	if err := g.writeTable(stdout); err != nil {
		return err
	}
	for _, t := range resp.GetTotals() {
		fmt.Fprintf(stdout, "%s has %s of credit left.\n", t.GetTenantId(), exactMoney(t.GetRemaining()))
	}
	return nil
}

// runBillingGrant creates a credit grant (admin key).
func runBillingGrant(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var conn connConfig
	var tenant, kind, amount, currency, from, expires, description, out string
	var priority int
	fs := newFlagSet("billing grant", "GRANT_ID --tenant T --kind prepaid|promotional --amount A --from TIME [--expires TIME] [--priority N] [--description D]",
		"Creates a credit grant with POST /v1/billing/credits/grants (admin key). GRANT_ID\n"+
			"is the idempotency key: running the same command again stores nothing more and\n"+
			"says so; the same id with other terms is refused. Closed statements draw their\n"+
			"charge from the grants in force for their period.", stderr)
	conn.register(fs)
	fs.StringVar(&tenant, "tenant", "", "tenant that may draw on the grant (required)")
	fs.StringVar(&kind, "kind", "", "prepaid or promotional (drawn first) (required)")
	fs.StringVar(&amount, "amount", "", "amount granted, a decimal such as 250.00 (required)")
	fs.StringVar(&currency, "currency", "", "currency (default and only choice: the price book's)")
	fs.StringVar(&from, "from", "", "first instant in force, RFC 3339 in whole seconds (required)")
	fs.StringVar(&expires, "expires", "", "expiry, RFC 3339 in whole seconds (default: never)")
	fs.IntVar(&priority, "priority", 0, "order among grants of one kind: lower first")
	fs.StringVar(&description, "description", "", "what the grant is for (statements show it)")
	outputFlag(fs, &out, "table", "output: table or json")
	id, err := parseWithArg(fs, args, "GRANT_ID")
	if err != nil {
		return err
	}
	errs := resolveConn(&conn, getenv, out, "table", "json")
	req := &meterv1.CreateCreditGrantRequest{GrantId: id, TenantId: tenant, Kind: kind, Amount: amount, Currency: currency,
		Priority: int32(priority), Description: description}
	for _, f := range []struct {
		name, v  string
		required bool
		set      func(time.Time)
	}{
		{"--from", from, true, func(t time.Time) { req.EffectiveFrom = timestamppb.New(t) }},
		{"--expires", expires, false, func(t time.Time) { req.ExpiresAt = timestamppb.New(t) }},
	} {
		if f.v == "" {
			if f.required {
				errs = append(errs, fmt.Errorf("%s is required", f.name))
			}
			continue
		}
		t, err := time.Parse(time.RFC3339, f.v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %q: want RFC 3339, such as 2026-11-01T00:00:00Z", f.name, f.v))
			continue
		}
		f.set(t)
	}
	for name, v := range map[string]string{"--tenant": tenant, "--kind": kind, "--amount": amount} {
		if v == "" {
			errs = append(errs, fmt.Errorf("%s is required", name))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	body, err := protojson.Marshal(req)
	if err != nil {
		return err
	}
	resp := &meterv1.CreateCreditGrantResponse{}
	if err := getJSON(ctx, conn, http.MethodPost, "/v1/billing/credits/grants", nil, body, resp); err != nil {
		return err
	}
	if out == "json" {
		return writeJSON(stdout, resp)
	}
	g := resp.GetGrant()
	what := "created"
	if !resp.GetCreated() {
		what = "already stored (nothing changed)"
	}
	fmt.Fprintf(stdout, "Grant %s: %s %s credit for %s from %s, %s.\n", g.GetGrantId(), exactMoney(g.GetAmount()), g.GetKind(), g.GetTenantId(),
		g.GetEffectiveFrom().AsTime().UTC().Format(time.RFC3339), what)
	return nil
}

// writeCharges prints a statement's charges besides usage at list price
// (contract discounts, dedicated GPU-hours, a commitment's true-up, credit
// draws) and what it did to the tenant's credit grants; nothing when it has
// neither.
func writeCharges(w io.Writer, st *meterv1.Statement) error {
	if len(st.GetCharges()) > 0 {
		fmt.Fprintln(w)
		g := &grid{cols: []column{{head: "CHARGE"}, {head: "LINE", num: true}, {head: "TOKENS"}, {head: "QUANTITY", num: true}, {head: "UNIT_PRICE", num: true},
			{head: "RULE"}, {head: "AMOUNT", num: true}}}
		for _, c := range st.GetCharges() {
			line := "-"
			if c.GetLine() >= 0 {
				line = fmt.Sprint(c.GetLine())
			}
			dash := func(s string) string {
				if s == "" {
					return "-"
				}
				return s
			}
			g.add(c.GetKind(), line, dash(c.GetTokenKind()), dash(c.GetQuantity()), dash(c.GetUnitPrice()), dash(c.GetRule()), exactMoney(c.GetAmount()))
		}
		if err := g.writeTable(w); err != nil {
			return err
		}
	}
	if len(st.GetCredits()) > 0 {
		fmt.Fprintln(w)
		g := &grid{cols: []column{{head: "CREDIT_GRANT"}, {head: "KIND"}, {head: "EXPIRES"}}}
		g.cols = append(g.cols, numColumns("OPENING", "DRAWN", "EXPIRED", "CLOSING")...)
		for _, c := range st.GetCredits() {
			expires := "never"
			if c.GetExpiresAt() != nil {
				expires = c.GetExpiresAt().AsTime().UTC().Format(time.RFC3339)
			}
			g.add(c.GetGrantId(), c.GetKind(), expires, exactMoney(c.GetOpening()), exactMoney(c.GetDrawn()), exactMoney(c.GetExpired()), exactMoney(c.GetClosing()))
		}
		return g.writeTable(w)
	}
	return nil
}
