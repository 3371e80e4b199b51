package main

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/testing/protocmp"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
)

// usageAnswer is a GetUsageResponse as grpc-gateway writes it: int64 as
// strings, zero values left out.
const usageAnswer = `{"buckets":[
 {"start":"2026-11-21T00:00:00Z","tenantId":"acme","model":"llama-3.1-70b-instruct","requests":"120345","errors":"3611","promptTokens":"144414000","cachedPromptTokens":"52000000","outputTokens":"33696600"},
 {"start":"2026-11-21T00:00:00Z","tenantId":"globex","model":"llama-3.1-8b-instruct","requests":"52","promptTokens":"36400","outputTokens":"8320"},
 {"start":"2026-11-22T00:00:00Z","tenantId":"acme","model":"llama-3.1-70b-instruct","requests":"7","errors":"1","promptTokens":"8400","cachedPromptTokens":"16","outputTokens":"1960"}
]}`

func TestUsageTable(t *testing.T) {
	f := &fakeAPI{usage: usageAnswer}
	srv := newFakeAPI(t, f)
	out, _, err := runArgs(t, nil, "usage", "--addr", srv.URL, "--key", testKey,
		"--start", "2026-11-21T00:00:00Z", "--end", "2026-11-23T00:00:00Z",
		"--granularity", "day", "--group-by", "tenant_id, model", "--tenant", "acme")
	if err != nil {
		t.Fatalf("usage: %v", err)
	}
	want := `BUCKET START          TENANT  MODEL                   REQUESTS  ERRORS     PROMPT    CACHED    OUTPUT
2026-11-21T00:00:00Z  acme    llama-3.1-70b-instruct    120345    3611  144414000  52000000  33696600
2026-11-21T00:00:00Z  globex  llama-3.1-8b-instruct         52       0      36400         0      8320
2026-11-22T00:00:00Z  acme    llama-3.1-70b-instruct         7       1       8400        16      1960
TOTAL                                                   120404    3612  144458800  52000016  33706880
`
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("table (-want +got):\n%s", diff)
	}
	f.mu.Lock()
	q := f.usageQuery
	f.mu.Unlock()
	wantQuery := map[string][]string{
		"start": {"2026-11-21T00:00:00Z"}, "end": {"2026-11-23T00:00:00Z"}, "granularity": {"day"},
		"group_by": {"tenant_id", "model"}, "tenant_id": {"acme"},
	}
	if diff := cmp.Diff(wantQuery, q); diff != "" {
		t.Errorf("query (-want +got):\n%s", diff)
	}
}

// A dimension named twice in --group-by is one column and one parameter,
// as in the series commands.
func TestUsageGroupByRepeat(t *testing.T) {
	f := &fakeAPI{usage: usageAnswer}
	srv := newFakeAPI(t, f)
	out, _, err := runArgs(t, nil, "usage", "--addr", srv.URL, "--key", testKey,
		"--group-by", "tenant_id,model,tenant_id", "--output", "csv")
	if err != nil {
		t.Fatalf("usage: %v", err)
	}
	if got, want := strings.SplitN(out, "\n", 2)[0], "bucket_start,tenant_id,model,requests,errors,prompt_tokens,cached_prompt_tokens,output_tokens"; got != want {
		t.Errorf("CSV header: got %q, want %q", got, want)
	}
	f.mu.Lock()
	q := f.usageQuery
	f.mu.Unlock()
	if diff := cmp.Diff([]string{"tenant_id", "model"}, q["group_by"]); diff != "" {
		t.Errorf("group_by (-want +got):\n%s", diff)
	}
}

func TestUsageCSV(t *testing.T) {
	srv := newFakeAPI(t, &fakeAPI{usage: usageAnswer})
	out, _, err := runArgs(t, map[string]string{"METER_ADDR": srv.URL, "METER_API_KEY": testKey},
		"usage", "--group-by", "tenant_id,model", "--output", "csv")
	if err != nil {
		t.Fatalf("usage: %v", err)
	}
	want := `bucket_start,tenant_id,model,requests,errors,prompt_tokens,cached_prompt_tokens,output_tokens
2026-11-21T00:00:00Z,acme,llama-3.1-70b-instruct,120345,3611,144414000,52000000,33696600
2026-11-21T00:00:00Z,globex,llama-3.1-8b-instruct,52,0,36400,0,8320
2026-11-22T00:00:00Z,acme,llama-3.1-70b-instruct,7,1,8400,16,1960
`
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("CSV (-want +got):\n%s", diff)
	}
}

func TestUsageJSON(t *testing.T) {
	srv := newFakeAPI(t, &fakeAPI{usage: usageAnswer})
	out, _, err := runArgs(t, nil, "usage", "--addr", srv.URL, "--key", testKey, "--output", "json")
	if err != nil {
		t.Fatalf("usage: %v", err)
	}
	if !json.Valid([]byte(out)) {
		t.Fatalf("output is not JSON:\n%s", out)
	}
	var got, want meterv1.GetUsageResponse
	if err := protojson.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if err := protojson.Unmarshal([]byte(usageAnswer), &want); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(&want, &got, protocmp.Transform()); diff != "" {
		t.Errorf("JSON output differs from the API's answer (-want +got):\n%s", diff)
	}
}

