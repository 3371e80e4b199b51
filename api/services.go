package api

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"tokenmeter/query"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/billing"
	"tokenmeter/billing/closing"
	"tokenmeter/billing/export"
	"tokenmeter/ingest"
	"tokenmeter/internal/ident"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query/capacity"
)

// Publisher is the publish path the ingest service needs; *ingest.Publisher implements it.
type Publisher interface {
	Publish(ctx context.Context, events []*meterv1.InferenceEvent) (int, []ingest.Rejected, error)
}

// UsageReader answers usage queries; *query.Service implements it.
type UsageReader interface {
	Usage(ctx context.Context, q query.UsageQuery) ([]query.UsageRow, error)
}

var (
	_ Publisher   = (*ingest.Publisher)(nil)
	_ UsageReader = (*query.Service)(nil)
)

// methodRoles lists, per gRPC method, the roles allowed to call it. A method
// not listed is refused.
var methodRoles = map[string][]Role{
	meterv1.IngestService_PublishEvents_FullMethodName: {RoleIngest, RoleAdmin},
	meterv1.UsageService_GetUsage_FullMethodName:       {RoleTenant, RoleFinance, RoleAdmin},
	meterv1.MetricsService_GetLatency_FullMethodName:   {RoleTenant, RoleFinance, RoleAdmin},
	meterv1.MetricsService_GetGoodput_FullMethodName:   {RoleTenant, RoleFinance, RoleAdmin},
	meterv1.MetricsService_GetTraffic_FullMethodName:   {RoleTenant, RoleFinance, RoleAdmin},
	meterv1.CostService_GetCost_FullMethodName:         {RoleTenant, RoleFinance, RoleAdmin},
	meterv1.CostService_GetGpuUsage_FullMethodName:     {RoleFinance, RoleAdmin},
	meterv1.AdminService_GetSloSet_FullMethodName:      {RoleAdmin},
	meterv1.AdminService_PutSloSet_FullMethodName:      {RoleAdmin},
	meterv1.AdminService_GetPriceBook_FullMethodName:   {RoleFinance, RoleAdmin},
	meterv1.AdminService_PutPriceBook_FullMethodName:   {RoleAdmin},
	// Billing: a tenant key reads its own tenant without the finance
	// parts, finance and admin read everything; only admin closes (see
	// billingService).
	meterv1.BillingService_ListBillingPeriods_FullMethodName: {RoleTenant, RoleFinance, RoleAdmin},
	meterv1.BillingService_GetStatement_FullMethodName:       {RoleTenant, RoleFinance, RoleAdmin},
	meterv1.BillingService_ExportStatements_FullMethodName:   {RoleTenant, RoleFinance, RoleAdmin},
	meterv1.BillingService_ExportUsageCost_FullMethodName:    {RoleTenant, RoleFinance, RoleAdmin},
	meterv1.BillingService_CloseBillingPeriod_FullMethodName: {RoleAdmin},
	// Invoices: as statements; only admin voids (see invoiceService).
	meterv1.InvoiceService_GetInvoice_FullMethodName:             {RoleTenant, RoleFinance, RoleAdmin},
	meterv1.InvoiceService_ListInvoices_FullMethodName:           {RoleTenant, RoleFinance, RoleAdmin},
	meterv1.InvoiceService_ListStatementRevisions_FullMethodName: {RoleTenant, RoleFinance, RoleAdmin},
	meterv1.InvoiceService_VoidStatement_FullMethodName:          {RoleAdmin},
	// Credits: admin grants; a tenant key reads its own balance and
	// ledger, finance and admin every tenant's (see creditService).
	meterv1.CreditService_CreateCreditGrant_FullMethodName: {RoleAdmin},
	meterv1.CreditService_GetCreditBalance_FullMethodName:  {RoleTenant, RoleFinance, RoleAdmin},
	meterv1.CreditService_ListCreditLedger_FullMethodName:  {RoleTenant, RoleFinance, RoleAdmin},
	// The capacity report shows every deployment's GPUs and cost.
	meterv1.ReportService_GetCapacityReport_FullMethodName: {RoleFinance, RoleAdmin},
	// Engine stats are per deployment and replica, which serve every
	// tenant: not for tenant keys.
	meterv1.EngineService_GetEngineStats_FullMethodName: {RoleFinance, RoleAdmin},
}

// errTooLarge is a request beyond the batch length limit.
var errTooLarge = errors.New("request too large")

// batchTooLong is the error of a publish request of n events, over max.
func batchTooLong(n, max int) error {
	return fmt.Errorf("%w: batch has %d events, the limit is %d; split it", errTooLarge, n, max)
}

// authInterceptor authenticates every call and checks its role.
func authInterceptor(keys *Keys) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		p, err := keys.Authenticate(ctx)
		if err == nil {
			err = checkRole(p, info.FullMethod)
		}
		if err != nil {
			return nil, toStatus(ctx, nil, err)
		}
		return handler(withPrincipal(ctx, p), req)
	}
}

