package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/billing"
	"tokenmeter/billing/closing"
	"tokenmeter/billing/export"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
)

// Billing is the billing side the BillingService serves; *closing.Service
// implements it.
type Billing interface {
	Periods(ctx context.Context, tenant string) ([]closing.PeriodState, error)
	Close(ctx context.Context, req closing.CloseRequest) ([]billing.StoredStatement, error)
	Statement(ctx context.Context, tenant, period string, finance bool) (closing.StatementView, error)
	EachStatement(ctx context.Context, period, tenant string, finance bool, fn func(closing.StatementView) error) error
	EachUsageCost(ctx context.Context, q closing.UsageCostQuery, fn func(*export.UsageCostRow) error) error
	// ExportOptions and StatementRows shape the export files: the
	// accounts' names, the rows' regions, a statement's rounding row.
	ExportOptions(finance bool) export.Options
	StatementRows(ctx context.Context, v closing.StatementView) ([]export.StatementRow, error)
	// Grace is the default grace delay of closes.
	Grace() time.Duration
}

var _ Billing = (*closing.Service)(nil)

// DefaultExportChunkBytes is the size of the chunks an export is streamed
// in: what the server holds of a file besides the encoder's own buffers.
const DefaultExportChunkBytes = 64 << 10

// billingService implements meterv1.BillingServiceServer.
//
// Access, beside methodRoles: a tenant key reads and exports its own
// tenant only (scopeTenant), and not the finance-only parts (allocated
// GPU cost, margin, cost per 1k tokens: what serving the tenant costs the
// provider is the provider's) unless the operator opts in (seesCost).
// Finance and admin keys read and export every tenant with them. Only
// admin keys close periods: a close is the one write of billing (it fixes
// what every tenant is invoiced, forever), so it sits with the role that
// also changes the price book, and finance, which reads everything, cannot
// change what it audits.
type billingService struct {
	meterv1.UnimplementedBillingServiceServer
	b     Billing
	chunk int
	// tenantCost is Config.TenantCost.
	tenantCost bool
}

// seesCost tells whether the caller may see the provider's cost of serving
// tenants: the allocated GPU cost (busy and idle), the cost per 1k tokens,
// the margin, the finance parts of statements and exports. It is the
// operator's: finance and admin keys see it, a tenant key only when the
// operator opts in (Config.TenantCost, meterd --tenant-cost). One rule for
// every route that has it (statements, exports, /v1/cost).
func seesCost(ctx context.Context, tenantCost bool) bool {
	p, ok := principalFrom(ctx)
	return ok && (p.Role == RoleFinance || p.Role == RoleAdmin || (p.Role == RoleTenant && tenantCost))
}

func (s *billingService) ListBillingPeriods(ctx context.Context, req *meterv1.ListBillingPeriodsRequest) (*meterv1.ListBillingPeriodsResponse, error) {
	tenant, err := scopeTenant(ctx, req.GetTenantId())
	if err != nil {
		return nil, err
	}
	periods, err := s.b.Periods(ctx, tenant)
	if err != nil {
		return nil, err
	}
	resp := &meterv1.ListBillingPeriodsResponse{Periods: make([]*meterv1.BillingPeriod, 0, len(periods))}
	for _, p := range periods {
		bp := &meterv1.BillingPeriod{TenantId: p.Tenant, Period: p.Period, Zone: p.Zone, Start: timestamppb.New(p.Start),
			End: timestamppb.New(p.End), Closed: p.Closed, ClosableAt: timestamppb.New(p.ClosableAt)}
		if p.Closed {
			bp.Hash, bp.ClosedAt, bp.Total = p.Hash, timestamppb.New(p.ClosedAt), money(p.Currency, int64(p.Total))
		}
		resp.Periods = append(resp.Periods, bp)
	}
	return resp, nil
}

