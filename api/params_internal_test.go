package api

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"

	"tokenmeter/internal/ident"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// TestCheckParamsEveryRoute: every identifier field of every request of
// every service (a new route's included), and of the messages a request
// holds, fails checkParams when one byte over ident.MaxLen; a publish's
// events are data, left to ingest's per-event validation.
func TestCheckParamsEveryRoute(t *testing.T) {
	var found []string
	protoregistry.GlobalFiles.RangeFilesByPackage("tokenmeter.v1", func(fd protoreflect.FileDescriptor) bool {
		for i := range fd.Services().Len() {
			methods := fd.Services().Get(i).Methods()
			for j := range methods.Len() {
				in := methods.Get(j).Input()
				walkIdentFields(in, nil, func(path []protoreflect.FieldDescriptor) {
					found = append(found, string(in.Name())+"."+fieldPath(path))
					m := dynamicpb.NewMessage(in)
					set(m, path, strings.Repeat("x", ident.MaxLen+1))
					if err := checkParams(m); !errors.Is(err, ident.ErrInvalid) {
						t.Errorf("%s.%s of %d bytes: checkParams = %v, want ident.ErrInvalid", in.Name(), fieldPath(path), ident.MaxLen+1, err)
					}
					m = dynamicpb.NewMessage(in)
					set(m, path, strings.Repeat("x", ident.MaxLen))
					if err := checkParams(m); err != nil {
						t.Errorf("%s.%s of %d bytes: checkParams = %v, want nil", in.Name(), fieldPath(path), ident.MaxLen, err)
					}
				})
			}
		}
		return true
	})
	for _, want := range []string{"GetUsageRequest.tenant_id", "GetLatencyRequest.selector.tenant_id", "GetCostRequest.tenant_id",
		"CloseBillingPeriodRequest.tenant_ids", "ExportUsageCostRequest.tenant_id", "GetCapacityReportRequest.deployment"} {
		if !slices.Contains(found, want) {
			t.Errorf("%s not among the identifier fields found: %v", want, found)
		}
	}
	// A publish's events are not parameters.
	ev := &meterv1.PublishEventsRequest{Events: []*meterv1.InferenceEvent{{TenantId: strings.Repeat("x", 1000)}}}
	if err := checkParams(ev.ProtoReflect()); err != nil {
		t.Errorf("checkParams of a publish: %v, want nil", err)
	}
}

// walkIdentFields calls fn with the path of each identifier field of md,
// through its singular message fields of this package, as checkParams goes.
func walkIdentFields(md protoreflect.MessageDescriptor, path []protoreflect.FieldDescriptor, fn func([]protoreflect.FieldDescriptor)) {
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		p := append(slices.Clone(path), fd)
		switch {
		case fd.IsMap():
		case fd.Kind() == protoreflect.StringKind && identParams[fd.Name()]:
			fn(p)
		case fd.Kind() == protoreflect.MessageKind && !fd.IsList() && fd.Message().ParentFile().Package() == "tokenmeter.v1" && len(path) < 4:
			walkIdentFields(fd.Message(), p, fn)
		}
	}
}

func set(m protoreflect.Message, path []protoreflect.FieldDescriptor, v string) {
	for _, fd := range path[:len(path)-1] {
		m = m.Mutable(fd).Message()
	}
	last := path[len(path)-1]
	if last.IsList() {
		l := m.Mutable(last).List()
		l.Append(protoreflect.ValueOfString("ok"))
		l.Append(protoreflect.ValueOfString(v))
		return
	}
	m.Set(last, protoreflect.ValueOfString(v))
}

func fieldPath(path []protoreflect.FieldDescriptor) string {
	var names []string
	for _, fd := range path {
		names = append(names, string(fd.Name()))
	}
	return strings.Join(names, ".")
}
