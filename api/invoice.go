package api

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/billing"
	"tokenmeter/billing/closing"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// Invoices is the invoice side the InvoiceService serves; *closing.Service
// implements it. The service is offered when Services.Billing implements it.
type Invoices interface {
	Invoice(ctx context.Context, tenant, period string) (closing.InvoiceView, error)
	// IssuedInvoice is Invoice without issuing: a tenant key's read.
	IssuedInvoice(ctx context.Context, tenant, period string) (closing.InvoiceView, error)
	Documents(ctx context.Context, period, tenant string) ([]billing.StoredInvoice, error)
	StatementRevisions(ctx context.Context, tenant, period string, finance bool) ([]closing.StatementView, error)
	Void(ctx context.Context, req closing.VoidRequest) (closing.VoidResult, error)
}

var _ Invoices = (*closing.Service)(nil)

// invoicesOf is svc's billing backend as Invoices, or nil.
func invoicesOf(svc *Services) Invoices {
	inv, _ := svc.Billing.(Invoices)
	return inv
}

// invoiceService implements meterv1.InvoiceServiceServer. Access, beside
// methodRoles: a tenant key reads its own tenant's documents only
// (scopeTenant); its statement revisions come without the finance part
// unless the operator shows tenants their cost (seesCost). Only admin
// keys void, as only admin keys close: a void changes what a tenant is
// invoiced.
type invoiceService struct {
	meterv1.UnimplementedInvoiceServiceServer
	inv        Invoices
	tenantCost bool
}

func (s *invoiceService) GetInvoice(ctx context.Context, req *meterv1.GetInvoiceRequest) (*meterv1.GetInvoiceResponse, error) {
	if f := req.GetFormat(); f != "" && f != "json" && f != "html" {
		return nil, fmt.Errorf("%w: format %q: want json or html", closing.ErrInvalidRequest, f)
	}
	tenant, err := scopeTenant(ctx, req.GetTenantId())
	if err != nil {
		return nil, err
	}
	// A tenant's read never issues: issuing takes the close lock (the
	// Kafka lease across replicas) and a number, which a tenant's traffic
	// must not contend for; it sees issued invoices only. Admin and
	// finance reads issue an invoice a close left unissued.
	read := s.inv.Invoice
	if p, ok := principalFrom(ctx); ok && p.Role == RoleTenant {
		read = s.inv.IssuedInvoice
	}
	v, err := read(ctx, tenant, req.GetPeriod())
	if err != nil {
		return nil, err
	}
	return &meterv1.GetInvoiceResponse{Invoice: invoiceProto(v.Invoice, v.Stored.Hash)}, nil
}

func (s *invoiceService) ListInvoices(ctx context.Context, req *meterv1.ListInvoicesRequest) (*meterv1.ListInvoicesResponse, error) {
	tenant, err := scopeTenant(ctx, req.GetTenantId())
	if err != nil {
		return nil, err
	}
	if tenant == "" {
		return nil, fmt.Errorf("%w: tenant_id is required", closing.ErrInvalidRequest)
	}
	docs, err := s.inv.Documents(ctx, req.GetPeriod(), tenant)
	if err != nil {
		return nil, err
	}
	out := &meterv1.ListInvoicesResponse{Documents: make([]*meterv1.Invoice, 0, len(docs))}
	for _, d := range docs {
		inv, err := d.Decode()
		if err != nil {
			return nil, err
		}
		out.Documents = append(out.Documents, invoiceProto(inv, d.Hash))
	}
	return out, nil
}

func (s *invoiceService) ListStatementRevisions(ctx context.Context, req *meterv1.ListStatementRevisionsRequest) (*meterv1.ListStatementRevisionsResponse, error) {
	tenant, err := scopeTenant(ctx, req.GetTenantId())
	if err != nil {
		return nil, err
	}
	revs, err := s.inv.StatementRevisions(ctx, tenant, req.GetPeriod(), seesCost(ctx, s.tenantCost))
	if err != nil {
		return nil, err
	}
	out := &meterv1.ListStatementRevisionsResponse{}
	for i, v := range revs {
		out.Revisions = append(out.Revisions, revisionProto(v, i == len(revs)-1))
	}
	return out, nil
}

