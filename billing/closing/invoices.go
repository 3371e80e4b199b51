package closing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"tokenmeter/billing"
)

// Invoices (docs/architecture.md, "Invoices and credit notes"):
//
//   - Every closed statement revision has one invoice. Its number is the
//     operator's invoice prefix (the issuer) and the next of the issuer's
//     sequence, in which invoices and credit notes are numbered together,
//     gap-free: a number is taken only with the insert of its document,
//     which holds every document of one issue (store: one part, written
//     whole or not at all), and it is taken under the close lock (Deps.Lock,
//     the Kafka lease across replicas), reading the issuer's last number
//     after taking it.
//   - A close numbers the invoices of the statements it returns (those it
//     stored, in tenant order, and those closed before that have none)
//     under its lock, once they are stored. A read of the invoice of a
//     closed statement that has none (closed before invoices existed, or
//     by a close that stopped between the two inserts) takes the close
//     lock and issues it then (an admin's or finance reader's read; a
//     tenant's read never issues, InvoiceIssued). Either way a document
//     is dated when it is issued (ClickHouse's clock, read under the lock
//     after the last number), never before its statement's close, so
//     numbers and issue dates run in the same order.
//   - A void (Service.Void, admin only) replaces a closed statement: it
//     stores a new revision, computed as a close would compute it now, in
//     statement_revisions (the stored bytes of every earlier revision are
//     never touched and stay readable, StatementRevisions), then issues
//     under the same lock a credit note negating the voided revision's
//     invoice and the new revision's invoice. Only a tenant's latest
//     closed period may be voided: a later statement may have billed late
//     usage of it, which a reissue would bill again.

// InvoiceStore keeps statement revisions and invoice documents;
// *chstore.Store implements it.
type InvoiceStore interface {
	StatementRevisions(ctx context.Context, tenant, period string) ([]billing.StoredStatement, error)
	SaveRevision(ctx context.Context, st billing.Statement, closedAt time.Time) (billing.StoredStatement, error)
	LastInvoiceSeq(ctx context.Context, issuer string) (uint64, error)
	SaveInvoices(ctx context.Context, docs []billing.StoredInvoice) error
	Invoices(ctx context.Context, period, tenant string) ([]billing.StoredInvoice, error)
}

// ErrConflict marks a void of a statement revision that is no longer the
// one in force.
var ErrConflict = errors.New("statement revision conflict")

// issuer is the numbering prefix of new documents.
func (s *Service) issuer() string {
	if s.cfg.Accounts == nil {
		return ""
	}
	return s.cfg.Accounts.Operator.InvoicePrefix
}

// issueInvoices issues the invoices that stored (statements in force,
// stored) lack: for a reissued revision, with the credit note of the
// revision it voids. The caller holds the close lock.
func (s *Service) issueInvoices(ctx context.Context, stored []billing.StoredStatement) error {
	if len(stored) == 0 {
		return nil
	}
	docs := map[string][]billing.StoredInvoice{} // period → its documents
	for _, st := range stored {
		if _, ok := docs[st.Period]; ok {
			continue
		}
		d, err := s.d.Store.Invoices(ctx, st.Period, "")
		if err != nil {
			return err
		}
		docs[st.Period] = d
	}
	issuer := s.issuer()
	seq, err := s.d.Store.LastInvoiceSeq(ctx, issuer)
	if err != nil {
		return err
	}
	// Dated when issued, by the clock that stamps closes, read under the
	// lock after the last number: numbers and issue dates run in the same
	// order (chronological numbering), however late an invoice is issued.
	now, err := s.d.Store.ServerNow(ctx)
	if err != nil {
		return err
	}
	var out []billing.StoredInvoice
	for _, st := range stored {
		var mine []billing.StoredInvoice
		for _, d := range docs[st.Period] {
			if d.Tenant == st.Tenant {
				mine = append(mine, d)
			}
		}
		add, err := s.documentsFor(st, mine, issuer, &seq, maxTime(now, st.ClosedAt))
		if err != nil {
			return err
		}
		out = append(out, add...)
	}
	if err := s.d.Store.SaveInvoices(ctx, out); err != nil {
		return fmt.Errorf("issue invoices: %w", err)
	}
	return nil
}

