package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

const billingUsageText = `Usage: meterctl billing <command> [flags]

Billing periods are calendar months ("2026-11") of each tenant's billing time
zone. A tenant key sees its own tenant without the finance-only figures
(allocated GPU cost, margin); finance and admin keys see every tenant with
them; only admin keys close periods.

Commands:
  periods [--tenant T]                       list a tenant's periods, open and closed
  close PERIOD [--tenant T ...] [--grace D] [--reprice P ...] [--flag-unpriced]
                                             close a period (every tenant with usage, or those named)
  statement PERIOD --tenant T [-o table|json]
                                             print a tenant's statement (a draft while the period is open)
  export statements PERIOD [--tenant T] --format F -o FILE
                                             write the lines of a closed period's statements to FILE
  export usage-cost --start S --end E [--step hour|day] [--tenant T] --format F -o FILE
                                             write usage and cost per tenant, model, deployment and hour (or day)
  invoice PERIOD [--tenant T] [-o table|json|html]
                                             print the invoice of a closed statement (html: the printable page)
  void PERIOD --tenant T --hash H --reason R void a closed statement and reissue it (admin key): credit note, new invoice
  credits [--tenant T] [--ledger]            print credit grants and balances (or the credit ledger)
  grant GRANT_ID --tenant T --kind prepaid|promotional --amount A --from TIME [--expires TIME]
                                             grant a tenant credit (admin key; GRANT_ID is the idempotency key)

Formats: csv, jsonl, parquet, focus-csv, focus-parquet (FOCUS 1.2). An export
is written to a temporary file beside FILE and renamed to FILE once complete:
a failed export leaves no FILE (and an older FILE untouched). "-o -" writes to
standard output. "meterctl billing <command> -h" shows a command's flags.
`

// exportFormats are the formats of the exports (export.Formats).
var exportFormats = []string{"csv", "jsonl", "parquet", "focus-csv", "focus-parquet"}

func runBilling(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, billingUsageText)
		return errors.New("billing: want a command: periods, close, statement, invoice, void, export, credits or grant")
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "periods":
		return runBillingPeriods(ctx, rest, getenv, stdout, stderr)
	case "close":
		return runBillingClose(ctx, rest, getenv, stdout, stderr)
	case "statement":
		return runBillingStatement(ctx, rest, getenv, stdout, stderr)
	case "invoice":
		return runBillingInvoice(ctx, rest, getenv, stdout, stderr)
	case "void":
		return runBillingVoid(ctx, rest, getenv, stdout, stderr)
	case "credits":
		return runBillingCredits(ctx, rest, getenv, stdout, stderr)
	case "grant":
		return runBillingGrant(ctx, rest, getenv, stdout, stderr)
	case "export":
		if len(rest) > 0 && rest[0] == "statements" {
			return runExportStatements(ctx, rest[1:], getenv, stdout, stderr)
		}
		if len(rest) > 0 && rest[0] == "usage-cost" {
			return runExportUsageCost(ctx, rest[1:], getenv, stdout, stderr)
		}
		return errors.New(`billing export: want "statements PERIOD" or "usage-cost"`)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, billingUsageText)
		return nil
	default:
		return fmt.Errorf("billing: unknown command %q; \"meterctl billing help\" lists the commands", cmd)
	}
}

// parseWithArg parses args, flags before and after the one positional
// argument (named what in errors), and returns that argument.
func parseWithArg(fs *flag.FlagSet, args []string, what string) (string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return "", err
		}
		if fs.NArg() == 0 {
			break
		}
		pos, args = append(pos, fs.Arg(0)), fs.Args()[1:]
	}
	if len(pos) != 1 {
		return "", fmt.Errorf("%s: want one %s argument, got %d (%s)", fs.Name(), what, len(pos), strings.Join(pos, " "))
	}
	return pos[0], nil
}

// tenantList is a repeatable --tenant that also takes commas.
type tenantList []string

func (l *tenantList) String() string { return strings.Join(*l, ",") }
func (l *tenantList) Set(s string) error {
	*l = append(*l, splitList(s)...)
	return nil
}

// outputFlag registers -o and --output (the same value).
func outputFlag(fs *flag.FlagSet, p *string, def, usage string) {
	fs.StringVar(p, "o", def, usage)
	fs.StringVar(p, "output", def, "same as -o")
}

// checkOutput refuses an -o that is not one of want.
func checkOutput(out string, want ...string) error {
	if !slices.Contains(want, out) {
		return fmt.Errorf("-o %q: want %s", out, orList(want))
	}
	return nil
}