func TestUsageDefaultsAndEmpty(t *testing.T) {
	f := &fakeAPI{usage: `{"buckets":[]}`}
	srv := newFakeAPI(t, f)
	out, _, err := runArgs(t, nil, "usage", "--addr", srv.URL, "--key", testKey)
	if err != nil {
		t.Fatalf("usage: %v", err)
	}
	if out == "" {
		t.Error("no output for an empty answer")
	}
	f.mu.Lock()
	q := f.usageQuery
	f.mu.Unlock()
	start, err1 := time.Parse(time.RFC3339, q["start"][0])
	end, err2 := time.Parse(time.RFC3339, q["end"][0])
	if err := errors.Join(err1, err2); err != nil {
		t.Fatalf("query %v: %v", q, err)
	}
	if end.Sub(start) != 24*time.Hour || time.Since(end) > time.Minute {
		t.Errorf("default window [%s, %s), want the last 24h", start, end)
	}
	if g := q["granularity"]; len(g) != 1 || g[0] != "total" {
		t.Errorf("granularity %v, want total", g)
	}
	if _, ok := q["group_by"]; ok {
		t.Errorf("group_by %v sent, want none by default", q["group_by"])
	}
}

func TestUsageErrors(t *testing.T) {
	srv := newFakeAPI(t, &fakeAPI{})
	_, _, err := runArgs(t, nil, "usage", "--addr", srv.URL, "--key", "tm_wrong")
	var ae *apiError
	if !errors.As(err, &ae) || ae.Status != http.StatusUnauthorized {
		t.Errorf("error %v, want a 401 API error", err)
	}
	for name, args := range map[string][]string{
		"end before start": {"--start", "2026-11-22T00:00:00Z", "--end", "2026-11-21T00:00:00Z"},
		"not RFC 3339":     {"--start", "yesterday"},
		"granularity":      {"--granularity", "week"},
		"group by":         {"--group-by", "region"},
		"output":           {"--output", "xml"},
	} {
		if _, _, err := runArgs(t, nil, append([]string{"usage", "--validate", "--key", "k"}, args...)...); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// Times take RFC 3339 or a plain date, and a bad one is explained with an
// example instead of Go's layout string.
func TestTimeFlags(t *testing.T) {
	for _, cmd := range []string{"usage", "latency", "cost"} {
		if _, _, err := runArgs(t, nil, cmd, "--validate", "--key", "k", "--start", "2026-11-20", "--end", "2026-11-23"); err != nil {
			t.Errorf("%s with plain dates: %v", cmd, err)
		}
		_, _, err := runArgs(t, nil, cmd, "--validate", "--key", "k", "--start", "2026-11-23T10:00")
		if err == nil || strings.Contains(err.Error(), "2006") || !strings.Contains(err.Error(), "2026-11-23T00:00:00Z") {
			t.Errorf("%s --start 2026-11-23T10:00: got %v, want an example of RFC 3339 and no Go layout", cmd, err)
		}
	}
}

// The serving dimensions: their columns (ENGINE, TP, VERSION), the CSV's
// and the group-by list the server accepts (query.UsageGroupFields, which
// meterctl does not link: TestUsageServerLists).
func TestUsageServingDimensions(t *testing.T) {
	const answer = `{"buckets":[
 {"start":"2026-11-21T00:00:00Z","modelVersion":"v2","engine":"sglang+vllm","tensorParallelism":"2+4","requests":"10","promptTokens":"100","outputTokens":"20"},
 {"start":"2026-11-21T00:00:00Z","modelVersion":"v2","engine":"vllm","tensorParallelism":"2","requests":"3","errors":"1","promptTokens":"30","cachedPromptTokens":"5","outputTokens":"6"}
]}`
	f := &fakeAPI{usage: answer}
	srv := newFakeAPI(t, f)
	sel := []string{"usage", "--addr", srv.URL, "--key", testKey, "--start", "2026-11-21T00:00:00Z", "--end", "2026-11-22T00:00:00Z",
		"--group-by", "model_version,engine,tensor_parallelism"}
	out, _, err := runArgs(t, nil, sel...)
	if err != nil {
		t.Fatalf("usage: %v", err)
	}
	want := `BUCKET START          VERSION  ENGINE       TP   REQUESTS  ERRORS  PROMPT  CACHED  OUTPUT
2026-11-21T00:00:00Z  v2       sglang+vllm  2+4        10       0     100       0      20
2026-11-21T00:00:00Z  v2       vllm         2           3       1      30       5       6
TOTAL                                                  13       1     130       5      26
`
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("table (-want +got):\n%s", diff)
	}
	out, _, err = runArgs(t, nil, append(sel, "--output", "csv")...)
	if err != nil {
		t.Fatalf("usage csv: %v", err)
	}
	wantCSV := "bucket_start,model_version,engine,tensor_parallelism,requests,errors,prompt_tokens,cached_prompt_tokens,output_tokens\n" +
		"2026-11-21T00:00:00Z,v2,sglang+vllm,2+4,10,0,100,0,20\n" +
		"2026-11-21T00:00:00Z,v2,vllm,2,3,1,30,5,6\n"
	if diff := cmp.Diff(wantCSV, strings.ReplaceAll(out, "\r\n", "\n")); diff != "" {
		t.Errorf("csv (-want +got):\n%s", diff)
	}
}

// TestUsageServerLists checks the group-by fields meterctl validates
// against the server's.
func TestUsageServerLists(t *testing.T) {
	if diff := cmp.Diff(query.UsageGroupFields, groupColumns); diff != "" {
		t.Errorf("usage group-by fields (-server +meterctl):\n%s", diff)
	}
}
