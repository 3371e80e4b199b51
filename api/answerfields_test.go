package api_test

import (
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc/encoding"
	encproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"tokenmeter/internal/adapter/devenv"
	"tokenmeter/internal/testkit/browsertest"
	"tokenmeter/internal/testkit/chtest"
)

// The answers' fields: every field of every response message of the API's
// services (tokenmeter.v1), followed through nested messages, must be set
// (non-zero, or present where the field has presence) in at least one
// answer that this package's tests get, so that a field the server forgets
// to fill (GET /v1/cost once dropped list_charge) fails the package rather
// than reaching a dashboard as 0.
//
// Every answer passes through the server's gRPC codec, REST ones included
// (the gateway calls the server in process), so TestMain replaces the
// "proto" codec with one that records, as it marshals a response message,
// which field paths are set. When the tests are done the paths never set
// fail the run, but for those in unfillable (with their reasons) and in
// notYetCovered (debt to pay).

// unfillable are the field paths no test can fill, each with its reason.
// Keep it short: a field that a test could fill belongs in a test.
var unfillable = map[string]string{
	// LatencyStats.max_p99 is the largest p99 among the steps: set on a
	// series' summary, never on its steps' points.
	"GetLatencyResponse.series.points.ttft.max_p99":              "summaries only",
	"GetLatencyResponse.series.points.itl.max_p99":               "summaries only",
	"GetLatencyResponse.series.points.e2e.max_p99":               "summaries only",
	"GetLatencyResponse.series.points.queue.max_p99":             "summaries only",
	"GetLatencyResponse.series.points.prefill.max_p99":           "summaries only",
	"GetLatencyResponse.series.points.decode.max_p99":            "summaries only",
	"GetLatencyResponse.series.points.e2e_short_output.max_p99":  "summaries only",
	"GetLatencyResponse.series.points.e2e_medium_output.max_p99": "summaries only",
	"GetLatencyResponse.series.points.e2e_long_output.max_p99":   "summaries only",
	// GetInvoice answers an invoice, never a credit note; a void answers
	// a credit note that replaces nothing and has no due date, an invoice
	// that credits nothing, and a voided revision, never in force.
	"GetInvoiceResponse.invoice.credits":         "invoices only",
	"GetInvoiceResponse.invoice.reason":          "invoices only",
	"VoidStatementResponse.credit_note.due_date": "credit notes have no due date",
	"VoidStatementResponse.credit_note.replaces": "credit notes replace nothing",
	"VoidStatementResponse.invoice.credits":      "invoices credit nothing",
	"VoidStatementResponse.invoice.reason":       "the reason is the credit note's",
	"VoidStatementResponse.voided.in_force":      "a voided revision is not in force",
}