// documentsFor are the documents st lacks, given its tenant's documents of
// its period, numbered after *seq and issued at at.
func (s *Service) documentsFor(st billing.StoredStatement, docs []billing.StoredInvoice, issuer string, seq *uint64, at time.Time) ([]billing.StoredInvoice, error) {
	invoiceOf := func(revision int) (billing.StoredInvoice, bool) {
		i := slices.IndexFunc(docs, func(d billing.StoredInvoice) bool { return d.Kind == billing.KindInvoice && d.Revision == revision })
		if i < 0 {
			return billing.StoredInvoice{}, false
		}
		return docs[i], true
	}
	if _, ok := invoiceOf(st.Revision); ok {
		return nil, nil
	}
	var bill billing.Statement
	if err := json.Unmarshal(st.Content, &bill); err != nil {
		return nil, fmt.Errorf("statement of %s for %s: %w", st.Tenant, st.Period, err)
	}
	var out []billing.StoredInvoice
	replaces := ""
	if prev, ok := invoiceOf(st.Revision - 1); ok && st.Revision > 0 {
		replaces = prev.Number
		credited := slices.ContainsFunc(docs, func(d billing.StoredInvoice) bool {
			return d.Kind == billing.KindCreditNote && d.Revision == prev.Revision
		})
		if !credited {
			orig, err := prev.Decode()
			if err != nil {
				return nil, err
			}
			*seq++
			cn, err := billing.NewCreditNote(orig, *seq, at, bill.VoidReason)
			if err != nil {
				return nil, err
			}
			enc, err := cn.Encode()
			if err != nil {
				return nil, err
			}
			out = append(out, enc)
		}
	}
	*seq++
	inv, err := billing.NewInvoice(bill, at, s.cfg.Accounts, *seq)
	if err != nil {
		return nil, err
	}
	inv.Issuer, inv.Number = issuer, billing.InvoiceNumber(issuer, *seq)
	inv.Replaces = replaces
	enc, err := inv.Encode()
	if err != nil {
		return nil, err
	}
	return append(out, enc), nil
}

// InvoiceView is the invoice of a tenant's statement in force, with the
// stored bytes of the document.
type InvoiceView struct {
	Invoice billing.Invoice
	Stored  billing.StoredInvoice
}

// ErrInvoiceNotIssued marks a closed statement whose invoice is not issued
// yet, read by a reader that may not issue it (IssuedInvoice).
var ErrInvoiceNotIssued = errors.New("invoice not issued yet")

// Invoice returns the invoice of tenant's statement of period in force,
// issuing it (under the close lock) when it has none yet: an admin's or
// finance reader's read. An open period is ErrNotClosed.
func (s *Service) Invoice(ctx context.Context, tenant, period string) (InvoiceView, error) {
	return s.invoice(ctx, tenant, period, true)
}

// IssuedInvoice is Invoice for a reader that may not issue (a tenant's
// key): it takes no lock and allocates no number, and a statement whose
// invoice is not issued yet is ErrInvoiceNotIssued (a close, a void or an
// admin's read issues it; the billing events sink waits for it).
func (s *Service) IssuedInvoice(ctx context.Context, tenant, period string) (InvoiceView, error) {
	return s.invoice(ctx, tenant, period, false)
}

func (s *Service) invoice(ctx context.Context, tenant, period string, issue bool) (InvoiceView, error) {
	p, err := s.tenantPeriod(tenant, period)
	if err != nil {
		return InvoiceView{}, err
	}
	for attempt := 0; ; attempt++ {
		st, ok, err := s.d.Store.Statement(ctx, tenant, p.Key)
		if err != nil {
			return InvoiceView{}, err
		}
		if !ok {
			return InvoiceView{}, fmt.Errorf("%w: %s is not closed for tenant %q: an open period has a draft statement, not an invoice", ErrNotClosed, p.Key, tenant)
		}
		docs, err := s.d.Store.Invoices(ctx, p.Key, tenant)
		if err != nil {
			return InvoiceView{}, err
		}
		if i := slices.IndexFunc(docs, func(d billing.StoredInvoice) bool { return d.Kind == billing.KindInvoice && d.Revision == st.Revision }); i >= 0 {
			inv, err := docs[i].Decode()
			return InvoiceView{Invoice: inv, Stored: docs[i]}, err
		}
		if !issue {
			return InvoiceView{}, fmt.Errorf("%w: %s's statement of %s (revision %d) is closed, its invoice is not issued yet: try again later", ErrInvoiceNotIssued, tenant, p.Key, st.Revision)
		}
		if attempt > 0 {
			return InvoiceView{}, fmt.Errorf("invoice of %s for %s: not found after issuing it", tenant, p.Key)
		}
		if err := s.ensureInvoice(ctx, tenant, p.Key); err != nil {
			return InvoiceView{}, err
		}
	}
}

