package api

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// openAPIOps is what these tests read of the OpenAPI document: per
// "METHOD /path", the operation.
type openAPIOp struct {
	OperationID string `json:"operationId"`
	Summary     string `json:"summary"`
	Description string `json:"description"`
	Parameters  []struct {
		Name string `json:"name"`
		In   string `json:"in"`
	} `json:"parameters"`
}

func openAPIOps(t *testing.T) map[string]openAPIOp {
	t.Helper()
	var doc struct {
		Paths map[string]map[string]openAPIOp `json:"paths"`
	}
	if err := json.Unmarshal(meterv1.OpenAPI(), &doc); err != nil {
		t.Fatal(err)
	}
	ops := map[string]openAPIOp{}
	for path, byMethod := range doc.Paths {
		for method, op := range byMethod {
			ops[strings.ToUpper(method)+" "+path] = op
		}
	}
	return ops
}

// gatewayRoutes reads the routes the generated gateway code registers
// (proto/tokenmeter/v1/*.pb.gw.go): every mux.Handle(method, pattern_X, …)
// with pattern_X's runtime.NewPattern arguments, rebuilt as the gateway
// builds them, as "METHOD /path/{var}:verb".
func gatewayRoutes(t *testing.T) map[string]bool {
	t.Helper()
	files, err := filepath.Glob("../proto/tokenmeter/v1/*.pb.gw.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no generated gateway files (%v)", err)
	}
	patterns := map[string]runtime.Pattern{}
	handled := map[string]string{} // pattern variable -> HTTP method
	fset := token.NewFileSet()
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.ValueSpec:
				// pattern_X = runtime.MustPattern(runtime.NewPattern(1, []int{…}, []string{…}, "verb"))
				for i, name := range n.Names {
					if !strings.HasPrefix(name.Name, "pattern_") || i >= len(n.Values) {
						continue
					}
					version, ops, pool, verb, err := patternArgs(n.Values[i])
					if err != nil {
						t.Fatalf("%s: %v", name.Name, err)
					}
					p, err := runtime.NewPattern(version, ops, pool, verb)
					if err != nil {
						t.Fatalf("%s: %v", name.Name, err)
					}
					patterns[name.Name] = p
				}
			case *ast.CallExpr:
				// mux.Handle(http.MethodGet, pattern_X, …)
				sel, ok := n.Fun.(*ast.SelectorExpr)
				if !ok || sel.Sel.Name != "Handle" || len(n.Args) != 3 {
					return true
				}
				method, ok1 := n.Args[0].(*ast.SelectorExpr)
				pat, ok2 := n.Args[1].(*ast.Ident)
				if ok1 && ok2 {
					handled[pat.Name] = strings.ToUpper(strings.TrimPrefix(method.Sel.Name, "Method"))
				}
			}
			return true
		})
	}
	routes := map[string]bool{}
	for name, method := range handled {
		p, ok := patterns[name]
		if !ok {
			t.Fatalf("%s is handled but not defined", name)
		}
		// The gateway writes a variable "{period=*}"; the document "{period}".
		routes[method+" "+strings.ReplaceAll(p.String(), "=*}", "}")] = true
	}
	return routes
}