// resolveConn resolves conn from the environment and returns what is wrong
// with it and with -o (out not one of want), for the command to report
// with its own checks at once.
func resolveConn(conn *connConfig, getenv func(string) string, out string, want ...string) []error {
	conn.resolve(getenv)
	return append(conn.validate(), checkOutput(out, want...))
}

// withTenant adds tenant_id to q when a tenant is given (none reads a
// tenant key's own tenant, or every tenant for finance and admin keys).
func withTenant(q url.Values, tenant string) url.Values {
	if tenant != "" {
		q.Set("tenant_id", tenant)
	}
	return q
}

// getJSON sends one request and decodes its JSON answer into m.
func getJSON(ctx context.Context, c connConfig, method, path string, q url.Values, body []byte, m proto.Message) error {
	data, err := newClient(c, 1).do(ctx, method, path, q, body)
	if err != nil {
		return err
	}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(data, m); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return nil
}

func runBillingPeriods(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var conn connConfig
	var tenant, out string
	fs := newFlagSet("billing periods", "[--tenant T] [-o table|json]",
		"Lists a tenant's billing periods from GET /v1/billing/periods, oldest first: the\n"+
			"closed ones with their statement's total and hash, then the open ones up to the\n"+
			"current. A tenant key lists its own tenant.", stderr)
	conn.register(fs)
	fs.StringVar(&tenant, "tenant", "", "tenant (required with a finance or admin key)")
	outputFlag(fs, &out, "table", "output: table or json")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := errors.Join(resolveConn(&conn, getenv, out, "table", "json")...); err != nil {
		return err
	}
	q := withTenant(url.Values{}, tenant)
	resp := &meterv1.ListBillingPeriodsResponse{}
	if err := getJSON(ctx, conn, http.MethodGet, "/v1/billing/periods", q, nil, resp); err != nil {
		return err
	}
	if out == "json" {
		return writeJSON(stdout, resp)
	}
	return periodsGrid(resp.GetPeriods()).writeTable(stdout)
}

// periodsGrid is a table of periods.
func periodsGrid(periods []*meterv1.BillingPeriod) *grid {
	g := &grid{cols: []column{{head: "TENANT"}, {head: "PERIOD"}, {head: "ZONE"}, {head: "STATE"}, {head: "START"}, {head: "END"},
		{head: "CLOSED_AT/CLOSABLE_AT"}, {head: "TOTAL", num: true}, {head: "HASH"}}}
	ts := func(p interface{ AsTime() time.Time }) string { return p.AsTime().UTC().Format(time.RFC3339) }
	for _, p := range periods {
		state, when, total, hash := "open", ts(p.GetClosableAt()), "-", "-"
		if p.GetClosed() {
			state, when, total, hash = "closed", ts(p.GetClosedAt()), exactMoney(p.GetTotal()), p.GetHash()
		}
		g.add(p.GetTenantId(), p.GetPeriod(), p.GetZone(), state, ts(p.GetStart()), ts(p.GetEnd()), when, total, hash)
	}
	return g
}

// exactMoney writes an amount with its currency, every significant decimal
// and at least two: "USD 1.650198", "USD 4.65".
func exactMoney(m *meterv1.Money) string {
	if m == nil {
		return "-"
	}
	a := m.GetAmount()
	if whole, frac, ok := strings.Cut(a, "."); ok {
		frac = strings.TrimRight(frac, "0")
		for len(frac) < 2 {
			frac += "0"
		}
		a = whole + "." + frac
	}
	return strings.TrimSpace(m.GetCurrency() + " " + a)
}