// authStreamInterceptor is authInterceptor for server streams: it
// authenticates the call, checks its role and gives the handler a stream
// whose context holds the principal.
func authStreamInterceptor(keys *Keys) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		p, err := keys.Authenticate(ss.Context())
		if err == nil {
			err = checkRole(p, info.FullMethod)
		}
		if err != nil {
			return toStatus(ss.Context(), nil, err)
		}
		return handler(srv, &principalStream{ServerStream: ss, ctx: withPrincipal(ss.Context(), p)})
	}
}

// principalStream is a server stream whose context holds the principal.
type principalStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *principalStream) Context() context.Context { return s.ctx }

// checkRole tells whether p's role may call the gRPC method fullMethod.
func checkRole(p Principal, fullMethod string) error {
	if !slices.Contains(methodRoles[fullMethod], p.Role) {
		return fmt.Errorf("%w: key %q (role %s) may not call %s", errPermissionDenied, p.Name, p.Role, fullMethod)
	}
	return nil
}

// authTap refuses a gRPC call whose key or role is wrong before its message
// is read, so that an unauthenticated client costs no decoding. The
// interceptor checks again and attaches the principal.
func authTap(keys *Keys) tap.ServerInHandle {
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		var value string
		if vals := info.Header.Get("authorization"); len(vals) > 0 {
			value = vals[0]
		}
		p, err := keys.authenticateHeader(value)
		if err == nil {
			err = checkRole(p, info.FullMethodName)
		}
		if err != nil {
			return nil, toStatus(ctx, nil, err)
		}
		return ctx, nil
	}
}

// errorInterceptor maps domain errors returned by handlers to status codes.
func errorInterceptor(logger *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if err != nil {
			return nil, toStatus(ctx, logger.With("method", info.FullMethod), err)
		}
		return resp, nil
	}
}

// errorStreamInterceptor is errorInterceptor for server streams. An error
// after the first message ends the stream with its status: the client then
// knows that what it received is incomplete.
func errorStreamInterceptor(logger *slog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := handler(srv, ss); err != nil {
			return toStatus(ss.Context(), logger.With("method", info.FullMethod), err)
		}
		return nil
	}
}

// toStatus is the one place that maps domain errors to gRPC status codes.
// Messages of our own domain errors are written for clients; anything else is
// logged and answered with a generic message, so backend errors never leak.
func toStatus(ctx context.Context, logger *slog.Logger, err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	var code codes.Code
	msg := err.Error()
	switch {
	case errors.Is(err, errUnauthenticated):
		code = codes.Unauthenticated
	case errors.Is(err, errPermissionDenied):
		code = codes.PermissionDenied
	case errors.Is(err, errTooLarge):
		code = codes.InvalidArgument
	case errors.Is(err, query.ErrInvalidQuery), errors.Is(err, errInvalidDocument), errors.Is(err, ident.ErrInvalid):
		code = codes.InvalidArgument
	case errors.Is(err, closing.ErrNotFound), errors.Is(err, capacity.ErrNotFound):
		code = codes.NotFound
	case errors.Is(err, closing.ErrInvalidRequest), errors.Is(err, billing.ErrInvalidPeriod), errors.Is(err, export.ErrUnknownFormat),
		errors.Is(err, billing.ErrInvalidGrant):
		code = codes.InvalidArgument
	case errors.Is(err, billing.ErrGrantConflict):
		// REST answers 409 Conflict.
		code = codes.AlreadyExists
	case errors.Is(err, closing.ErrCreditsOff):
		code = codes.Unimplemented
	case errors.Is(err, closing.ErrNotClosed), errors.Is(err, billing.ErrPeriodNotEnded), errors.Is(err, billing.ErrIngestBehind),
		errors.Is(err, closing.ErrRollupBehind), errors.Is(err, closing.ErrZoneChanged), errors.Is(err, closing.ErrLaterClosed),
		errors.Is(err, closing.ErrUnpricedUsage), errors.Is(err, closing.ErrInvoiceNotIssued):
		// The request is well formed but the period's state does not
		// allow it (yet): REST answers 409 Conflict (errorHandler).
		code = codes.FailedPrecondition
	case errors.Is(err, closing.ErrConflict):
		// A void of a statement revision no longer in force: REST 409.
		code = codes.Aborted
	case errors.Is(err, ingest.ErrUnavailable):
		code, msg = codes.Unavailable, "event log unavailable: nothing of this batch was accepted; retry later (retries are safe, events are deduplicated by event_id)"
	case errors.Is(err, query.ErrUnavailable):
		code, msg = codes.Unavailable, "usage store unavailable; retry later"
	case errors.Is(err, context.Canceled):
		code, msg = codes.Canceled, "request cancelled"
	case errors.Is(err, context.DeadlineExceeded):
		code, msg = codes.DeadlineExceeded, "deadline exceeded"
	default:
		code, msg = codes.Internal, "internal error"
	}
	if logger != nil && (code == codes.Internal || code == codes.Unavailable) {
		logger.ErrorContext(ctx, "request failed", "code", code.String(), "error", err)
	}
	return status.Error(code, msg)
}

// ingestService implements meterv1.IngestServiceServer.
type ingestService struct {
	meterv1.UnimplementedIngestServiceServer
	pub       Publisher
	maxEvents int
}