// notYetCovered are field paths that a test could fill but none does yet:
// debt, not design. The check fails when one of them is filled (remove it
// here then), so that the list only shrinks.
var notYetCovered = map[string]string{
	"GetCapacityReportResponse.report.fleet.gpus_needed":                            capacityGap,
	"GetCapacityReportResponse.report.fleet.headroom":                               capacityGap,
	"GetCapacityReportResponse.report.fleet.headroom_known":                         capacityGap,
	"GetCapacityReportResponse.report.fleet.sustainable.hour":                       capacityGap,
	"GetCapacityReportResponse.report.fleet.sustainable.known":                      capacityGap,
	"GetCapacityReportResponse.report.fleet.sustainable.lower_bound":                capacityGap,
	"GetCapacityReportResponse.report.fleet.sustainable.missed_hours":               capacityGap,
	"GetCapacityReportResponse.report.fleet.sustainable.qualifying_hours":           capacityGap,
	"GetCapacityReportResponse.report.fleet.sustainable.saturated":                  capacityGap,
	"GetCapacityReportResponse.report.fleet.sustainable.supporting_hours":           capacityGap,
	"GetCapacityReportResponse.report.fleet.sustainable.tokens_per_second_per_gpu":  capacityGap,
	"GetCapacityReportResponse.report.others.gpus_needed":                           capacityGap,
	"GetCapacityReportResponse.report.others.headroom":                              capacityGap,
	"GetCapacityReportResponse.report.others.headroom_known":                        capacityGap,
	"GetCapacityReportResponse.report.others.peak.saturation":                       capacityGap,
	"GetCapacityReportResponse.report.others.sustainable.hour":                      capacityGap,
	"GetCapacityReportResponse.report.others.sustainable.known":                     capacityGap,
	"GetCapacityReportResponse.report.others.sustainable.lower_bound":               capacityGap,
	"GetCapacityReportResponse.report.others.sustainable.missed_hours":              capacityGap,
	"GetCapacityReportResponse.report.others.sustainable.qualifying_hours":          capacityGap,
	"GetCapacityReportResponse.report.others.sustainable.saturated":                 capacityGap,
	"GetCapacityReportResponse.report.others.sustainable.supporting_hours":          capacityGap,
	"GetCapacityReportResponse.report.others.sustainable.tokens_per_second_per_gpu": capacityGap,
	"GetCapacityReportResponse.report.others.hot_band.hours":                        capacityGap,
	"GetCapacityReportResponse.report.others.hot_band.requests":                     capacityGap,
	"GetCapacityReportResponse.report.others.hot_band.good_requests":                capacityGap,
	"GetCapacityReportResponse.report.others.hot_band.attainment":                   capacityGap,
	"GetCapacityReportResponse.report.others.trend.forecast":                        capacityGap,
	"GetCapacityReportResponse.report.others.trend.growth_known":                    capacityGap,
	"GetCapacityReportResponse.report.others.trend.peak_growth":                     capacityGap,
	"GetCapacityReportResponse.report.others.trend.tokens_growth":                   capacityGap,
	"GetCapacityReportResponse.report.others.trend.weeks":                           capacityGap,
	"GetCapacityReportResponse.report.target_tokens_per_second":                     capacityGap,
	"GetStatementResponse.statement.finance.idle_cost.nanos":                        statementGap,
	"GetStatementResponse.statement.finance.unassigned.nanos":                       statementGap,
	"GetStatementResponse.statement.lines.finance.idle_cost.nanos":                  statementGap,
	"GetStatementResponse.statement.lines.price_book":                               statementGap,
	"GetStatementResponse.statement.unpriced_requests":                              statementGap,
}

const (
	capacityGap  = "capacity report: no API test has a fleet with a sustainable load, an others unit or a target load yet (issue 30 item 3 reworks the report)"
	statementGap = "statements: billingtest has no adjustment, deployment split, shared idle, unassigned hour or unpriced model yet"
)

// fieldNode is one field path of a response message.
type fieldNode struct {
	path string
	// children are the fields of the field's message (of a map's message
	// values); nil for a scalar, a well-known type or a message already on
	// the path (a recursive type is followed once).
	children map[protoreflect.FieldNumber]*fieldNode
	set      bool
	done     bool // set, and every child done: nothing left to record below
}

// answerFields records the field paths set in the responses marshalled.
type answerFields struct {
	mu    sync.Mutex
	roots map[protoreflect.FullName]*fieldNode // by response message
}

// newAnswerFields describes the responses of the services of package pkg.
func newAnswerFields(files *protoregistry.Files, pkg protoreflect.FullName) *answerFields {
	a := &answerFields{roots: map[protoreflect.FullName]*fieldNode{}}
	files.RangeFilesByPackage(pkg, func(f protoreflect.FileDescriptor) bool {
		for i := range f.Services().Len() {
			methods := f.Services().Get(i).Methods()
			for j := range methods.Len() {
				out := methods.Get(j).Output()
				if _, ok := a.roots[out.FullName()]; !ok {
					a.roots[out.FullName()] = &fieldNode{path: string(out.Name()),
						children: fieldNodes(out, string(out.Name()), []protoreflect.FullName{out.FullName()})}
				}
			}
		}
		return true
	})
	return a
}

func fieldNodes(md protoreflect.MessageDescriptor, path string, onPath []protoreflect.FullName) map[protoreflect.FieldNumber]*fieldNode {
	nodes := map[protoreflect.FieldNumber]*fieldNode{}
	for i := range md.Fields().Len() {
		fd := md.Fields().Get(i)
		n := &fieldNode{path: path + "." + string(fd.Name())}
		if m := messageOfField(fd); m != nil && m.ParentFile().Package() != "google.protobuf" && !slices.Contains(onPath, m.FullName()) {
			n.children = fieldNodes(m, n.path, append(slices.Clip(onPath), m.FullName()))
		}
		nodes[fd.Number()] = n
	}
	return nodes
}

// messageOfField is the message a field holds: its own, its list's
// elements' or its map's values'; nil for scalars.
func messageOfField(fd protoreflect.FieldDescriptor) protoreflect.MessageDescriptor {
	if fd.IsMap() {
		return fd.MapValue().Message()
	}
	return fd.Message()
}

