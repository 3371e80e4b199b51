package chstore_test

import (
	"bytes"
	"testing"
	"time"

	"tokenmeter/billing"
	"tokenmeter/internal/adapter/chstore/chstoretest"
)

// TestStatementRevisions: a reissue becomes the statement in force for
// every reader (Statement, TenantStatements, EachStatement) while revision
// 0 stays readable byte for byte; a revision is written once.
func TestStatementRevisions(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	ctx := t.Context()
	p, err := billing.ParsePeriod("2026-11", time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	orig := billing.Statement{Tenant: "acme", Period: p.Key, Zone: "UTC", PeriodStart: p.Start, PeriodEnd: p.End, Currency: "USD",
		Charge: 1_234_000_000, Total: 1_230_000_000}
	orig.Hash, _ = orig.ContentHash()
	first, err := s.SaveStatement(ctx, orig, time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.SaveRevision(ctx, orig, time.Now()); err == nil {
		t.Fatal("SaveRevision of revision 0: no error")
	}
	re := orig
	re.Revision, re.Replaces, re.VoidReason, re.Total = 1, orig.Hash, "wrong rate", 1_000_000_000
	re.Hash, _ = re.ContentHash()
	reAt := time.Date(2026, 12, 9, 10, 0, 0, 0, time.UTC)
	cur, err := s.SaveRevision(ctx, re, reAt)
	if err != nil {
		t.Fatal(err)
	}
	if cur.Revision != 1 || cur.Hash != re.Hash || !cur.ClosedAt.Equal(reAt) {
		t.Fatalf("after the reissue: revision %d, hash %s, at %s", cur.Revision, cur.Hash, cur.ClosedAt)
	}
	// A second save of revision 1 (another reissue racing) keeps the first.
	other := re
	other.VoidReason = "other"
	other.Hash, _ = other.ContentHash()
	if got, err := s.SaveRevision(ctx, other, reAt.Add(time.Second)); err != nil || got.Hash != re.Hash {
		t.Fatalf("second revision 1: %s, %v; want the first, %s", got.Hash, err, re.Hash)
	}
	inForce, ok, err := s.Statement(ctx, "acme", p.Key)
	if err != nil || !ok || inForce.Revision != 1 || inForce.Hash != re.Hash {
		t.Fatalf("Statement: revision %d hash %s (ok %v, %v), want revision 1 %s", inForce.Revision, inForce.Hash, ok, err, re.Hash)
	}
	all, err := s.TenantStatements(ctx, "acme")
	if err != nil || len(all) != 1 || all[0].Revision != 1 || !bytes.Equal(all[0].Content, inForce.Content) {
		t.Fatalf("TenantStatements: %+v, %v", all, err)
	}
	n := 0
	if err := s.EachStatement(ctx, p.Key, "", func(st billing.StoredStatement) error {
		n++
		if st.Revision != 1 || st.Hash != re.Hash || !st.ClosedAt.Equal(reAt) {
			t.Errorf("EachStatement: revision %d, %s, %s", st.Revision, st.Hash, st.ClosedAt)
		}
		return nil
	}); err != nil || n != 1 {
		t.Fatalf("EachStatement: %d statements, %v", n, err)
	}
	revs, err := s.StatementRevisions(ctx, "acme", p.Key)
	if err != nil || len(revs) != 2 {
		t.Fatalf("StatementRevisions: %d, %v", len(revs), err)
	}
	if !bytes.Equal(revs[0].Content, first.Content) || revs[0].Hash != first.Hash || revs[0].Revision != 0 || !revs[0].ClosedAt.Equal(first.ClosedAt) {
		t.Errorf("revision 0 changed: %s, want %s", revs[0].Content, first.Content)
	}
	if revs[1].Hash != re.Hash || revs[1].Revision != 1 {
		t.Errorf("revision 1: %+v", revs[1])
	}
	if first, _, _ := s.FirstClosedPeriod(ctx); first != p.Key {
		t.Errorf("first closed period %q", first)
	}
}

// TestInvoiceDocuments: documents are stored in one insert and read back
// byte for byte by period and tenant; the last sequence number is per
// issuer; of two documents with one number the first stored is read.
func TestInvoiceDocuments(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	ctx := t.Context()
	if seq, err := s.LastInvoiceSeq(ctx, "EI-"); err != nil || seq != 0 {
		t.Fatalf("empty: last seq %d, %v", seq, err)
	}
	at := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	doc := func(issuer string, seq uint64, tenant string, kind billing.InvoiceKind, content string) billing.StoredInvoice {
		return billing.StoredInvoice{Kind: kind, Issuer: issuer, Number: billing.InvoiceNumber(issuer, seq), Seq: seq, Tenant: tenant,
			Period: "2026-11", StatementHash: "h-" + tenant, IssuedAt: at, Hash: "x" + content, Content: []byte(content)}
	}
	docs := []billing.StoredInvoice{
		doc("EI-", 1, "acme", billing.KindInvoice, `{"n":1}`),
		doc("EI-", 2, "beta", billing.KindInvoice, `{"n":2}`),
		doc("EI-", 3, "acme", billing.KindCreditNote, `{"n":3}`),
		doc("XY-", 1, "acme", billing.KindInvoice, `{"n":"x1"}`),
	}
	if err := s.SaveInvoices(ctx, docs); err != nil {
		t.Fatal(err)
	}
	at = at.Add(time.Hour)
	if err := s.SaveInvoices(ctx, []billing.StoredInvoice{doc("EI-", 2, "gamma", billing.KindInvoice, `{"dup":2}`)}); err != nil {
		t.Fatal(err)
	}
	if seq, err := s.LastInvoiceSeq(ctx, "EI-"); err != nil || seq != 3 {
		t.Errorf("last EI- seq %d, %v; want 3", seq, err)
	}
	if seq, err := s.LastInvoiceSeq(ctx, "XY-"); err != nil || seq != 1 {
		t.Errorf("last XY- seq %d, %v; want 1", seq, err)
	}
	got, err := s.Invoices(ctx, "2026-11", "acme")
	if err != nil || len(got) != 3 {
		t.Fatalf("acme's: %d, %v", len(got), err)
	}
	if got[0].Number != "EI-000001" || got[1].Kind != billing.KindCreditNote || got[2].Issuer != "XY-" || string(got[1].Content) != `{"n":3}` {
		t.Errorf("acme's documents: %+v", got)
	}
	all, err := s.Invoices(ctx, "2026-11", "")
	if err != nil || len(all) != 4 {
		t.Fatalf("all: %d, %v; want 4 (the duplicate number left out)", len(all), err)
	}
	if all[1].Tenant != "beta" || string(all[1].Content) != `{"n":2}` {
		t.Errorf("EI-000002 is %s's %s, want beta's, stored first", all[1].Tenant, all[1].Content)
	}
}
