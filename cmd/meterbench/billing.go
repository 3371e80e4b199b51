package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"

	"tokenmeter/api"
	"tokenmeter/billing"
	"tokenmeter/billing/closing"
	"tokenmeter/billing/export"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/devenv"
	"tokenmeter/internal/logsetup"
	"tokenmeter/query"
	"tokenmeter/rollup"
)

// runBilling is `meterbench billing`: on the query benchmark's data set
// (loaded here, or an earlier run's ClickHouse folder with --reuse) it
// times closing a month for every tenant, one tenant's draft statement, a
// closed statement's re-read, and the detailed hourly usage-and-cost export
// of the data's 30 days with this process's peak RSS.
func runBilling(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("meterbench billing", flag.ContinueOnError)
	fs.SetOutput(stderr)
	events := fs.Int("events", 100_000_000, "events to load (without --reuse)")
	days := fs.Int("days", 30, "days the events span: the range of the export")
	tenants := fs.Int("tenants", 1000, "tenants (without --reuse)")
	gpus := fs.Int("gpus", 200, "GPUs sampled every 10 s (without --reuse)")
	reuse := fs.String("reuse", "", "run on `DIR`, a copy (cp -al, see docs/performance.md) of the ClickHouse folder of an earlier meterbench queries --keep; the bench stores statements and a price book in it")
	keep := fs.String("keep", "", "load into a new ClickHouse directory DIR and keep it")
	periodFlag := fs.String("period", "", "billing period to close (default: the UTC month of the data's last day)")
	zoneName := fs.String("zone", "+05:30", "time zone of the second close")
	zoneTenants := fs.Int("zone-tenants", 100, "tenants of the second close, in --zone")
	draftReps := fs.Int("draft-reps", 50, "draft statements computed, each of another tenant")
	rereadReps := fs.Int("reread-reps", 200, "closed statements re-read, spread over the tenants")
	formats := fs.String("formats", "csv,parquet", "formats of the usage-and-cost export")
	tokenPrices := fs.Bool("token-prices", true, "when the book in force has no token prices, store one with the bench's (a change in mid-period) and recost the hours")
	profileDir := fs.String("profile", "", "write a CPU profile of each timed phase into this folder")
	phaseList := fs.String("phases", "drafts,close,reread,export", "what to time, of drafts, close, reread (needs close) and export")
	meterd := fs.String("meterd", "bin/meterd", "meterd binary whose REST usage-and-cost export is timed (make build); empty: in process only")
	queryLog := fs.Bool("query-log", false, "print ClickHouse's own time for each query of one tenant's close (system.query_log)")
	credits := fs.Bool("credits", true, "give every tenant a prepaid credit grant (every 3rd also a promotional one) that its closes and drafts draw on")
	contracts := fs.Bool("contracts", true, "give every tenant a contract (rate card from mid-period, tiers, an allowance, a discount, a commitment; every 10th a dedicated deployment billed per GPU-hour)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *keep != "" && *reuse != "" {
		return errors.New("--keep and --reuse exclude each other")
	}
	fmts, err := parseFormats(*formats)
	if err != nil {
		return err
	}
	phases := map[string]bool{}
	for _, name := range strings.Split(*phaseList, ",") {
		if name = strings.TrimSpace(name); !slices.Contains([]string{"drafts", "close", "reread", "export"}, name) {
			return fmt.Errorf("--phases: unknown phase %q", name)
		}
		phases[name] = true
	}
	if *meterd != "" && phases["export"] {
		if _, err := os.Stat(*meterd); err != nil {
			return fmt.Errorf("--meterd: %w (run make build, or --meterd '' to time the export in process only)", err)
		}
	}
	if phases["reread"] && !phases["close"] {
		return errors.New("--phases: reread needs close")
	}
	zone, err := billing.ParseZone(*zoneName)
	if err != nil {
		return err
	}
	progress := func(format string, a ...any) { fmt.Fprintf(stderr, "meterbench: "+format+"\n", a...) }
	logger := logsetup.Warnings(stderr)
	chDir := *reuse
	if *keep != "" {
		if err := newFolder("keep", *keep); err != nil {
			return err
		}
		chDir = *keep
	}
	bch, err := startClickHouse(ctx, logger, chDir, "bench_q", clickhouse.Options{
		ReadTimeout: 30 * time.Minute, Settings: clickhouse.Settings{"max_execution_time": 3600}})
	if err != nil {
		return err
	}
	defer bch.close()
	store, conn := bch.store, bch.conn

	fmt.Fprintf(stdout, "tokenmeter billing benchmark (load average at start: %s)\n\n", loadAverage())
	if *reuse == "" {
		end := time.Now().UTC().Truncate(24 * time.Hour)
		start := end.Add(-time.Duration(*days) * 24 * time.Hour)
		if err := loadAndRollUp(ctx, stdout, progress, logger, conn, store, *events, *tenants, *gpus, 0, start, end); err != nil {
			return err
		}
	}
	// The data's range: its first hour, and as many days on (a kept folder
	// also holds the one hour of 1M events that the load rolled up on its
	// own, a day after them).
	var first time.Time
	if err := conn.QueryRow(ctx, "SELECT min(hour) FROM cost_hour").Scan(&first); err != nil {
		return fmt.Errorf("data range: %w", err)
	}
	if first.Unix() <= 0 {
		return errors.New("no costed hours in the data: run meterbench queries --keep DIR first")
	}
	dataStart := first.UTC()
	dataEnd := dataStart.Add(time.Duration(*days) * 24 * time.Hour)
	var p billing.Period
	if *periodFlag == "" {
		p = billing.PeriodOf(dataEnd.Add(-time.Nanosecond), time.UTC)
	} else if p, err = billing.ParsePeriod(*periodFlag, time.UTC); err != nil {
		return err
	}
	zp, err := billing.ParsePeriod(p.Key, zone)
	if err != nil {
		return err
	}

	book, err := billing.BookInForce(ctx, store)
	if err != nil {
		return err
	}
	if *tokenPrices && len(book.TokenPrices) == 0 {
		if book, err = withBenchTokenPrices(book, p); err != nil {
			return err
		}
		if _, _, err := billing.EnsurePriceBook(ctx, store, book, "meterbench billing", time.Now()); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "price book %s stored: the bench's token prices, two models' changing at %s\n",
			book.Version(), p.Start.AddDate(0, 0, 14).Format(time.RFC3339))
	}
	// A book stored since the hours were costed (just now, or by an earlier
	// run) makes the job recost them all; else it finds nothing to do.
	job, err := rollup.NewJob(rollup.Config{}, store, prometheus.NewRegistry(), logger, time.Now)
	if err != nil {
		return err
	}
	progress("rollup job (recosts every hour after a price book change)")
	t0 := time.Now()
	hours, err := job.RunOnce(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "rollup job run: %d hours recomputed in %.1f s\n", len(hours), time.Since(t0).Seconds())
	if n, err := settleMerges(ctx, conn, 10*time.Minute); err == nil && len(hours) > 0 {
		progress("merges settled (%s)", n)
	}

	// The clock of every close and read: the period over in every zone,
	// its grace passed, ingest caught up.
	now := latest(p.End, zp.End).Add(billing.DefaultGrace + time.Hour)
	clock := func() time.Time { return now }
	reads := query.New(store, query.Config{})
	var accounts *billing.Accounts
	if *contracts {
		if accounts, err = benchContracts(ctx, conn, store, p, zp); err != nil {
			return err
		}
	}
	deps := closing.Deps{Reads: reads, Store: store,
		Prices: func(ctx context.Context) (*billing.PriceBook, error) { return billing.BookInForce(ctx, store) }}
	if *credits {
		if err := benchCredits(ctx, conn, store, book, p, zp); err != nil {
			return err
		}
		deps.Credits = store
	}
	svc, err := closing.NewService(deps, closing.Config{Now: clock, Accounts: accounts})
	if err != nil {
		return err
	}

	usageEnd := p.End
	if last := dataEnd.Add(25 * time.Hour); last.Before(usageEnd) {
		usageEnd = last // the hour of 1M events a day after the data included
	}
	byTenant, err := reads.Usage(ctx, query.UsageQuery{Start: p.Start, End: usageEnd, GroupBy: []string{"tenant_id"}})
	if err != nil {
		return err
	}
	var all []string
	for _, r := range byTenant {
		if r.TenantID != billing.IdleTenant {
			all = append(all, r.TenantID)
		}
	}
	slices.Sort(all)
	if len(all) == 0 {
		return fmt.Errorf("no tenant has usage in %s", p.Key)
	}
	dataDays := int(earliest(dataEnd, p.End).Sub(latest(dataStart, p.Start)) / (24 * time.Hour))
	fmt.Fprintf(stdout, "data: %s to %s (%d days); period %s: %d tenants with usage; the data covers %d of its days (partial month)",
		dataStart.Format(time.DateOnly), dataEnd.Format(time.DateOnly), *days, p.Key, len(all), dataDays)
	if dataEnd.Before(p.End) {
		fmt.Fprint(stdout, ", plus any hour rolled up after it (a kept folder: the one hour of 1M events at ", dataEnd.Add(24*time.Hour).Format(time.RFC3339), ")")
	}
	fmt.Fprintf(stdout, "\nclock of the closes and reads: %s (the period's end + %s grace + 1 h)\n\n", now.Format(time.RFC3339), billing.DefaultGrace)

	// Statements of an earlier run on this folder would make every close a
	// re-read of them.
	var stored uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM statements").Scan(&stored); err != nil {
		return err
	}
	if stored > 0 {
		if err := conn.Exec(ctx, "TRUNCATE TABLE statements"); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "statements table emptied: %d statements of an earlier run\n\n", stored)
	}

	meter := newCPUMeter(bch.pid)
	phase := func(name string) (done func() cpuLap, err error) {
		meter.lap()
		stop := func() {}
		if *profileDir != "" {
			if err := os.MkdirAll(*profileDir, 0o755); err != nil {
				return nil, err
			}
			if stop, err = startCPUProfile(filepath.Join(*profileDir, name+".pprof")); err != nil {
				return nil, err
			}
		}
		progress("%s", name)
		return func() cpuLap {
			stop()
			return meter.lap()
		}, nil
	}

	b := &billingBench{ctx: ctx, conn: conn, store: store, reads: reads, svc: svc, book: book, period: p, now: now, accounts: accounts, credits: *credits,
		tenants: all, phase: phase, progress: progress, stdout: stdout}
	steps := []struct {
		name string
		run  func() error
	}{
		{"drafts", func() error { return b.drafts(*draftReps) }},
		{"close", func() error { return b.closes(zone, *zoneTenants, *queryLog) }},
		{"reread", func() error { return b.rereads(*rereadReps) }},
		{"export", func() error {
			for _, f := range fmts {
				r, err := timeExport(ctx, svc, f, dataStart, dataEnd, phase)
				if err != nil {
					return fmt.Errorf("export %s: %w", f, err)
				}
				b.res = append(b.res, r)
			}
			if *meterd == "" {
				return nil
			}
			rs, err := timeRESTExport(ctx, *meterd, bch.addr, fmts, dataStart, dataEnd, phase, progress)
			if err != nil {
				return fmt.Errorf("REST export: %w", err)
			}
			b.res = append(b.res, rs...)
			return nil
		}},
	}
	for _, st := range steps {
		if !phases[st.name] {
			continue
		}
		if err := st.run(); err != nil {
			return err
		}
	}
	res := b.res

	fmt.Fprintln(stdout, "results (what; measured, target; CPU used meanwhile):")
	for _, r := range res {
		fmt.Fprintf(stdout, "\n%s\n    %-58s", r.what, r.got)
		if r.target != "" {
			mark := "met"
			if !r.ok {
				mark = "MISSED"
			}
			fmt.Fprintf(stdout, " target %s: %s", r.target, mark)
		}
		fmt.Fprintln(stdout)
		if r.note != "" {
			fmt.Fprintf(stdout, "    %s\n", r.note)
		}
	}
	fmt.Fprintf(stdout, "\nload average at the end: %s (%d cores, shared with whatever else runs)\n", loadAverage(), runtime.NumCPU())
	return nil
}

