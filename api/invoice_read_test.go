package api

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"tokenmeter/billing/closing"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// readsInvoices records which invoice read GetInvoice makes; neither
// finds an invoice issued.
type readsInvoices struct {
	Invoices
	issuing, issued int
}

func (r *readsInvoices) Invoice(context.Context, string, string) (closing.InvoiceView, error) {
	r.issuing++
	return closing.InvoiceView{}, nil
}

func (r *readsInvoices) IssuedInvoice(_ context.Context, tenant, period string) (closing.InvoiceView, error) {
	r.issued++
	return closing.InvoiceView{}, fmt.Errorf("%w: %s's %s", closing.ErrInvoiceNotIssued, tenant, period)
}

// TestTenantInvoiceReadNeverIssues: a tenant key's GetInvoice reads issued
// invoices only (an invoice not issued yet is FailedPrecondition, REST
// 409), never the read that issues under the close lock; admin and
// finance keys' reads issue.
func TestTenantInvoiceReadNeverIssues(t *testing.T) {
	inv := &readsInvoices{}
	s := &invoiceService{inv: inv}
	req := &meterv1.GetInvoiceRequest{TenantId: "acme", Period: "2026-10"}
	ctx := withPrincipal(t.Context(), Principal{Name: "acme-key", Role: RoleTenant, TenantID: "acme"})
	_, err := s.GetInvoice(ctx, req)
	if inv.issuing != 0 || inv.issued != 1 {
		t.Fatalf("tenant's read: %d issuing reads, %d issued-only reads; want 0 and 1", inv.issuing, inv.issued)
	}
	if st := status.Convert(toStatus(ctx, slog.New(slog.NewTextHandler(io.Discard, nil)), err)); st.Code() != codes.FailedPrecondition {
		t.Errorf("tenant's read of an invoice not issued: %v, want FailedPrecondition", st)
	}
	for _, role := range []Role{RoleAdmin, RoleFinance} {
		if _, err := s.GetInvoice(withPrincipal(t.Context(), Principal{Name: "k", Role: role}), req); err != nil {
			t.Fatal(err)
		}
	}
	if inv.issuing != 2 || inv.issued != 1 {
		t.Errorf("admin's and finance's reads: %d issuing reads, want 2", inv.issuing)
	}
}