// IssueInvoices issues, under the close lock, the invoices that the
// statements in force of sts' tenants and periods lack (a close that
// stored them and failed to issue, or stopped before): the billing events
// notifier calls it before it sends a statement without its invoice
// (notify.Notifier.IssueWith).
func (s *Service) IssueInvoices(ctx context.Context, sts []billing.StoredStatement) error {
	if len(sts) == 0 {
		return nil
	}
	unlock, err := s.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	seen := map[[2]string]bool{}
	var inForce []billing.StoredStatement
	for _, st := range sts {
		k := [2]string{st.Tenant, st.Period}
		if seen[k] {
			continue
		}
		seen[k] = true
		cur, ok, err := s.d.Store.Statement(ctx, st.Tenant, st.Period)
		if err != nil {
			return err
		}
		if ok {
			inForce = append(inForce, cur)
		}
	}
	return s.issueInvoices(ctx, inForce)
}

// ensureInvoice issues, under the close lock, the invoice of tenant's
// statement of period in force if it has none.
func (s *Service) ensureInvoice(ctx context.Context, tenant, period string) error {
	unlock, err := s.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	st, ok, err := s.d.Store.Statement(ctx, tenant, period)
	if err != nil || !ok {
		return err
	}
	return s.issueInvoices(ctx, []billing.StoredStatement{st})
}

// Documents returns the invoices and credit notes of tenant's statements
// of period, oldest first (every tenant's, by number, when tenant is
// empty).
func (s *Service) Documents(ctx context.Context, period, tenant string) ([]billing.StoredInvoice, error) {
	if _, err := billing.ParsePeriod(period, time.UTC); err != nil {
		return nil, err
	}
	if tenant != "" {
		if err := checkTenant(tenant); err != nil {
			return nil, err
		}
	}
	return s.d.Store.Invoices(ctx, period, tenant)
}