func runBillingClose(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var conn connConfig
	var tenants, reprice tenantList
	var out string
	var grace *time.Duration
	var flagUnpriced bool
	fs := newFlagSet("billing close", "PERIOD [--tenant T ...] [--grace D] [--reprice P ...] [--flag-unpriced] [-o table|json]",
		"Closes PERIOD (\"2026-11\") with POST /v1/billing/periods/PERIOD:close (admin key):\n"+
			"the statements of the tenants named, or of every tenant with usage, are stored\n"+
			"and never change. Closing again returns the same statements. The server refuses\n"+
			"(409) while the period has not ended plus the grace delay, ingest has not caught\n"+
			"up past its end, or the rollups have not costed it; a tenant whose usage has a\n"+
			"model without a list price is refused (409, naming the models and requests)\n"+
			"unless --flag-unpriced.", stderr)
	conn.register(fs)
	fs.Var(&tenants, "tenant", "tenant to close (repeat or use commas; default every tenant with usage)")
	fs.BoolVar(&flagUnpriced, "flag-unpriced", false, "close tenants whose usage has a model without a list price, their statements flagging the unpriced requests (default: refuse them)")
	fs.Var(&reprice, "reprice", "closed period before PERIOD to reprice with the price book in force (repeat or use commas): the difference becomes repricing lines")
	fs.Func("grace", "grace delay after the period's end (default: meterd's --billing-grace)", func(s string) error {
		d, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		grace = &d
		return nil
	})
	outputFlag(fs, &out, "table", "output: table or json")
	period, err := parseWithArg(fs, args, "PERIOD")
	if err != nil {
		return err
	}
	if err := errors.Join(resolveConn(&conn, getenv, out, "table", "json")...); err != nil {
		return err
	}
	body := map[string]any{}
	if len(tenants) > 0 {
		body["tenant_ids"] = []string(tenants)
	}
	if len(reprice) > 0 {
		body["reprice_periods"] = []string(reprice)
	}
	if flagUnpriced {
		body["flag_unpriced"] = true
	}
	if grace != nil {
		body["grace"] = fmt.Sprintf("%.9fs", grace.Seconds())
	}
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	resp := &meterv1.CloseBillingPeriodResponse{}
	if err := getJSON(ctx, conn, http.MethodPost, "/v1/billing/periods/"+url.PathEscape(period)+":close", nil, b, resp); err != nil {
		return err
	}
	if out == "json" {
		return writeJSON(stdout, resp)
	}
	if len(resp.GetPeriods()) == 0 {
		_, err := fmt.Fprintf(stdout, "No statement closed: no tenant has usage in or around %s.\n", period)
		return err
	}
	return periodsGrid(resp.GetPeriods()).writeTable(stdout)
}

func runBillingStatement(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var conn connConfig
	var tenant, out string
	fs := newFlagSet("billing statement", "PERIOD --tenant T [-o table|json]",
		"Prints a tenant's statement of PERIOD from GET /v1/billing/statements/PERIOD: the\n"+
			"stored one of a closed period, with its hash, or a draft of the usage so far of an\n"+
			"open one. Finance and admin keys also see the allocated GPU cost and margin.", stderr)
	conn.register(fs)
	fs.StringVar(&tenant, "tenant", "", "tenant (required with a finance or admin key)")
	outputFlag(fs, &out, "table", "output: table or json")
	period, err := parseWithArg(fs, args, "PERIOD")
	if err != nil {
		return err
	}
	if err := errors.Join(resolveConn(&conn, getenv, out, "table", "json")...); err != nil {
		return err
	}
	q := withTenant(url.Values{}, tenant)
	resp := &meterv1.GetStatementResponse{}
	if err := getJSON(ctx, conn, http.MethodGet, "/v1/billing/statements/"+url.PathEscape(period), q, nil, resp); err != nil {
		return err
	}
	if out == "json" {
		return writeJSON(stdout, resp)
	}
	return writeStatement(stdout, resp.GetStatement())
}

