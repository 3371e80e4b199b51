package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/billing"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/rollup"
)

// errInvalidDocument is an SLO set or price book that does not parse or validate.
var errInvalidDocument = errors.New("invalid document")

// AdminStore keeps the versioned SLO sets and price books; *chstore.Store
// implements it.
type AdminStore interface {
	CurrentSLO(ctx context.Context) (version uint32, rules string, ok bool, err error)
	PutSLO(ctx context.Context, rules, source string) (uint32, error)
	PriceBookStore
}

// adminService implements meterv1.AdminServiceServer.
type adminService struct {
	meterv1.UnimplementedAdminServiceServer
	store AdminStore
}

// toStruct turns a JSON document into a Struct.
func toStruct(doc []byte) (*structpb.Struct, error) {
	s := &structpb.Struct{}
	if err := protojson.Unmarshal(doc, s); err != nil {
		return nil, fmt.Errorf("stored document: %w", err)
	}
	return s, nil
}

// fromStruct turns a Struct back into JSON for the domain parsers.
func fromStruct(s *structpb.Struct) ([]byte, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: document is required", errInvalidDocument)
	}
	return json.Marshal(s.AsMap())
}

func (s *adminService) GetSloSet(ctx context.Context, _ *meterv1.GetSloSetRequest) (*meterv1.GetSloSetResponse, error) {
	v, rules, ok, err := s.store.CurrentSLO(ctx)
	if err != nil {
		return nil, err
	}
	if !ok {
		def, err := rollup.DefaultSLOSet().Canonical()
		if err != nil {
			return nil, err
		}
		rules = string(def)
	}
	doc, err := toStruct([]byte(rules))
	if err != nil {
		return nil, err
	}
	return &meterv1.GetSloSetResponse{Version: v, Document: doc}, nil
}

func (s *adminService) PutSloSet(ctx context.Context, req *meterv1.PutSloSetRequest) (*meterv1.PutSloSetResponse, error) {
	doc, err := fromStruct(req.GetDocument())
	if err != nil {
		return nil, err
	}
	set, err := rollup.ParseSLOSet(doc)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errInvalidDocument, err)
	}
	before, _, _, err := s.store.CurrentSLO(ctx)
	if err != nil {
		return nil, err
	}
	v, err := rollup.EnsureSLO(ctx, s.store, set, "api:"+principalName(ctx))
	if err != nil {
		return nil, err
	}
	return &meterv1.PutSloSetResponse{Version: v, Changed: v != before}, nil
}

func principalName(ctx context.Context) string {
	if p, ok := principalFrom(ctx); ok {
		return p.Name
	}
	return "unknown"
}

func (s *adminService) GetPriceBook(ctx context.Context, _ *meterv1.GetPriceBookRequest) (*meterv1.GetPriceBookResponse, error) {
	v, book, at, ok, err := s.store.CurrentPriceBook(ctx)
	if err != nil {
		return nil, err
	}
	if !ok {
		return &meterv1.GetPriceBookResponse{}, nil
	}
	doc, err := toStruct([]byte(book))
	if err != nil {
		return nil, err
	}
	return &meterv1.GetPriceBookResponse{Version: v, Document: doc, CreatedAt: timestamppb.New(at)}, nil
}

func (s *adminService) PutPriceBook(ctx context.Context, req *meterv1.PutPriceBookRequest) (*meterv1.PutPriceBookResponse, error) {
	doc, err := fromStruct(req.GetDocument())
	if err != nil {
		return nil, err
	}
	book, err := billing.ParsePriceBook(doc)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errInvalidDocument, err)
	}
	v, changed, err := billing.EnsurePriceBook(ctx, s.store, book, "api:"+principalName(ctx), time.Now())
	if err != nil {
		return nil, err
	}
	return &meterv1.PutPriceBookResponse{Version: v, Changed: changed}, nil
}