func (s *billingService) CloseBillingPeriod(ctx context.Context, req *meterv1.CloseBillingPeriodRequest) (*meterv1.CloseBillingPeriodResponse, error) {
	cr := closing.CloseRequest{Period: req.GetPeriod(), Tenants: req.GetTenantIds(), Reprice: req.GetRepricePeriods(),
		FlagUnpriced: req.GetFlagUnpriced()}
	if g := req.GetGrace(); g != nil {
		if err := g.CheckValid(); err != nil {
			return nil, fmt.Errorf("%w: grace: %w", closing.ErrInvalidRequest, err)
		}
		d := g.AsDuration()
		cr.Grace = &d
	}
	stored, err := s.b.Close(ctx, cr)
	if err != nil {
		return nil, err
	}
	resp := &meterv1.CloseBillingPeriodResponse{Periods: make([]*meterv1.BillingPeriod, 0, len(stored))}
	for _, st := range stored {
		var b billing.Statement
		if err := json.Unmarshal(st.Content, &b); err != nil {
			return nil, fmt.Errorf("statement of %s for %s: %w", st.Tenant, st.Period, err)
		}
		resp.Periods = append(resp.Periods, &meterv1.BillingPeriod{TenantId: st.Tenant, Period: st.Period, Zone: b.Zone,
			Start: timestamppb.New(b.PeriodStart), End: timestamppb.New(b.PeriodEnd), Closed: true,
			ClosableAt: timestamppb.New(b.PeriodEnd.Add(s.b.Grace())), Hash: st.Hash, ClosedAt: timestamppb.New(st.ClosedAt),
			Total: money(b.Currency, int64(b.Total))})
	}
	return resp, nil
}

func (s *billingService) GetStatement(ctx context.Context, req *meterv1.GetStatementRequest) (*meterv1.GetStatementResponse, error) {
	tenant, err := scopeTenant(ctx, req.GetTenantId())
	if err != nil {
		return nil, err
	}
	v, err := s.b.Statement(ctx, tenant, req.GetPeriod(), seesCost(ctx, s.tenantCost))
	if err != nil {
		return nil, err
	}
	return &meterv1.GetStatementResponse{Statement: statementProto(v)}, nil
}

// statementProto is v as the API writes it.
func statementProto(v closing.StatementView) *meterv1.Statement {
	st := &v.Statement
	cur := st.Currency
	m := func(x billing.Money) *meterv1.Money { return money(cur, int64(x)) }
	out := &meterv1.Statement{
		TenantId: st.Tenant, Period: st.Period, Zone: st.Zone,
		PeriodStart: timestamppb.New(st.PeriodStart), PeriodEnd: timestamppb.New(st.PeriodEnd),
		Currency: cur, PriceBook: st.PriceBook, Charge: m(st.Charge), Total: m(st.Total), Rounding: st.Rounding,
		UnpricedRequests: st.UnpricedRequests, Hash: st.Hash, Closed: v.Closed,
		Lines: make([]*meterv1.StatementLine, 0, len(st.Lines)),
	}
	if v.Closed {
		out.ClosedAt = timestamppb.New(v.ClosedAt)
	}
	for _, l := range st.Lines {
		out.Lines = append(out.Lines, &meterv1.StatementLine{
			Kind: string(l.Kind), Model: l.Model, Deployment: l.Deployment, OriginalPeriod: l.OriginalPeriod,
			ChargeStart: timestamppb.New(l.ChargeStart), ChargeEnd: timestamppb.New(l.ChargeEnd),
			PriceId: l.PriceID, Priced: l.Priced, Requests: l.Requests,
			InputTokens: l.InputTokens, CachedInputTokens: l.CachedInputTokens, OutputTokens: l.OutputTokens,
			InputPer_1M: m(l.InputPer1M), CachedInputPer_1M: m(l.CachedInputPer1M), OutputPer_1M: m(l.OutputPer1M),
			Charge: m(l.Charge), PriceBook: l.PriceBook,
		})
		if l.ContractedCharge != nil && l.Discount != nil {
			out.Lines[len(out.Lines)-1].ContractedCharge = m(*l.ContractedCharge)
			out.Lines[len(out.Lines)-1].Discount = m(*l.Discount)
		}
	}
	for _, c := range st.Charges {
		out.Charges = append(out.Charges, &meterv1.StatementCharge{
			Kind: string(c.Kind), Description: c.Description, Line: int32(c.Line), Model: c.Model, Deployment: c.Deployment,
			TokenKind: c.TokenKind, Quantity: c.Quantity, Unit: c.Unit, UnitPrice: c.UnitPrice, Rule: c.Rule,
			ChargeStart: timestamppb.New(c.ChargeStart), ChargeEnd: timestamppb.New(c.ChargeEnd), Amount: m(c.Amount),
		})
	}
	for _, u := range st.Credits {
		sc := &meterv1.StatementCredit{GrantId: u.Grant, Kind: string(u.Kind), Description: u.Description,
			Opening: m(u.Opening), Drawn: m(u.Drawn), Expired: m(u.Expired), Closing: m(u.Closing)}
		if u.ExpiresAt != nil {
			sc.ExpiresAt = timestamppb.New(*u.ExpiresAt)
		}
		out.Credits = append(out.Credits, sc)
	}
	if f := st.Finance; f != nil {
		out.Finance = &meterv1.StatementFinance{
			BusyPolicy: f.BusyPolicy, IdlePolicy: f.IdlePolicy, HourRule: f.HourRule,
			AllocatedCost: m(f.AllocatedCost), BusyCost: m(f.BusyCost), IdleCost: m(f.IdleCost),
			UsageCharge: m(f.UsageCharge), Margin: m(f.Margin), Unassigned: m(f.Unassigned),
		}
		if f.CostPer1K != nil {
			out.Finance.CostPer_1KTokens = m(*f.CostPer1K)
		}
		if f.DedicatedCharge != 0 {
			out.Finance.DedicatedCharge = m(f.DedicatedCharge)
		}
		if f.CommitmentCharge != 0 {
			out.Finance.CommitmentCharge = m(f.CommitmentCharge)
		}
		for _, lc := range f.Lines {
			if lc.Line >= 0 && lc.Line < len(out.Lines) {
				out.Lines[lc.Line].Finance = &meterv1.StatementLineFinance{AllocatedCost: m(lc.AllocatedCost),
					BusyCost: m(lc.BusyCost), IdleCost: m(lc.IdleCost), Margin: m(lc.Margin)}
			}
		}
	}
	return out
}