// billingBench holds what the timed phases of the billing benchmark share.
type billingBench struct {
	ctx      context.Context
	conn     driver.Conn
	store    *chstore.Store
	reads    *query.Service
	svc      *closing.Service
	book     *billing.PriceBook
	period   billing.Period
	now      time.Time
	tenants  []string
	phase    func(string) (func() cpuLap, error)
	progress func(string, ...any)
	stdout   io.Writer
	res      []benchResult
	// closed are the statements of the close of every tenant.
	closed []billing.StoredStatement
	// accounts holds the tenants' contracts (--contracts); nil: none.
	accounts *billing.Accounts
	// credits: closes draw on the tenants' credit grants (--credits).
	credits bool
}

// benchCredits empties the credit ledger of an earlier run and grants
// every tenant with usage in p (or zp) 500 of prepaid credit, every 3rd
// also 50 of promotional credit expiring after the period.
func benchCredits(ctx context.Context, conn driver.Conn, store *chstore.Store, book *billing.PriceBook, p, zp billing.Period) error {
	if err := conn.Exec(ctx, "TRUNCATE TABLE credit_ledger"); err != nil {
		return fmt.Errorf("credits: %w", err)
	}
	rows, err := conn.Query(ctx, "SELECT DISTINCT tenant_id FROM cost_hour WHERE hour >= ? AND hour < ? ORDER BY tenant_id",
		earliest(p.Start, zp.Start).UTC(), latest(p.End, zp.End).UTC())
	if err != nil {
		return fmt.Errorf("credits: %w", err)
	}
	var tenants []string
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			rows.Close()
			return err
		}
		if t != billing.IdleTenant {
			tenants = append(tenants, t)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	from := earliest(p.Start, zp.Start).Add(-30 * 24 * time.Hour).Truncate(time.Hour)
	for i, t := range tenants {
		grants := []billing.CreditGrant{{ID: "bench-prepaid-" + t, Tenant: t, Kind: billing.CreditPrepaid, Amount: 500_000_000_000,
			Currency: book.Currency, EffectiveFrom: from, CreatedAt: from, CreatedBy: "meterbench"}}
		if i%3 == 0 {
			grants = append(grants, billing.CreditGrant{ID: "bench-promo-" + t, Tenant: t, Kind: billing.CreditPromotional, Amount: 50_000_000_000,
				Currency: book.Currency, EffectiveFrom: from, ExpiresAt: latest(p.End, zp.End).Add(24 * time.Hour).Truncate(time.Hour), CreatedAt: from, CreatedBy: "meterbench"})
		}
		for _, g := range grants {
			if _, _, err := store.PutCreditGrant(ctx, g); err != nil {
				return fmt.Errorf("credits: %w", err)
			}
		}
	}
	return nil
}

