package api

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/billing"
	"tokenmeter/billing/closing"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// Credits is the credit side the CreditService serves; *closing.Service
// implements it.
type Credits interface {
	CreateGrant(ctx context.Context, g billing.CreditGrant) (billing.CreditGrant, bool, error)
	CreditBalance(ctx context.Context, tenant string) ([]billing.GrantBalance, error)
	CreditLedger(ctx context.Context, tenant string) ([]billing.CreditEntry, error)
}

var _ Credits = (*closing.Service)(nil)

// creditsOf is the credit side of svc's billing backend; nil without one.
func creditsOf(svc *Services) Credits {
	c, _ := svc.Billing.(Credits)
	return c
}

// creditService implements meterv1.CreditServiceServer. Access, beside
// methodRoles: a tenant key reads its own tenant's balance and ledger only
// (scopeTenant); finance and admin keys read every tenant's. Only admin
// keys grant credit: a grant changes what tenants pay, as a close and a
// price book do.
type creditService struct {
	meterv1.UnimplementedCreditServiceServer
	c Credits
}

func (s *creditService) CreateCreditGrant(ctx context.Context, req *meterv1.CreateCreditGrantRequest) (*meterv1.CreateCreditGrantResponse, error) {
	amount, err := billing.ParseMoney(req.GetAmount())
	if err != nil {
		return nil, fmt.Errorf("%w: amount: %w", billing.ErrInvalidGrant, err)
	}
	g := billing.CreditGrant{ID: req.GetGrantId(), Tenant: req.GetTenantId(), Kind: billing.CreditKind(req.GetKind()), Amount: amount,
		Currency: req.GetCurrency(), Priority: req.GetPriority(), Description: req.GetDescription()}
	if t := req.GetEffectiveFrom(); t != nil {
		if err := t.CheckValid(); err != nil {
			return nil, fmt.Errorf("%w: effective_from: %w", billing.ErrInvalidGrant, err)
		}
		g.EffectiveFrom = t.AsTime()
	}
	if t := req.GetExpiresAt(); t != nil {
		if err := t.CheckValid(); err != nil {
			return nil, fmt.Errorf("%w: expires_at: %w", billing.ErrInvalidGrant, err)
		}
		g.ExpiresAt = t.AsTime()
	}
	if p, ok := principalFrom(ctx); ok {
		g.CreatedBy = p.Name
	}
	stored, created, err := s.c.CreateGrant(ctx, g)
	if err != nil {
		return nil, err
	}
	return &meterv1.CreateCreditGrantResponse{Grant: grantProto(stored), Created: created}, nil
}

func (s *creditService) GetCreditBalance(ctx context.Context, req *meterv1.GetCreditBalanceRequest) (*meterv1.GetCreditBalanceResponse, error) {
	tenant, err := scopeTenant(ctx, req.GetTenantId())
	if err != nil {
		return nil, err
	}
	balances, err := s.c.CreditBalance(ctx, tenant)
	if err != nil {
		return nil, err
	}
	resp := &meterv1.GetCreditBalanceResponse{Grants: make([]*meterv1.CreditBalance, 0, len(balances))}
	totals := map[[2]string]int{} // (tenant, currency) → index in resp.Totals
	for _, b := range balances {
		cur := b.Grant.Currency
		resp.Grants = append(resp.Grants, &meterv1.CreditBalance{Grant: grantProto(b.Grant),
			Drawn: money(cur, int64(b.Drawn)), Expired: money(cur, int64(b.Expired)), Remaining: money(cur, int64(b.Remaining))})
		k := [2]string{b.Grant.Tenant, cur}
		i, ok := totals[k]
		if !ok {
			i = len(resp.Totals)
			totals[k] = i
			resp.Totals = append(resp.Totals, &meterv1.CreditTotal{TenantId: b.Grant.Tenant, Remaining: money(cur, 0)})
		}
		sum := resp.Totals[i].Remaining.GetNanos() + int64(b.Remaining)
		resp.Totals[i].Remaining = money(cur, sum)
	}
	return resp, nil
}

func (s *creditService) ListCreditLedger(ctx context.Context, req *meterv1.ListCreditLedgerRequest) (*meterv1.ListCreditLedgerResponse, error) {
	tenant, err := scopeTenant(ctx, req.GetTenantId())
	if err != nil {
		return nil, err
	}
	entries, err := s.c.CreditLedger(ctx, tenant)
	if err != nil {
		return nil, err
	}
	// The ledger holds grant ids; the currency is the grant's.
	balances, err := s.c.CreditBalance(ctx, tenant)
	if err != nil {
		return nil, err
	}
	currency := map[string]string{}
	for _, b := range balances {
		currency[b.Grant.ID] = b.Grant.Currency
	}
	resp := &meterv1.ListCreditLedgerResponse{Entries: make([]*meterv1.CreditLedgerEntry, 0, len(entries))}
	for _, e := range entries {
		change := int64(e.Amount)
		if e.Kind == billing.LedgerDraw || e.Kind == billing.LedgerExpiry {
			change = -change
		}
		resp.Entries = append(resp.Entries, &meterv1.CreditLedgerEntry{EntryId: e.ID, TenantId: e.Tenant, GrantId: e.Grant, Kind: string(e.Kind),
			Change: money(currency[e.Grant], change), Period: e.Period, StatementHash: e.Statement, At: timestamppb.New(e.At)})
	}
	return resp, nil
}

// grantProto is g as the API writes it.
func grantProto(g billing.CreditGrant) *meterv1.CreditGrant {
	out := &meterv1.CreditGrant{GrantId: g.ID, TenantId: g.Tenant, Kind: string(g.Kind), Amount: money(g.Currency, int64(g.Amount)),
		EffectiveFrom: timestamppb.New(g.EffectiveFrom), Priority: g.Priority, Description: g.Description,
		CreatedAt: timestamppb.New(g.CreatedAt), CreatedBy: g.CreatedBy}
	if !g.ExpiresAt.IsZero() {
		out.ExpiresAt = timestamppb.New(g.ExpiresAt)
	}
	return out
}