// ExportStatements streams the statement lines of a closed period. The
// file is encoded as the rows are read and sent in chunks of s.chunk
// bytes; every check that can fail on the request (format, period, tenant,
// a period not closed) fails before the first chunk, so a client that got
// one got the start of a good file. A failure after it ends the stream
// with an error status (the REST handler then aborts the response).
func (s *billingService) ExportStatements(req *meterv1.ExportStatementsRequest, stream grpc.ServerStreamingServer[meterv1.ExportStatementsResponse]) error {
	ctx := stream.Context()
	tenant, err := scopeTenant(ctx, req.GetTenantId())
	if err != nil {
		return err
	}
	f, err := export.ParseFormat(req.GetFormat())
	if err != nil {
		return err
	}
	if _, err := billing.ParsePeriod(req.GetPeriod(), time.UTC); err != nil {
		return err
	}
	finance := seesCost(ctx, s.tenantCost)
	if err := sendFocusHeader(stream, f, s.b.ExportOptions(finance)); err != nil {
		return err
	}
	name := exportName("statements", req.GetPeriod(), tenant, f)
	var (
		hash string
		w    *export.Writer[export.StatementRow]
	)
	cw := newChunkWriter(s.chunk, func(data []byte, first bool) error {
		msg := &meterv1.ExportStatementsResponse{Data: data, Rows: w.Rows()}
		if first {
			msg.ContentType, msg.FileName, msg.StatementHash = f.ContentType(), name, hash
		}
		return stream.Send(msg)
	})
	err = s.b.EachStatement(ctx, req.GetPeriod(), tenant, finance, func(v closing.StatementView) error {
		if w == nil {
			if tenant != "" {
				hash = v.Statement.Hash
			}
			if w, err = export.NewStatementWriter(cw, f, s.b.ExportOptions(finance)); err != nil {
				return err
			}
		}
		rows, err := s.b.StatementRows(ctx, v)
		if err != nil {
			return err
		}
		for _, r := range rows {
			if err := w.Write(r); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if w == nil { // EachStatement reports a period without statements; this is a guard
		return fmt.Errorf("%w: %s has no statements", closing.ErrNotClosed, req.GetPeriod())
	}
	if err := w.Close(); err != nil {
		return err
	}
	return cw.Close()
}

// ExportUsageCost streams the detailed usage and cost of a range, as
// ExportStatements streams statements.
func (s *billingService) ExportUsageCost(req *meterv1.ExportUsageCostRequest, stream grpc.ServerStreamingServer[meterv1.ExportUsageCostResponse]) error {
	ctx := stream.Context()
	tenant, err := scopeTenant(ctx, req.GetTenantId())
	if err != nil {
		return err
	}
	f, err := export.ParseFormat(req.GetFormat())
	if err != nil {
		return err
	}
	if req.GetStart() == nil || req.GetEnd() == nil {
		return fmt.Errorf("%w: start and end are required", query.ErrInvalidQuery)
	}
	q := closing.UsageCostQuery{Tenant: tenant, Start: req.GetStart().AsTime(), End: req.GetEnd().AsTime(), Step: req.GetStep()}
	if q.Step == "" {
		q.Step = "hour"
	}
	finance := seesCost(ctx, s.tenantCost)
	if err := sendFocusHeader(stream, f, s.b.ExportOptions(finance)); err != nil {
		return err
	}
	name := exportName("usage-cost", q.Start.UTC().Format("20060102T15Z")+"-"+q.End.UTC().Format("20060102T15Z")+"-"+q.Step, tenant, f)
	var w *export.Writer[export.UsageCostRow]
	cw := newChunkWriter(s.chunk, func(data []byte, first bool) error {
		msg := &meterv1.ExportUsageCostResponse{Data: data, Rows: w.Rows()}
		if first {
			msg.ContentType, msg.FileName = f.ContentType(), name
		}
		return stream.Send(msg)
	})
	if w, err = export.NewUsageCostWriter(cw, f, s.b.ExportOptions(finance)); err != nil {
		return err
	}
	err = s.b.EachUsageCost(ctx, q, func(r *export.UsageCostRow) error {
		if f.IsFocus() && r.Tenant == billing.IdleTenant {
			// The provider's idle GPU cost is no one's charge: a FOCUS file
			// has no billing account for it (GetCost and the native formats
			// show it).
			return nil
		}
		return w.Write(*r)
	})
	if err != nil {
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}
	return cw.Close()
}

// The gRPC header metadata of a FOCUS export: the FOCUS metadata a CSV has
// no place for (a Parquet file carries it in its footer too). The REST
// export answers them as the headers X-Focus-Version, X-Focus-Schema-Id
// and X-Focus-Data-Generator.
const (
	focusVersionHeader   = "x-focus-version"
	focusSchemaIDHeader  = "x-focus-schema-id"
	focusGeneratorHeader = "x-focus-data-generator"
)

// sendFocusHeader sets the FOCUS metadata headers of an export in format f;
// none for the other formats.
func sendFocusHeader(stream grpc.ServerStream, f export.Format, opts export.Options) error {
	if !f.IsFocus() {
		return nil
	}
	md := export.FocusMetadataOf(opts)
	return stream.SetHeader(metadata.Pairs(focusVersionHeader, md.FocusVersion, focusSchemaIDHeader, md.SchemaID,
		focusGeneratorHeader, md.DataGenerator))
}

// exportName is the file name of an export: "statements-2026-11-acme.csv",
// "usage-cost-20261101T00Z-20261201T00Z-hour-focus.parquet".
func exportName(dataset, what, tenant string, f export.Format) string {
	parts := []string{dataset, what}
	if tenant != "" {
		parts = append(parts, tenant)
	}
	if f.IsFocus() {
		parts = append(parts, "focus")
	}
	return strings.Join(parts, "-") + f.Extension()
}

// chunkWriter cuts what an export writer writes into chunks of at most
// size bytes and sends each as soon as it is full; Close sends the rest,
// and always at least one chunk, which carries the file's name and type.
type chunkWriter struct {
	buf  []byte
	send func(data []byte, first bool) error
	sent bool
	err  error
}

func newChunkWriter(size int, send func(data []byte, first bool) error) *chunkWriter {
	if size <= 0 {
		size = DefaultExportChunkBytes
	}
	return &chunkWriter{buf: make([]byte, 0, size), send: send}
}

func (c *chunkWriter) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n := len(p)
	for len(p) > 0 {
		k := copy(c.buf[len(c.buf):cap(c.buf)], p)
		c.buf, p = c.buf[:len(c.buf)+k], p[k:]
		if len(c.buf) == cap(c.buf) {
			if err := c.flush(); err != nil {
				return n - len(p), err
			}
		}
	}
	return n, nil
}

// flush sends the buffer; the stream marshals the message before Send
// returns, so the buffer is free again after it.
func (c *chunkWriter) flush() error {
	c.err = c.send(c.buf, !c.sent)
	c.sent = true
	c.buf = c.buf[:0]
	return c.err
}

// Close sends what is buffered (an empty chunk when nothing was sent yet).
func (c *chunkWriter) Close() error {
	if c.err != nil {
		return c.err
	}
	if len(c.buf) > 0 || !c.sent {
		return c.flush()
	}
	return nil
}

var _ io.Writer = (*chunkWriter)(nil)