func (s *invoiceService) VoidStatement(ctx context.Context, req *meterv1.VoidStatementRequest) (*meterv1.VoidStatementResponse, error) {
	res, err := s.inv.Void(ctx, closing.VoidRequest{Tenant: req.GetTenantId(), Period: req.GetPeriod(), Hash: req.GetStatementHash(), Reason: req.GetReason()})
	if err != nil {
		return nil, err
	}
	cn, err := res.CreditNote.Decode()
	if err != nil {
		return nil, err
	}
	inv, err := res.Invoice.Decode()
	if err != nil {
		return nil, err
	}
	out := &meterv1.VoidStatementResponse{CreditNote: invoiceProto(cn, res.CreditNote.Hash), Invoice: invoiceProto(inv, res.Invoice.Hash)}
	for _, r := range []struct {
		st      billing.StoredStatement
		inForce bool
		to      **meterv1.StatementRevision
	}{{res.Voided, false, &out.Voided}, {res.Reissued, true, &out.Reissued}} {
		*r.to = &meterv1.StatementRevision{Revision: int32(r.st.Revision), Hash: r.st.Hash, ClosedAt: timestamppb.New(r.st.ClosedAt),
			InForce: r.inForce, Content: string(r.st.Content)}
	}
	return out, nil
}

// revisionProto is a statement revision as the API writes it.
func revisionProto(v closing.StatementView, inForce bool) *meterv1.StatementRevision {
	return &meterv1.StatementRevision{Revision: int32(v.Statement.Revision), Hash: v.Statement.Hash, ClosedAt: timestamppb.New(v.ClosedAt),
		InForce: inForce, Content: string(v.Content)}
}

// invoiceProto is inv as the API writes it; hash is its stored document's.
func invoiceProto(inv billing.Invoice, hash string) *meterv1.Invoice {
	m := func(x billing.Money) *meterv1.Money { return money(inv.Currency, int64(x)) }
	party := func(p billing.Party) *meterv1.Party {
		return &meterv1.Party{Name: p.Name, LegalName: p.LegalName, Address: p.Address, TaxId: p.TaxID, Email: p.Email}
	}
	ts := func(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t) }
	out := &meterv1.Invoice{
		Kind: string(inv.Kind), Number: inv.Number, Issuer: inv.Issuer, Seq: inv.Seq, TenantId: inv.Tenant, Period: inv.Period,
		Revision: int32(inv.Revision), StatementHash: inv.StatementHash, IssuedAt: ts(inv.IssuedAt), Zone: inv.Zone,
		IssueDate: inv.IssueDate, DueDate: inv.DueDate, PeriodStart: ts(inv.PeriodStart), PeriodEnd: ts(inv.PeriodEnd),
		Seller: party(inv.Seller), Buyer: party(inv.Buyer), BillingAccountId: inv.BillingAccountID, MinorDigits: int32(inv.MinorDigits),
		Subtotal: m(inv.Subtotal), TaxName: inv.TaxName, TaxRate: inv.TaxRate.String(), Tax: m(inv.Tax), Total: m(inv.Total),
		LineRounding: inv.LineRounding, TaxRounding: inv.TaxRounding, Credits: inv.Credits, Reason: inv.Reason, Replaces: inv.Replaces,
		DocumentHash: hash, Lines: make([]*meterv1.InvoiceLine, 0, len(inv.Lines)),
	}
	for _, l := range inv.Lines {
		out.Lines = append(out.Lines, &meterv1.InvoiceLine{Kind: l.Kind, Description: l.Description, Model: l.Model, Deployment: l.Deployment,
			OriginalPeriod: l.OriginalPeriod, Quantity: l.Quantity, Unit: l.Unit, UnitPrice: l.UnitPrice, Exact: m(l.Exact), Amount: m(l.Amount)})
	}
	return out
}