func (s *ingestService) PublishEvents(ctx context.Context, req *meterv1.PublishEventsRequest) (*meterv1.PublishEventsResponse, error) {
	if n := len(req.GetEvents()); n > s.maxEvents {
		return nil, batchTooLong(n, s.maxEvents)
	}
	events, index, foreign := ownEvents(ctx, req.GetEvents())
	var (
		accepted int
		rejected []ingest.Rejected
		err      error
	)
	if len(events) > 0 {
		if accepted, rejected, err = s.pub.Publish(ctx, events); err != nil {
			return nil, err
		}
	}
	resp := &meterv1.PublishEventsResponse{Accepted: int64(accepted), Rejected: foreign}
	for _, r := range rejected {
		i := r.Index
		if index != nil {
			i = index[i]
		}
		resp.Rejected = append(resp.Rejected, &meterv1.RejectedEvent{
			Index: int32(i), EventId: r.EventID, Reason: r.Err.Message,
		})
	}
	slices.SortFunc(resp.Rejected, func(a, b *meterv1.RejectedEvent) int { return cmp.Compare(a.Index, b.Index) })
	return resp, nil
}

// ownEvents keeps, for a key bound to a tenant, the events of that tenant:
// the others are rejected (as the OTLP receiver rejects such spans). index
// maps the kept events to their request positions (nil when all are kept).
func ownEvents(ctx context.Context, all []*meterv1.InferenceEvent) (kept []*meterv1.InferenceEvent, index []int, foreign []*meterv1.RejectedEvent) {
	p, ok := principalFrom(ctx)
	if !ok || p.TenantID == "" {
		return all, nil, nil
	}
	for i, e := range all {
		if e.GetTenantId() != p.TenantID {
			foreign = append(foreign, &meterv1.RejectedEvent{Index: int32(i), EventId: e.GetEventId(),
				Reason: fmt.Sprintf("tenant_id %q: key %q publishes for tenant %q only", e.GetTenantId(), p.Name, p.TenantID)})
			continue
		}
		kept = append(kept, e)
		index = append(index, i)
	}
	if len(foreign) == 0 {
		return all, nil, nil
	}
	return kept, index, foreign
}

// usageService implements meterv1.UsageServiceServer.
type usageService struct {
	meterv1.UnimplementedUsageServiceServer
	store UsageReader
}

// scopeTenant returns the tenant a query may read: a tenant key only its
// own, whatever it asked; other roles what they asked ("" for all).
func scopeTenant(ctx context.Context, asked string) (string, error) {
	p, ok := principalFrom(ctx)
	if !ok {
		return "", fmt.Errorf("%w: no principal", errUnauthenticated)
	}
	if err := ident.CheckParam("tenant_id", asked); err != nil {
		return "", fmt.Errorf("%w: %w", query.ErrInvalidQuery, err)
	}
	if p.Role != RoleTenant {
		return asked, nil
	}
	if asked != "" && asked != p.TenantID {
		return "", fmt.Errorf("%w: key %q may only read tenant %q, not %q", errPermissionDenied, p.Name, p.TenantID, asked)
	}
	return p.TenantID, nil
}

func (s *usageService) GetUsage(ctx context.Context, req *meterv1.GetUsageRequest) (*meterv1.GetUsageResponse, error) {
	tenant, err := scopeTenant(ctx, req.GetTenantId())
	if err != nil {
		return nil, err
	}
	q := query.UsageQuery{
		TenantID:    tenant,
		Granularity: req.GetGranularity(),
		GroupBy:     req.GetGroupBy(),
		TokenSizes:  true,
	}
	q.Start, q.End = timeOf(req.GetStart()), timeOf(req.GetEnd())
	rows, err := s.store.Usage(ctx, q)
	if err != nil {
		return nil, err
	}
	resp := &meterv1.GetUsageResponse{Buckets: make([]*meterv1.UsageBucket, 0, len(rows))}
	for _, r := range rows {
		var prompt, output *query.TokenStats
		if r.Sizes != nil {
			if prompt, err = query.TokenStatsOf(r.Sizes.Prompt, uint64(r.PromptTokens), uint64(r.Requests)); err != nil {
				return nil, err
			}
			if output, err = query.TokenStatsOf(r.Sizes.Output, uint64(r.OutputTokens), uint64(r.Requests)); err != nil {
				return nil, err
			}
		}
		resp.Buckets = append(resp.Buckets, &meterv1.UsageBucket{
			Start:                  timestamppb.New(r.Start),
			TenantId:               r.TenantID,
			Model:                  r.Model,
			Deployment:             r.Deployment,
			ModelVersion:           r.ModelVersion,
			Engine:                 r.Engine,
			TensorParallelism:      r.TensorParallelism,
			Requests:               r.Requests,
			Errors:                 r.Errors,
			PromptTokens:           r.PromptTokens,
			CachedPromptTokens:     r.CachedPromptTokens,
			OutputTokens:           r.OutputTokens,
			PromptTokensPerRequest: tokenStats(prompt),
			OutputTokensPerRequest: tokenStats(output),
		})
	}
	return resp, nil
}