// writeStatement prints a statement: a heading, its lines, its totals and,
// when present, its finance part.
func writeStatement(w io.Writer, st *meterv1.Statement) error {
	ts := func(p interface{ AsTime() time.Time }) string { return p.AsTime().UTC().Format(time.RFC3339) }
	state := "DRAFT (the period is open: amounts change until it closes)"
	if st.GetClosed() {
		state = "closed " + ts(st.GetClosedAt())
	}
	fmt.Fprintf(w, "Statement of %s for %s (%s, %s to %s): %s\n", st.GetTenantId(), st.GetPeriod(), st.GetZone(),
		ts(st.GetPeriodStart()), ts(st.GetPeriodEnd()), state)
	hash := "Hash " + st.GetHash()
	if !st.GetClosed() {
		hash = "No hash (a draft)"
	}
	fmt.Fprintf(w, "%s; price book %s.\n\n", hash, st.GetPriceBook())
	fin := st.GetFinance() != nil
	g := &grid{cols: []column{{head: "KIND"}, {head: "MODEL"}, {head: "DEPLOYMENT"}, {head: "OF"}, {head: "FROM"}, {head: "TO"}}}
	g.cols = append(g.cols, numColumns("REQUESTS", "INPUT", "CACHED", "OUTPUT", "IN/1M", "CACHED/1M", "OUT/1M", "CHARGE")...)
	if fin {
		g.cols = append(g.cols, numColumns("COST", "MARGIN")...)
	}
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	for _, l := range st.GetLines() {
		row := []string{l.GetKind(), l.GetModel(), dash(l.GetDeployment()), dash(l.GetOriginalPeriod()), ts(l.GetChargeStart()), ts(l.GetChargeEnd()),
			fmt.Sprint(l.GetRequests()), fmt.Sprint(l.GetInputTokens()), fmt.Sprint(l.GetCachedInputTokens()), fmt.Sprint(l.GetOutputTokens()),
			exactMoney(l.GetInputPer_1M()), exactMoney(l.GetCachedInputPer_1M()), exactMoney(l.GetOutputPer_1M()), exactMoney(l.GetCharge())}
		if !l.GetPriced() {
			row[10], row[11], row[12] = "unpriced", "-", "-"
		}
		if fin {
			row = append(row, exactMoney(l.GetFinance().GetAllocatedCost()), exactMoney(l.GetFinance().GetMargin()))
		}
		g.add(row...)
	}
	if err := g.writeTable(w); err != nil {
		return err
	}
	if err := writeCharges(w, st); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nCharge %s; total %s (%s).\n", exactMoney(st.GetCharge()), exactMoney(st.GetTotal()), st.GetRounding())
	if n := st.GetUnpricedRequests(); n > 0 {
		fmt.Fprintf(w, "%d requests of models without a list price are not charged.\n", n)
	}
	if f := st.GetFinance(); f != nil {
		fmt.Fprintf(w, "Finance: allocated GPU cost %s (busy %s, idle %s; policies %s/%s), margin %s on usage %s",
			exactMoney(f.GetAllocatedCost()), exactMoney(f.GetBusyCost()), exactMoney(f.GetIdleCost()), f.GetBusyPolicy(), f.GetIdlePolicy(),
			exactMoney(f.GetMargin()), exactMoney(f.GetUsageCharge()))
		if f.GetCostPer_1KTokens() != nil {
			fmt.Fprintf(w, ", cost per 1k tokens %s", exactMoney(f.GetCostPer_1KTokens()))
		}
		fmt.Fprintln(w, ".")
	}
	return nil
}

// exportFlags are the flags both exports share.
type exportFlags struct {
	conn           connConfig
	tenant, format string
	file           string
}

func (e *exportFlags) register(fs *flag.FlagSet) {
	e.conn.register(fs)
	fs.StringVar(&e.tenant, "tenant", "", "tenant (default: every tenant for finance and admin keys; a tenant key's own)")
	fs.StringVar(&e.format, "format", "csv", "file format: "+orList(exportFormats))
	outputFlag(fs, &e.file, "", "file to write (required; - for standard output)")
}

func (e *exportFlags) validate(getenv func(string) string) []error {
	e.conn.resolve(getenv)
	errs := e.conn.validate()
	if !slices.Contains(exportFormats, e.format) {
		errs = append(errs, fmt.Errorf("--format %q: want %s", e.format, orList(exportFormats)))
	}
	if e.file == "" {
		errs = append(errs, errors.New("-o FILE is required"))
	}
	return errs
}

func (e *exportFlags) query() url.Values {
	return withTenant(url.Values{"format": {e.format}}, e.tenant)
}

func runExportStatements(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var e exportFlags
	fs := newFlagSet("billing export statements", "PERIOD [--tenant T] --format F -o FILE",
		"Writes the lines of PERIOD's closed statements (one tenant's, or every tenant's)\n"+
			"to FILE from GET /v1/billing/statements/PERIOD/export. Re-exporting a closed\n"+
			"period gives the same bytes. A progress line goes to stderr.", stderr)
	e.register(fs)
	period, err := parseWithArg(fs, args, "PERIOD")
	if err != nil {
		return err
	}
	if err := errors.Join(e.validate(getenv)...); err != nil {
		return err
	}
	return download(ctx, e.conn, "/v1/billing/statements/"+url.PathEscape(period)+"/export", e.query(), e.file, stdout, stderr)
}