// record notes the fields set in m when m is a response message.
func (a *answerFields) record(m protoreflect.Message) {
	root, ok := a.roots[m.Descriptor().FullName()]
	if !ok {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	root.set = true
	root.walk(m)
}

// walk marks the fields set in m, a message of n's field.
func (n *fieldNode) walk(m protoreflect.Message) {
	if n.done {
		return
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		c, ok := n.children[fd.Number()]
		if !ok || c.done {
			return true
		}
		c.set = true // Range visits only the fields set
		switch {
		case c.children == nil:
		case fd.IsMap():
			v.Map().Range(func(_ protoreflect.MapKey, v protoreflect.Value) bool {
				c.walk(v.Message())
				return true
			})
		case fd.IsList():
			for i := range v.List().Len() {
				c.walk(v.List().Get(i).Message())
			}
		default:
			c.walk(v.Message())
		}
		c.finish()
		return true
	})
	n.finish()
}

func (n *fieldNode) finish() {
	n.done = n.set
	for _, c := range n.children {
		n.done = n.done && c.done
	}
}

// paths appends every path below n, n's own included, with whether it was
// set.
func (n *fieldNode) paths(paths map[string]bool) {
	paths[n.path] = n.set
	for _, c := range n.children {
		c.paths(paths)
	}
}

// problems are the paths never set but those allowed (a field's own
// fields are not listed when it was never set), and the allowed paths
// that name no field or that a test did set.
func (a *answerFields) problems(allowed ...map[string]string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	all := map[string]bool{}
	for _, r := range a.roots {
		r.paths(all)
	}
	isAllowed := func(p string) bool {
		for _, m := range allowed {
			if _, ok := m[p]; ok {
				return true
			}
		}
		return false
	}
	var out []string
	for p, set := range all {
		parent := p[:max(strings.LastIndexByte(p, '.'), 0)]
		if !set && !isAllowed(p) && (parent == "" || all[parent]) {
			out = append(out, "never set by a test: "+p)
		}
	}
	for _, m := range allowed {
		for p := range m {
			switch set, ok := all[p]; {
			case !ok:
				out = append(out, "allowed unset, but names no field of a response: "+p)
			case set:
				out = append(out, "allowed unset, yet a test set it (remove it from the list): "+p)
			}
		}
	}
	slices.Sort(out)
	return out
}

// recordingCodec is the proto codec, recording the response fields it
// marshals.
type recordingCodec struct {
	encoding.CodecV2
	fields *answerFields
}

func (c recordingCodec) Marshal(v any) (mem.BufferSlice, error) {
	if m, ok := v.(proto.Message); ok {
		c.fields.record(m.ProtoReflect())
	}
	return c.CodecV2.Marshal(v)
}

// recordAnswerFields installs the recording codec for the API's responses;
// TestMain calls it before any test runs.
func recordAnswerFields() *answerFields {
	a := newAnswerFields(protoregistry.GlobalFiles, "tokenmeter.v1")
	encoding.RegisterCodecV2(recordingCodec{CodecV2: encoding.GetCodecV2(encproto.Name), fields: a})
	return a
}

// check reports the problems on w after a run of the whole package and
// returns the exit status they make. A run of some tests (-run) is not
// checked; nor, but under CI=true, is a run where the tests that need
// ClickHouse or Chromium skipped.
func (a *answerFields) check(w io.Writer) int {
	if f := flag.Lookup("test.run"); f != nil && f.Value.String() != "" {
		return 0
	}
	problems := a.problems(unfillable, notYetCovered)
	if len(problems) == 0 {
		return 0
	}
	if os.Getenv("CI") != "true" {
		_, chErr := devenv.FindClickHouse()
		if os.Getenv(chtest.EnvAddr) != "" {
			chErr = nil
		}
		_, brErr := browsertest.Chromium()
		if chErr != nil || brErr != nil {
			fmt.Fprintf(w, "answer fields: not checked, tests skipped without ClickHouse or Chromium (%d fields unset)\n", len(problems))
			return 0
		}
	}
	fmt.Fprintf(w, "FAIL: answer fields: %d problems; every field of every response must be set by a test over real data (see answerfields_test.go):\n", len(problems))
	for _, p := range problems {
		fmt.Fprintf(w, "\t%s\n", p)
	}
	return 1
}