// InvoiceNumbers maps each tenant with a statement of period in force to
// the number of its invoice (FOCUS InvoiceId); tenants whose invoice is not
// issued yet are left out.
func (s *Service) InvoiceNumbers(ctx context.Context, period string) (map[string]string, error) {
	docs, err := s.d.Store.Invoices(ctx, period, "")
	if err != nil {
		return nil, err
	}
	inForce := map[string]int{}
	err = s.d.Store.EachStatement(ctx, period, "", func(st billing.StoredStatement) error {
		inForce[st.Tenant] = st.Revision
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, d := range docs {
		if rev, ok := inForce[d.Tenant]; ok && d.Kind == billing.KindInvoice && d.Revision == rev {
			if _, dup := out[d.Tenant]; !dup {
				out[d.Tenant] = d.Number
			}
		}
	}
	return out, nil
}

// StatementRevisions returns every revision of tenant's statement of
// period as stored, oldest first, each as the reader may see it (finance:
// the stored bytes; otherwise without the finance part).
func (s *Service) StatementRevisions(ctx context.Context, tenant, period string, finance bool) ([]StatementView, error) {
	if err := checkTenant(tenant); err != nil {
		return nil, err
	}
	if _, err := billing.ParsePeriod(period, time.UTC); err != nil {
		return nil, err
	}
	revs, err := s.d.Store.StatementRevisions(ctx, tenant, period)
	if err != nil {
		return nil, err
	}
	if len(revs) == 0 {
		return nil, fmt.Errorf("%w: %s is not closed for tenant %q", ErrNotClosed, period, tenant)
	}
	out := make([]StatementView, 0, len(revs))
	for _, r := range revs {
		v, err := viewOf(r, finance)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// VoidRequest voids a closed statement and reissues it.
type VoidRequest struct {
	Tenant, Period string
	// Hash is the hash of the revision to void, the one in force: a void
	// names what it voids, so a retry after a lost answer returns the first
	// void's documents instead of voiding the reissue.
	Hash string
	// Reason is printed on the credit note.
	Reason string
	// FlagUnpriced reissues a statement whose usage has a model without a
	// list price, flagging the unpriced requests, as CloseRequest's does;
	// without it such a void is refused (ErrUnpricedUsage) and changes
	// nothing.
	FlagUnpriced bool
}

// VoidResult is what a void issued.
type VoidResult struct {
	// Voided is the revision voided, as stored at its close (unchanged);
	// Reissued the new revision in force.
	Voided, Reissued billing.StoredStatement
	// CreditNote negates Voided's invoice; Invoice bills Reissued.
	CreditNote, Invoice billing.StoredInvoice
}

// Void voids tenant's statement of period (revision req.Hash, the one in
// force) and reissues it: a new revision computed as a close would compute
// it now (the price book, the tenant's zone and contract, and credits in
// force, counting back what the voided revision drew; those returns are
// written once the new revision is stored, RecordVoid), a credit note
// negating the voided revision's invoice and an invoice of the new
// revision, numbered in that order. Only the tenant's latest closed period may be voided
// (ErrLaterClosed).
func (s *Service) Void(ctx context.Context, req VoidRequest) (VoidResult, error) {
	if err := checkTenant(req.Tenant); err != nil {
		return VoidResult{}, err
	}
	req.Reason = strings.TrimSpace(req.Reason)
	if req.Reason == "" || req.Hash == "" {
		return VoidResult{}, fmt.Errorf("%w: a void needs the hash of the statement it voids and a reason (printed on the credit note)", ErrInvalidRequest)
	}
	p, err := billing.ParsePeriod(req.Period, s.Zone(req.Tenant))
	if err != nil {
		return VoidResult{}, err
	}
	unlock, err := s.lock(ctx)
	if err != nil {
		return VoidResult{}, err
	}
	defer unlock()
	cur, ok, err := s.d.Store.Statement(ctx, req.Tenant, p.Key)
	if err != nil {
		return VoidResult{}, err
	}
	if !ok {
		return VoidResult{}, fmt.Errorf("%w: %s is not closed for tenant %q: only a closed statement can be voided", ErrNotClosed, p.Key, req.Tenant)
	}
	if cur.Hash != req.Hash {
		return s.voided(ctx, cur, req)
	}
	var bill billing.Statement
	if err := json.Unmarshal(cur.Content, &bill); err != nil {
		return VoidResult{}, fmt.Errorf("statement of %s for %s: %w", req.Tenant, p.Key, err)
	}
	if !bill.PeriodStart.Equal(p.Start.UTC()) || !bill.PeriodEnd.Equal(p.End.UTC()) {
		return VoidResult{}, fmt.Errorf("%w: %s's %s was closed in zone %s, its zone is now %s: a reissue would bill another span", ErrZoneChanged, req.Tenant, p.Key, bill.Zone, p.Zone)
	}
	all, err := s.d.Store.TenantStatements(ctx, req.Tenant)
	if err != nil {
		return VoidResult{}, err
	}
	for _, o := range all {
		if o.Period > p.Key {
			return VoidResult{}, fmt.Errorf("%w: %s of tenant %s is closed after %s and may have billed its late usage: only a tenant's latest closed period can be voided",
				ErrLaterClosed, o.Period, req.Tenant, p.Key)
		}
	}
	// The voided revision's invoice first, so that the credit note has
	// something to negate.
	if err := s.issueInvoices(ctx, []billing.StoredStatement{cur}); err != nil {
		return VoidResult{}, err
	}
	book, err := s.d.Prices(ctx)
	if err != nil {
		return VoidResult{}, err
	}
	// Priced as a close prices the tenant: its zone and its contract.
	r := Request{Period: p.Key, Book: book, ByDeployment: s.cfg.ByDeployment, Lookback: s.cfg.Lookback,
		Tenants:      []Tenant{{ID: req.Tenant, Zone: p.Zone, Contract: s.cfg.Accounts.Tenant(req.Tenant).Contract}},
		FlagUnpriced: req.FlagUnpriced}
	if _, err := s.closer.reissue(ctx, cur, p, r, req.Reason, s.d.Store.SaveRevision); err != nil {
		return VoidResult{}, err
	}
	reissued, ok, err := s.d.Store.Statement(ctx, req.Tenant, p.Key)
	if err != nil || !ok {
		return VoidResult{}, fmt.Errorf("reissue of %s for %s: not found after storing it (%v)", req.Tenant, p.Key, err)
	}
	if err := s.issueInvoices(ctx, []billing.StoredStatement{reissued}); err != nil {
		return VoidResult{}, err
	}
	s.notify([]billing.StoredStatement{reissued})
	return s.voided(ctx, reissued, req)
}

// voided is the result of the void of revision req.Hash, which cur (the
// revision in force) must replace; else ErrConflict.
func (s *Service) voided(ctx context.Context, cur billing.StoredStatement, req VoidRequest) (VoidResult, error) {
	var bill billing.Statement
	if err := json.Unmarshal(cur.Content, &bill); err != nil {
		return VoidResult{}, fmt.Errorf("statement of %s for %s: %w", cur.Tenant, cur.Period, err)
	}
	if bill.Replaces != req.Hash {
		return VoidResult{}, fmt.Errorf("%w: %s's statement of %s in force is %s, not %s", ErrConflict, cur.Tenant, cur.Period, cur.Hash, req.Hash)
	}
	if err := s.issueInvoices(ctx, []billing.StoredStatement{cur}); err != nil { // a void interrupted before its documents
		return VoidResult{}, err
	}
	revs, err := s.d.Store.StatementRevisions(ctx, cur.Tenant, cur.Period)
	if err != nil {
		return VoidResult{}, err
	}
	docs, err := s.d.Store.Invoices(ctx, cur.Period, cur.Tenant)
	if err != nil {
		return VoidResult{}, err
	}
	out := VoidResult{Reissued: cur}
	for _, r := range revs {
		if r.Revision == cur.Revision-1 {
			out.Voided = r
		}
	}
	// A void interrupted after its revision was stored, before its ledger
	// was written.
	if s.d.Credits != nil && out.Voided.Hash == req.Hash {
		if err := RecordVoid(ctx, s.d.Credits, out.Voided, cur); err != nil {
			return VoidResult{}, err
		}
	}
	for _, d := range docs {
		switch {
		case d.Kind == billing.KindCreditNote && d.Revision == cur.Revision-1:
			out.CreditNote = d
		case d.Kind == billing.KindInvoice && d.Revision == cur.Revision:
			out.Invoice = d
		}
	}
	if out.Voided.Hash != req.Hash || out.CreditNote.Number == "" || out.Invoice.Number == "" {
		return VoidResult{}, fmt.Errorf("void of %s for %s: its documents are incomplete", cur.Tenant, cur.Period)
	}
	return out, nil
}

// reissue stores the next revision of cur, tenant's statement of p in
// force, computed with req as a close would compute it now, with save
// (InvoiceStore.SaveRevision). The new revision draws on the balances as
// they are once cur's draws and expiries are given back; those returns
// are written only after the new revision is stored, with its own ledger
// (RecordVoid), so a void that fails before leaves the ledger as it was:
// cur stays in force with its draws, nothing is given back.
func (c *Closer) reissue(ctx context.Context, cur billing.StoredStatement, p billing.Period, req Request, reason string,
	save func(context.Context, billing.Statement, time.Time) (billing.StoredStatement, error)) (billing.StoredStatement, error) {
	defer c.tenantLock(cur.Tenant)()
	at, err := c.store.ServerNow(ctx)
	if err != nil {
		return billing.StoredStatement{}, fmt.Errorf("reissue %s for %s: %w", p, cur.Tenant, err)
	}
	if req.firstClosed, _, err = c.store.FirstClosedPeriod(ctx); err != nil {
		return billing.StoredStatement{}, err
	}
	req.closing = true
	if c.credits != nil {
		if req.voiding, err = voidEntries(cur, nil, at); err != nil {
			return billing.StoredStatement{}, err
		}
	}
	st, _, err := c.statement(ctx, cur.Tenant, p, req, c.cost != nil)
	if err != nil {
		return billing.StoredStatement{}, fmt.Errorf("reissue %s for %s: %w", p, cur.Tenant, err)
	}
	if u := unpricedOf(&st); u != nil && !req.FlagUnpriced {
		return billing.StoredStatement{}, u
	}
	st.Revision, st.Replaces, st.VoidReason = cur.Revision+1, cur.Hash, reason
	if st.Hash, err = st.ContentHash(); err != nil {
		return billing.StoredStatement{}, err
	}
	stored, err := save(ctx, st, at)
	if err != nil {
		return stored, err
	}
	if c.credits != nil {
		err = RecordVoid(ctx, c.credits, cur, stored)
	}
	return stored, err
}