func runExportUsageCost(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var e exportFlags
	var start, end, step string
	fs := newFlagSet("billing export usage-cost", "--start S --end E [--step hour|day] [--tenant T] --format F -o FILE",
		"Writes usage and cost, one row per tenant, model, deployment and hour (or day),\n"+
			"over [start, end) to FILE from GET /v1/billing/usage-cost/export. Finance and\n"+
			"admin keys get the allocated GPU cost and margin too. A progress line goes to stderr.", stderr)
	e.register(fs)
	fs.StringVar(&start, "start", "", "inclusive start on a whole hour (a whole day for --step day), RFC 3339 or a date (default: 24 h before --end)")
	fs.StringVar(&end, "end", "", "exclusive end, RFC 3339 or a date (default: the current hour's start)")
	fs.StringVar(&step, "step", "hour", "hour or day")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	errs := e.validate(getenv)
	from, to, err := timeRange(start, end, time.Now().UTC().Truncate(time.Hour))
	if err != nil {
		errs = append(errs, err)
	}
	if step != "hour" && step != "day" {
		errs = append(errs, fmt.Errorf("--step %q: want hour or day", step))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	q := e.query()
	q.Set("start", from.Format(time.RFC3339Nano))
	q.Set("end", to.Format(time.RFC3339Nano))
	q.Set("step", step)
	return download(ctx, e.conn, "/v1/billing/usage-cost/export", q, e.file, stdout, stderr)
}

// download streams the export at path to dest ("-": stdout) through a
// temporary file beside it, renamed to dest once the server has sent the
// whole file: a failed or cut-off export leaves no dest (and an older one
// untouched). It reports progress on stderr: a line redrawn on a terminal,
// otherwise only the summary at the end.
func download(ctx context.Context, c connConfig, path string, q url.Values, dest string, stdout, stderr io.Writer) error {
	op := "GET " + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.baseURL()+path+"?"+q.Encode(), nil)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.Key)
	// --timeout bounds the wait for the answer to start, not the transfer,
	// which lasts as long as the export.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.ResponseHeaderTimeout = c.Timeout
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w", op, context.Cause(ctx))
		}
		return &transportError{Op: op, Err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return newAPIError(op, resp, data)
	}

	var out io.Writer = stdout
	var file *outputFile
	if dest != "-" {
		if file, err = createOutput(dest); err != nil {
			return err
		}
		defer file.Discard()
		out = file
	}
	p := &downloadProgress{w: stderr, tty: isTerminal(stderr), start: time.Now()}
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() { p.run(done); close(stopped) }()
	_, err = io.Copy(io.MultiWriter(out, p), resp.Body)
	close(done)
	<-stopped
	if err != nil {
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		where := "nothing written to " + dest
		if dest == "-" {
			where = "the output is incomplete"
		}
		return fmt.Errorf("%s: the export broke off after %d bytes: %w (%s)", op, p.bytes.Load(), err, where)
	}
	if file != nil {
		if err := file.Commit(); err != nil {
			return err
		}
	}
	rows := resp.Trailer.Get("X-Export-Rows")
	if rows == "" {
		rows = "?"
	}
	name := dest
	if dest == "-" {
		name = "standard output"
	}
	fmt.Fprintf(stderr, "meterctl: wrote %s: %d bytes, %s rows, %s (%s) in %s\n", name, p.bytes.Load(), rows,
		resp.Header.Get("Content-Type"), serverFileName(resp), time.Since(p.start).Round(time.Millisecond))
	return nil
}

// serverFileName is the file name the server gave the export.
func serverFileName(resp *http.Response) string {
	_, params, err := mime.ParseMediaType(resp.Header.Get("Content-Disposition"))
	if err != nil || params["filename"] == "" {
		return "no name"
	}
	return params["filename"]
}

// downloadProgress counts the bytes of a download and redraws a line on a
// terminal.
type downloadProgress struct {
	w      io.Writer
	tty    bool
	start  time.Time
	bytes  atomic.Int64
	chunks atomic.Int64
}

func (p *downloadProgress) Write(b []byte) (int, error) {
	p.bytes.Add(int64(len(b)))
	p.chunks.Add(1)
	return len(b), nil
}

// run redraws the line until done is closed (on a terminal only).
func (p *downloadProgress) run(done <-chan struct{}) {
	if !p.tty {
		<-done
		return
	}
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			p.report()
		case <-done:
			p.report()
			fmt.Fprintln(p.w)
			return
		}
	}
}

func (p *downloadProgress) report() {
	n := p.bytes.Load()
	rate := float64(n) / max(time.Since(p.start).Seconds(), 1e-9)
	fmt.Fprintf(p.w, "\rreceiving: %s in %d chunks, %s/s\x1b[K", byteSize(float64(n)), p.chunks.Load(), byteSize(rate))
}

// byteSize writes n bytes in KiB, MiB or GiB.
func byteSize(n float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for n >= 1024 && i < len(units)-1 {
		n /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f B", n)
	}
	return fmt.Sprintf("%.1f %s", n, units[i])
}