// TestOpenAPIMatchesGateway checks the document against what the server
// serves: the routes the generated gateway code registers are exactly the
// document's paths; every query parameter the document lists is one the
// HTTP guard accepts, and every one it accepts (but the aliases) is
// listed; each operation's "Roles:" line is the roles the server admits.
func TestOpenAPIMatchesGateway(t *testing.T) {
	ops := openAPIOps(t)
	served := gatewayRoutes(t)
	if len(served) == 0 {
		t.Fatal("found no gateway routes")
	}
	for r := range served {
		if _, ok := ops[r]; !ok {
			t.Errorf("the gateway serves %s, which the OpenAPI document lacks", r)
		}
	}
	for r := range ops {
		if !served[r] {
			t.Errorf("the OpenAPI document has %s, which the gateway does not serve", r)
		}
	}
	// The handlers that replace generated ones serve routes of the document.
	for _, r := range []string{"POST /v1/events", "GET " + statementsExportPath, "GET " + usageCostExportPath, "GET " + capacityReportPath} {
		if _, ok := ops[r]; !ok {
			t.Errorf("meterd's own handler of %s is not in the OpenAPI document", r)
		}
	}

	guard, err := newHTTPGuard(&Keys{}, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	for key, op := range ops {
		method, path, _ := strings.Cut(key, " ")
		route, ok := guard.routes[method+" "+patternKey(path)]
		if !ok {
			t.Errorf("%s: not a route of the HTTP guard (api.yaml)", key)
			continue
		}
		var listed, inPath []string
		for _, p := range op.Parameters {
			if p.In == "path" {
				inPath = append(inPath, p.Name)
			}
			if p.In != "query" {
				continue
			}
			listed = append(listed, p.Name)
			if _, ok := route.params[p.Name]; !ok {
				t.Errorf("%s: the document lists query parameter %q, which the server refuses", key, p.Name)
			}
		}
		slices.Sort(listed)
		// The guard's names are the fields the body does not fill, those
		// of the path among them.
		takes := slices.DeleteFunc(slices.Clone(route.names), func(n string) bool { return slices.Contains(inPath, n) })
		if !slices.Equal(listed, takes) {
			t.Errorf("%s: the document lists query parameters %v, the server takes %v", key, listed, takes)
		}

		// operationId is Service_Method.
		svc, m, _ := strings.Cut(op.OperationID, "_")
		roles, ok := methodRoles["/tokenmeter.v1."+svc+"/"+m]
		if !ok {
			t.Errorf("%s: operation %s has no roles in methodRoles", key, op.OperationID)
			continue
		}
		var want []string
		for _, r := range roles {
			want = append(want, string(r))
		}
		line := "Roles: " + strings.Join(want, ", ") + "."
		if !strings.Contains(op.Summary+"\n"+op.Description, line) {
			t.Errorf("%s: the description does not say %q:\n%s\n%s", key, line, op.Summary, op.Description)
		}
	}
}

// TestOpenAPIDocumentOfOfferedServices: a server offering some services
// serves a document of their paths only; with all, the generated one.
func TestOpenAPIDocumentOfOfferedServices(t *testing.T) {
	all := map[string]bool{}
	for key := range methodRoles {
		svc, _, _ := strings.Cut(strings.TrimPrefix(key, "/"), "/")
		all[svc] = true
	}
	doc, err := openAPIDocument(all)
	if err != nil {
		t.Fatal(err)
	}
	if string(doc) != string(meterv1.OpenAPI()) {
		t.Error("with every service offered the document is not the generated one")
	}
	doc, err = openAPIDocument(map[string]bool{"tokenmeter.v1.IngestService": true, "tokenmeter.v1.UsageService": true})
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Paths map[string]any `json:"paths"`
		Tags  []struct {
			Name string `json:"name"`
		} `json:"tags"`
	}
	if err := json.Unmarshal(doc, &got); err != nil {
		t.Fatal(err)
	}
	var paths, tags []string
	for p := range got.Paths {
		paths = append(paths, p)
	}
	for _, tag := range got.Tags {
		tags = append(tags, tag.Name)
	}
	slices.Sort(paths)
	slices.Sort(tags)
	if !slices.Equal(paths, []string{"/v1/events", "/v1/usage"}) || !slices.Equal(tags, []string{"IngestService", "UsageService"}) {
		t.Errorf("ingest and usage only: paths %v, tags %v", paths, tags)
	}
}

// patternArgs reads the literal arguments of
// runtime.MustPattern(runtime.NewPattern(version, ops, pool, verb)).
func patternArgs(e ast.Expr) (version int, ops []int, pool []string, verb string, err error) {
	unexpected := fmt.Errorf("not runtime.MustPattern(runtime.NewPattern(int, []int{...}, []string{...}, string))")
	must, ok := e.(*ast.CallExpr)
	if !ok || len(must.Args) != 1 {
		return 0, nil, nil, "", unexpected
	}
	np, ok := must.Args[0].(*ast.CallExpr)
	if !ok || len(np.Args) != 4 {
		return 0, nil, nil, "", unexpected
	}
	lit := func(e ast.Expr) (string, bool) {
		b, ok := e.(*ast.BasicLit)
		if !ok {
			return "", false
		}
		return b.Value, true
	}
	elts := func(e ast.Expr) ([]string, bool) {
		c, ok := e.(*ast.CompositeLit)
		if !ok {
			return nil, false
		}
		var out []string
		for _, el := range c.Elts {
			v, ok := lit(el)
			if !ok {
				return nil, false
			}
			out = append(out, v)
		}
		return out, true
	}
	v, ok1 := lit(np.Args[0])
	opLits, ok2 := elts(np.Args[1])
	poolLits, ok3 := elts(np.Args[2])
	verbLit, ok4 := lit(np.Args[3])
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return 0, nil, nil, "", unexpected
	}
	if version, err = strconv.Atoi(v); err != nil {
		return 0, nil, nil, "", err
	}
	for _, o := range opLits {
		n, err := strconv.Atoi(o)
		if err != nil {
			return 0, nil, nil, "", err
		}
		ops = append(ops, n)
	}
	for _, p := range poolLits {
		s, err := strconv.Unquote(p)
		if err != nil {
			return 0, nil, nil, "", err
		}
		pool = append(pool, s)
	}
	if verb, err = strconv.Unquote(verbLit); err != nil {
		return 0, nil, nil, "", err
	}
	return version, ops, pool, verb, nil
}
