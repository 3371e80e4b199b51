package api

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"tokenmeter/internal/ident"
)

// identParams are the names of the request fields that name identifiers:
// an event's identifier fields, and the lists of them. Whatever route
// carries one (a query parameter, a path variable or a body field over
// REST, a field over gRPC) holds it to ident.CheckParam: the identifier
// rule and the length limit of an event's identifiers.
var identParams = map[protoreflect.Name]bool{
	"event_id": true, "request_id": true, "tenant_id": true, "tenant_ids": true, "model": true, "model_version": true,
	"deployment": true, "engine": true, "gpu_type": true, "node": true, "region": true, "slo_class": true, "replica": true,
}

// checkParams checks the identifier fields of a request (identParams),
// and those of the messages it holds one of (a metrics selector). Lists of
// messages are not requests' parameters but data (a publish's events, each
// validated, and rejected, on its own) and are left alone, as are messages
// of other packages (a price book's document).
func checkParams(m protoreflect.Message) error {
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
		case fd.Kind() == protoreflect.StringKind && identParams[fd.Name()]:
			if fd.IsList() {
				l := v.List()
				for i := range l.Len() {
					if err = ident.CheckParam(fmt.Sprintf("%s[%d]", fd.Name(), i), l.Get(i).String()); err != nil {
						return false
					}
				}
			} else {
				err = ident.CheckParam(string(fd.Name()), v.String())
			}
		case fd.Kind() == protoreflect.MessageKind && !fd.IsList() && fd.Message().ParentFile().Package() == "tokenmeter.v1":
			err = checkParams(v.Message())
		}
		return err == nil
	})
	return err
}

// paramsInterceptor refuses a call whose request names a malformed or
// over-long identifier (checkParams) before its handler runs; the error
// wraps ident.ErrInvalid (InvalidArgument, 400).
func paramsInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if m, ok := req.(proto.Message); ok {
			if err := checkParams(m.ProtoReflect()); err != nil {
				return nil, err
			}
		}
		return handler(ctx, req)
	}
}

// paramsStreamInterceptor is paramsInterceptor for server streams: the
// request is checked as the handler receives it.
func paramsStreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return handler(srv, paramsStream{ss})
	}
}

// paramsStream checks each message it receives with checkParams.
type paramsStream struct{ grpc.ServerStream }

func (s paramsStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if msg, ok := m.(proto.Message); ok {
		return checkParams(msg.ProtoReflect())
	}
	return nil
}