// contractNote says in a result's title that tenants have contracts.
func (b *billingBench) contractNote() string {
	if b.accounts == nil {
		if b.credits {
			return " and credits"
		}
		return ""
	}
	s := " and contracts (rate cards, tiers, allowances, commitments, dedicated GPU-hours)"
	if b.credits {
		s += " and credits"
	}
	return s
}

// benchContracts gives every tenant with usage in p (or zp) a contract on
// the models of the book in force: a rate card (10% off, a lower input
// price; every 10th tenant's from the middle of the period), three tiers, an allowance,
// a 5% discount and a commitment; every 10th tenant also a dedicated
// deployment billed per GPU-hour (its GPU hours are read at each close).
func benchContracts(ctx context.Context, conn driver.Conn, store *chstore.Store, p, zp billing.Period) (*billing.Accounts, error) {
	book, err := billing.BookInForce(ctx, store)
	if err != nil {
		return nil, err
	}
	var models []string
	for _, tp := range book.TokenPrices {
		if !slices.Contains(models, tp.Model) {
			models = append(models, tp.Model)
		}
	}
	var deps, tenants []string
	for q, out := range map[string]*[]string{
		"SELECT DISTINCT deployment FROM gpu_hour ORDER BY deployment":                             &deps,
		"SELECT DISTINCT tenant_id FROM cost_hour WHERE hour >= ? AND hour < ? ORDER BY tenant_id": &tenants,
	} {
		args := []any{}
		if strings.Contains(q, "?") {
			args = []any{earliest(p.Start, zp.Start).UTC(), latest(p.End, zp.End).UTC()}
		}
		rows, err := conn.Query(ctx, q, args...)
		if err != nil {
			return nil, fmt.Errorf("contracts: %w", err)
		}
		for rows.Next() {
			var v string
			if err := rows.Scan(&v); err != nil {
				rows.Close()
				return nil, err
			}
			*out = append(*out, v)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	// Most contracts run from before the period; every 10th tenant's rate
	// card changes in the middle of it (its usage is cut there: one more
	// usage read).
	mid := p.Start.Add(p.End.Sub(p.Start) / 2).Truncate(time.Hour)
	price := billing.Money(400_000_000)
	a := &billing.Accounts{}
	for i, t := range tenants {
		if t == billing.IdleTenant {
			continue
		}
		c := &billing.Contract{DiscountPercent: 5_000_000_000, Commitment: &billing.Commitment{MonthlySpend: 1_000_000_000_000}}
		for _, m := range models {
			from := p.Start.Add(-24 * time.Hour)
			if i%10 == 5 {
				from = mid
			}
			c.RateCard = append(c.RateCard, billing.RateCardEntry{Model: m, EffectiveFrom: from, InputPer1M: &price, DiscountPercent: 10_000_000_000})
			c.Allowances = append(c.Allowances, billing.Allowance{Model: m, TokenKind: billing.TokenInput, Tokens: 1_000_000})
			c.Tiers = append(c.Tiers, billing.TierSchedule{Model: m, Tiers: []billing.Tier{{UpTo: 10_000_000}, {UpTo: 100_000_000, DiscountPercent: 10_000_000_000}, {DiscountPercent: 20_000_000_000}}})
		}
		if i%10 == 0 && len(deps) > 0 {
			c.Dedicated = append(c.Dedicated, billing.DedicatedDeployment{Deployment: deps[i/10%len(deps)], EffectiveFrom: p.Start.Add(-24 * time.Hour), PerGPUHour: 2_500_000_000})
		}
		if err := c.Validate(); err != nil {
			return nil, err
		}
		a.Tenants = append(a.Tenants, billing.TenantAccount{ID: t, Contract: c})
	}
	return a, nil
}

// request is a close of the period for tenants in zone.
func (b *billingBench) request(tenants []string, zone *time.Location) closing.Request {
	req := closing.Request{Period: b.period.Key, Now: b.now, CaughtUp: b.now, Grace: billing.DefaultGrace, Book: b.book, SkipEmpty: true}
	for _, t := range tenants {
		req.Tenants = append(req.Tenants, closing.Tenant{ID: t, Zone: zone, Contract: b.accounts.Tenant(t).Contract})
	}
	return req
}

// drafts times one tenant's statement of the open period, with its
// finance part, reps times, each of another tenant.
func (b *billingBench) drafts(reps int) error {
	done, err := b.phase("drafts")
	if err != nil {
		return err
	}
	p := b.period
	if _, err := b.svc.Statement(b.ctx, b.tenants[len(b.tenants)-1], p.Key, true); err != nil { // untimed: marks, caches
		return err
	}
	tenants := spread(b.tenants, reps)
	lines, i := 0, 0
	d, err := timeIt(len(tenants), func() error {
		v, err := b.svc.Statement(b.ctx, tenants[i], p.Key, true)
		if err == nil && v.Closed {
			err = fmt.Errorf("statement of %s for %s: closed, want a draft", tenants[i], p.Key)
		}
		i++
		lines += len(v.Statement.Lines)
		return err
	})
	l := done()
	if err != nil {
		return fmt.Errorf("draft statement: %w", err)
	}
	b.res = append(b.res, benchResult{
		what:   fmt.Sprintf("draft statement of %s, one tenant, with finance part%s (%d tenants, %.1f lines each)", p.Key, b.contractNote(), len(d), float64(lines)/float64(len(d))),
		got:    pcts(d),
		target: "p99 < 100 ms", ok: d[len(d)*99/100] < 100*time.Millisecond,
		note: cpuNote(l, len(d)),
	})
	return nil
}

// closes times the close of zoneTenants tenants in zone, then (their
// statements removed: a period closes once per tenant) of every tenant in
// UTC, then that close again (the stored statements).
func (b *billingBench) closes(zone *time.Location, zoneTenants int, queryLog bool) error {
	p := b.period
	closer := closing.New(b.reads, b.store, b.reads)
	if b.credits {
		closer.UseCredits(b.store)
	}
	if zs := spread(b.tenants, zoneTenants); len(zs) > 0 {
		done, err := b.phase("close-zone")
		if err != nil {
			return err
		}
		t0 := time.Now()
		sts, err := closer.Close(b.ctx, b.request(zs, zone))
		el := time.Since(t0)
		l := done()
		if err != nil {
			return fmt.Errorf("close %s in %s: %w", p.Key, zone, err)
		}
		b.res = append(b.res, benchResult{
			what: fmt.Sprintf("close %s, %d tenants in %s, with finance part%s (%s)", p.Key, len(sts), zone, b.contractNote(), summary(sts)),
			got:  fmt.Sprintf("%.1f s (%.0f ms a tenant)", el.Seconds(), ms(el)/float64(max(1, len(sts)))),
			note: cpuNote(l, 0),
		})
	}
	if queryLog {
		if err := b.logOneClose(closer); err != nil {
			return err
		}
	}
	if err := b.conn.Exec(b.ctx, "TRUNCATE TABLE statements"); err != nil {
		return err
	}
	if b.credits { // the draws of the statements just removed
		if err := b.conn.Exec(b.ctx, "TRUNCATE TABLE credit_ledger"); err != nil {
			return err
		}
	}
	req := b.request(b.tenants, time.UTC)
	done, err := b.phase("close")
	if err != nil {
		return err
	}
	t0 := time.Now()
	closed, err := closer.Close(b.ctx, req)
	el := time.Since(t0)
	l := done()
	if err != nil {
		return fmt.Errorf("close %s: %w", p.Key, err)
	}
	if len(closed) != len(b.tenants) {
		return fmt.Errorf("close %s: %d statements, want %d", p.Key, len(closed), len(b.tenants))
	}
	b.closed = closed
	b.res = append(b.res, benchResult{
		what:   fmt.Sprintf("close %s, all %d tenants in UTC, with finance part%s (%s)", p.Key, len(closed), b.contractNote(), summary(closed)),
		got:    fmt.Sprintf("%.1f s (%.0f ms a tenant)", el.Seconds(), ms(el)/float64(len(closed))),
		target: "< 60 s", ok: el < time.Minute,
		note: cpuNote(l, 0),
	})
	if done, err = b.phase("reclose"); err != nil {
		return err
	}
	t0 = time.Now()
	again, err := closer.Close(b.ctx, req)
	el = time.Since(t0)
	l = done()
	if err != nil {
		return fmt.Errorf("close %s again: %w", p.Key, err)
	}
	if err := sameStatements(closed, again); err != nil {
		return fmt.Errorf("close %s again: %w", p.Key, err)
	}
	b.res = append(b.res, benchResult{
		what: fmt.Sprintf("close %s again, all %d tenants (idempotent: the stored statements)", p.Key, len(again)),
		got:  fmt.Sprintf("%.1f s (%.1f ms a tenant)", el.Seconds(), ms(el)/float64(len(again))),
		note: cpuNote(l, 0),
	})
	return nil
}

// logOneClose closes the first tenant alone in UTC with ClickHouse's query
// log on, and prints its time per query.
func (b *billingBench) logOneClose(closer *closing.Closer) error {
	if err := b.conn.Exec(b.ctx, "TRUNCATE TABLE statements"); err != nil {
		return err
	}
	if err := b.conn.Exec(b.ctx, "SYSTEM FLUSH LOGS"); err != nil {
		return err
	}
	if err := b.conn.Exec(b.ctx, "TRUNCATE TABLE IF EXISTS system.query_log"); err != nil {
		return err
	}
	lctx := clickhouse.Context(b.ctx, clickhouse.WithSettings(clickhouse.Settings{"log_queries": 1}))
	t0 := time.Now()
	if _, err := closer.Close(lctx, b.request(b.tenants[:1], time.UTC)); err != nil {
		return err
	}
	title := fmt.Sprintf("close of %s alone (%.1f ms): ClickHouse's time per query:", b.tenants[0], ms(time.Since(t0)))
	if err := printQueryLog(b.ctx, b.conn, b.stdout, title); err != nil {
		return err
	}
	fmt.Fprintln(b.stdout)
	return nil
}

// rereads times closed statements read again, reps of them spread over the
// tenants, as finance (the stored bytes) and as the tenant (re-encoded
// without the finance part).
func (b *billingBench) rereads(reps int) error {
	p := b.period
	content := map[string][]byte{}
	for _, st := range b.closed {
		content[st.Tenant] = st.Content
	}
	for _, finance := range []bool{true, false} {
		who, name := "finance", "reread-finance"
		if !finance {
			who, name = "tenant's view", "reread-tenant"
		}
		done, err := b.phase(name)
		if err != nil {
			return err
		}
		tenants := spread(b.tenants, reps)
		for len(tenants) < reps {
			tenants = append(tenants, spread(b.tenants, reps-len(tenants))...)
		}
		i := 0
		d, err := timeIt(len(tenants), func() error {
			t := tenants[i]
			i++
			v, err := b.svc.Statement(b.ctx, t, p.Key, finance)
			if err == nil && (!v.Closed || (finance && !bytes.Equal(v.Content, content[t]))) {
				err = fmt.Errorf("statement of %s for %s: not the stored one", t, p.Key)
			}
			return err
		})
		l := done()
		if err != nil {
			return fmt.Errorf("re-read: %w", err)
		}
		b.res = append(b.res, benchResult{
			what:   fmt.Sprintf("closed statement re-read, one tenant (%s; %d reads over %d tenants)", who, len(d), min(len(b.tenants), reps)),
			got:    pcts(d),
			target: "p99 < 20 ms", ok: d[len(d)*99/100] < 20*time.Millisecond,
			note: cpuNote(l, len(d)),
		})
	}
	return nil
}

// benchResult is one line of the billing benchmark's table.
type benchResult struct {
	what, got, target string
	ok                bool
	note              string
}

// timeExport streams the hourly usage-and-cost rows of [start, end) with
// the finance columns in format f to a counter of bytes, and measures the
// rows per second and this process's peak RSS while it runs.
func timeExport(ctx context.Context, svc *closing.Service, f export.Format, start, end time.Time,
	phase func(string) (func() cpuLap, error)) (benchResult, error) {
	runtime.GC()
	debug.FreeOSMemory()
	before, _ := procStatus(os.Getpid(), "VmRSS")
	watch := watchRSS(os.Getpid(), 10*time.Millisecond)
	done, err := phase("export-" + string(f))
	if err != nil {
		watch()
		return benchResult{}, err
	}
	var cw countWriter
	t0 := time.Now()
	w, err := export.NewUsageCostWriter(&cw, f, export.Options{Finance: true})
	if err != nil {
		watch()
		return benchResult{}, err
	}
	var first time.Duration
	err = svc.EachUsageCost(ctx, closing.UsageCostQuery{Start: start, End: end, Step: "hour"}, func(r *export.UsageCostRow) error {
		if first == 0 {
			first = time.Since(t0)
		}
		return w.Write(*r)
	})
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	el := time.Since(t0)
	l := done()
	peak, hwm := watch()
	if err != nil {
		return benchResult{}, err
	}
	rows := w.Rows()
	rate := float64(rows) / el.Seconds()
	return benchResult{
		what: fmt.Sprintf("usage-and-cost export, hourly, %d days, all tenants, %s with finance columns (%d rows, %.0f MiB; in process)",
			int(end.Sub(start)/(24*time.Hour)), f, rows, mib(uint64(cw.n))),
		got:    fmt.Sprintf("%.0f rows/s (%.1f s), peak RSS %.0f MiB", rate, el.Seconds(), mib(max(peak, hwm))),
		target: "≥ 500,000 rows/s, RSS < 200 MiB", ok: rate >= 500_000 && max(peak, hwm) < 200<<20,
		note: fmt.Sprintf("first row after %.2f s; RSS before %.0f MiB, sampled peak %.0f MiB, VmHWM %.0f MiB; %s",
			first.Seconds(), mib(before), mib(peak), mib(hwm), cpuNote(l, 0)),
	}, nil
}

// countWriter counts what is written to it and drops it.
type countWriter struct{ n int64 }

func (c *countWriter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return len(p), nil
}

// watchRSS samples process pid's VmRSS every interval until the returned
// function is called, which returns the largest sample and the process's
// VmHWM (its peak RSS since the watch began, where the kernel lets this
// process reset it; else since the process started).
func watchRSS(pid int, interval time.Duration) func() (peak, hwm uint64) {
	_ = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0) // resets VmHWM
	stop := make(chan struct{})
	var (
		wg  sync.WaitGroup
		max uint64
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			if v, err := procStatus(pid, "VmRSS"); err == nil && v > max {
				max = v
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	return func() (uint64, uint64) {
		close(stop)
		wg.Wait()
		hwm, _ := procStatus(pid, "VmHWM")
		return max, hwm
	}
}

// procStatus reads a size field ("VmRSS", "VmHWM") of /proc/PID/status, in
// bytes.
func procStatus(pid int, field string) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			f := strings.Fields(rest)
			if len(f) != 2 || f[1] != "kB" {
				break
			}
			kb, err := strconv.ParseUint(f[0], 10, 64)
			if err != nil {
				return 0, err
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no %s", pid, field)
}

// withBenchTokenPrices is book with the bench's token prices for the four
// models of the generated events: two of them change price 14 days into
// period p (UTC), which splits their statement lines.
func withBenchTokenPrices(book *billing.PriceBook, p billing.Period) (*billing.PriceBook, error) {
	data, err := book.MarshalJSON()
	if err != nil {
		return nil, err
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	change := p.Start.AddDate(0, 0, 14).UTC().Format(time.RFC3339)
	type price struct {
		Model         string `json:"model"`
		EffectiveFrom string `json:"effective_from"`
		Input         string `json:"input_per_1m"`
		Cached        string `json:"cached_input_per_1m"`
		Output        string `json:"output_per_1m"`
	}
	const since = "2020-01-01T00:00:00Z"
	prices := []price{
		{"llama-3.1-8b", since, "0.10", "0.05", "0.20"},
		{"llama-3.1-70b", since, "0.60", "0.30", "0.80"},
		{"llama-3.1-70b", change, "0.54", "0.27", "0.72"},
		{"mixtral-8x7b", since, "0.40", "0.20", "0.60"},
		{"qwen2.5-72b", since, "0.70", "0.35", "0.90"},
		{"qwen2.5-72b", change, "0.65", "0.30", "0.85"},
	}
	if doc["token_prices"], err = json.Marshal(prices); err != nil {
		return nil, err
	}
	if data, err = json.Marshal(doc); err != nil {
		return nil, err
	}
	return billing.ParsePriceBook(data)
}

// parseFormats reads a comma-separated list of export formats.
func parseFormats(list string) ([]export.Format, error) {
	var out []export.Format
	for _, name := range strings.Split(list, ",") {
		if name = strings.TrimSpace(name); name == "" {
			continue
		}
		f, err := export.ParseFormat(name)
		if err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	return out, nil
}

// spread picks n of items (all of them when fewer), evenly apart.
func spread(items []string, n int) []string {
	if n >= len(items) {
		return slices.Clone(items)
	}
	out := make([]string, 0, n)
	for i := range n {
		out = append(out, items[i*len(items)/n])
	}
	return out
}

// sameStatements checks that two closes returned the same statements.
func sameStatements(a, b []billing.StoredStatement) error {
	if len(a) != len(b) {
		return fmt.Errorf("%d statements, want %d", len(b), len(a))
	}
	for i := range a {
		if a[i].Tenant != b[i].Tenant || a[i].Hash != b[i].Hash || !bytes.Equal(a[i].Content, b[i].Content) {
			return fmt.Errorf("statement of %s differs from the first close's", b[i].Tenant)
		}
	}
	return nil
}

// summary describes the statements of a close: lines and their total.
func summary(sts []billing.StoredStatement) string {
	var (
		lines int
		total billing.Money
	)
	for _, st := range sts {
		var s billing.Statement
		if err := json.Unmarshal(st.Content, &s); err != nil {
			return "unreadable statement: " + err.Error()
		}
		lines += len(s.Lines)
		total += s.Total
	}
	return fmt.Sprintf("%d lines, total %s", lines, total)
}

// pcts formats sorted durations as p50 / p90 / p99 / max.
func pcts(d []time.Duration) string {
	return fmt.Sprintf("p50 %.1f / p90 %.1f / p99 %.1f / max %.1f ms", ms(d[len(d)/2]), ms(d[len(d)*9/10]), ms(d[len(d)*99/100]), ms(d[len(d)-1]))
}

// cpuNote is the CPU a phase took in this process and in ClickHouse, per
// operation when n > 0.
func cpuNote(l cpuLap, n int) string {
	if n > 0 {
		return fmt.Sprintf("CPU: meterbench %.1f ms, ClickHouse %.1f ms per operation", ms(l.cpu[0])/float64(n), ms(l.cpu[1])/float64(n))
	}
	return fmt.Sprintf("CPU: meterbench %.1f s, ClickHouse %.1f s", l.cpu[0].Seconds(), l.cpu[1].Seconds())
}

// loadAverage is the system's 1, 5 and 15 minute load averages.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// timeRESTExport streams the same export as timeExport through a real
// `meterd --role api` process on the bench's ClickHouse, over REST
// (GET /v1/billing/usage-cost/export with a finance key), to a counter of
// bytes, and samples that process's RSS while it runs.
func timeRESTExport(ctx context.Context, meterd, chAddr string, fmts []export.Format, start, end time.Time,
	phase func(string) (func() cpuLap, error), progress func(string, ...any)) ([]benchResult, error) {
	dir, err := os.MkdirTemp("", "meterbench-billing-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	const key = "meterbench-finance"
	keys, err := json.Marshal(api.KeysFile{Keys: []api.KeyEntry{{Name: "finance", SHA256: api.HashKey(key), Role: api.RoleFinance}}})
	if err != nil {
		return nil, err
	}
	keysFile := filepath.Join(dir, "keys.json")
	if err := os.WriteFile(keysFile, keys, 0o600); err != nil {
		return nil, err
	}
	// Closes would ask Kafka for the ingest lag; an export does not, but
	// meterd wants brokers to point at.
	broker, err := devenv.StartKafka(devenv.KafkaConfig{Addr: "127.0.0.1:0", Partitions: 1})
	if err != nil {
		return nil, err
	}
	defer broker.Close()
	httpAddr := freeAddr()
	cmd := exec.CommandContext(ctx, meterd, "--role", "api", "--clickhouse", chAddr, "--clickhouse-database", "bench_q",
		"--clickhouse-compression", "none", "--kafka-brokers", broker.Addr(), "--auth-keys", keysFile,
		"--http-addr", httpAddr, "--grpc-addr", freeAddr(), "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start meterd: %w", err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}()
	base := "http://" + httpAddr
	for deadline := time.Now().Add(time.Minute); ; {
		resp, err := http.Get(base + "/healthz/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("meterd at %s not ready after a minute (%v)", httpAddr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	pid := cmd.Process.Pid
	var out []benchResult
	for _, f := range fmts {
		progress("REST export %s through meterd (pid %d)", f, pid)
		u := fmt.Sprintf("%s/v1/billing/usage-cost/export?start=%s&end=%s&step=hour&format=%s", base,
			start.Format(time.RFC3339), end.Format(time.RFC3339), f)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+key)
		before, _ := procStatus(pid, "VmRSS")
		watch := watchRSS(pid, 10*time.Millisecond)
		done, err := phase("rest-export-" + string(f))
		if err != nil {
			watch()
			return nil, err
		}
		meterdCPU, _, _ := processCPU(pid)
		t0 := time.Now()
		var cw countWriter
		var first time.Duration
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			first = time.Since(t0)
			if resp.StatusCode != http.StatusOK {
				b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
				err = fmt.Errorf("GET %s: %s: %s", u, resp.Status, bytes.TrimSpace(b))
			} else {
				_, err = io.Copy(&cw, resp.Body)
			}
			resp.Body.Close()
		}
		el := time.Since(t0)
		l := done()
		peak, hwm := watch()
		if err != nil {
			return nil, err
		}
		after, _, _ := processCPU(pid)
		rows, err := strconv.ParseInt(resp.Trailer.Get("X-Export-Rows"), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("GET %s: trailer X-Export-Rows %q: the export did not complete", u, resp.Trailer.Get("X-Export-Rows"))
		}
		rate := float64(rows) / el.Seconds()
		out = append(out, benchResult{
			what: fmt.Sprintf("usage-and-cost export, hourly, %d days, all tenants, %s with finance columns (%d rows, %.0f MiB), REST through meterd --role api",
				int(end.Sub(start)/(24*time.Hour)), f, rows, mib(uint64(cw.n))),
			got:    fmt.Sprintf("%.0f rows/s (%.1f s), meterd peak RSS %.0f MiB", rate, el.Seconds(), mib(max(peak, hwm))),
			target: "≥ 500,000 rows/s, RSS < 200 MiB", ok: rate >= 500_000 && max(peak, hwm) < 200<<20,
			note: fmt.Sprintf("headers after %.2f s; meterd RSS before %.0f MiB, sampled peak %.0f MiB, VmHWM %.0f MiB; CPU: meterd %.1f s, meterbench %.1f s (the client), ClickHouse %.1f s",
				first.Seconds(), mib(before), mib(peak), mib(hwm), (after - meterdCPU).Seconds(), l.cpu[0].Seconds(), l.cpu[1].Seconds()),
		})
	}
	return out, nil
}
