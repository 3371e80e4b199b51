package closing

import (
	"context"
	"slices"
	"sync"
	"time"

	"tokenmeter/billing"
	"tokenmeter/billing/export"
)

// Regions gives FOCUS rows their region (RegionId, RegionName): a
// Statements store that implements it (*chstore.Store does) is asked for
// the regions of the deployments in the exported range. Without it, the
// rows' region is null.
type Regions interface {
	// DeploymentRegions returns the regions each deployment's GPU samples
	// name in [start, end), sorted; deployments without are absent.
	DeploymentRegions(ctx context.Context, start, end time.Time) (map[string][]string, error)
}

// ExportOptions are the export options of a reader: finance's columns (and,
// in FOCUS files, deployment names and price book versions) for finance,
// and the names of the accounts file (operator, tenants' billing accounts
// and display names) for everyone.
func (s *Service) ExportOptions(finance bool) export.Options {
	return export.Options{Finance: finance, Accounts: s.cfg.Accounts}
}

// StatementRows is the export rows of a statement as v shows it
// (export.StatementRows): its lines with their regions (those its close
// recorded, billing.StatementLine.Region; read now for a statement closed
// before regions were recorded, or when its close knew none), its charges, its
// rounding row, every row with the number of the statement's invoice
// (FOCUS InvoiceId) once it is issued; and, when the invoice has tax, a
// tax row, so that the rows of an InvoiceId add up to the invoice's total.
func (s *Service) StatementRows(ctx context.Context, v StatementView) ([]export.StatementRow, error) {
	st := v.Statement
	rows := export.StatementRows(st)
	recorded := slices.ContainsFunc(st.Lines, func(l billing.StatementLine) bool { return l.Region != "" })
	var regions regionMap
	if !recorded {
		var err error
		if regions, err = s.regions(ctx, st.PeriodStart, st.PeriodEnd); err != nil {
			return nil, err
		}
	}
	inv, issued, err := s.invoiceOf(ctx, st)
	if err != nil {
		return nil, err
	}
	for i := range rows {
		if rows[i].Kind == export.RowLine {
			if recorded {
				rows[i].Region = rows[i].Line.Region
			} else {
				rows[i].Region = regions.of(rows[i].Line.Deployment)
			}
		}
		rows[i].InvoiceID = inv.Number
	}
	if issued && inv.Tax != 0 {
		tax := rows[len(rows)-1] // the rounding row's identity
		tax.Kind, tax.Tax = export.RowTax, &export.Tax{Name: inv.TaxName, Rate: inv.TaxRate, Amount: inv.Tax}
		rows = append(rows, tax)
	}
	return rows, nil
}

// invoiceOf is the invoice of st (its revision), if issued.
func (s *Service) invoiceOf(ctx context.Context, st billing.Statement) (billing.Invoice, bool, error) {
	if st.Hash == "" { // a draft has no invoice
		return billing.Invoice{}, false, nil
	}
	docs, err := s.d.Store.Invoices(ctx, st.Period, st.Tenant)
	if err != nil {
		return billing.Invoice{}, false, err
	}
	for _, d := range docs {
		if d.Kind == billing.KindInvoice && d.Revision == st.Revision {
			inv, err := d.Decode()
			return inv, err == nil, err
		}
	}
	return billing.Invoice{}, false, nil
}

// regionMap is the regions of deployments over a range.
type regionMap map[string][]string

// of is deployment's region: its one region, or, for a line not per
// deployment (""), the one region of every deployment; "" when there is
// none or several.
func (m regionMap) of(deployment string) string {
	if deployment != "" {
		if r := m[deployment]; len(r) == 1 {
			return r[0]
		}
		return ""
	}
	one := ""
	for _, rs := range m {
		for _, r := range rs {
			if one != "" && r != one {
				return ""
			}
			one = r
		}
	}
	return one
}

// recordRegions sets the region of each of st's lines from the regions of
// the deployments over its period (as the export reads them), so that a
// closed period's FOCUS regions never change: not when samples name
// another region later, not when they are past retention. The statement's
// hash is computed again.
func (c *Closer) recordRegions(ctx context.Context, st *billing.Statement) error {
	if len(st.Lines) == 0 {
		return nil
	}
	regions, err := readRegions(ctx, c.store, &c.regionsSeen, time.Now(), st.PeriodStart, st.PeriodEnd)
	if err != nil || regions == nil {
		return err
	}
	for i := range st.Lines {
		st.Lines[i].Region = regions.of(st.Lines[i].Deployment)
	}
	st.Hash, err = st.ContentHash()
	return err
}

// regions reads the regions of the deployments over [start, end), whole
// hours; none when the store cannot say. A range read in the last
// regionsFresh is not read again: an export of a period's statements
// reads each zone's month once, not once per statement.
func (s *Service) regions(ctx context.Context, start, end time.Time) (regionMap, error) {
	return readRegions(ctx, s.d.Store, &s.regionsSeen, s.cfg.Now(), start, end)
}

// readRegions is Service.regions from store with cache at now.
func readRegions(ctx context.Context, store any, cache *regionCache, now time.Time, start, end time.Time) (regionMap, error) {
	r, ok := store.(Regions)
	if !ok {
		return nil, nil
	}
	if h := end.UTC().Truncate(time.Hour); h.Before(end) {
		end = h.Add(time.Hour) // the hour holding the end is in the range
	}
	key := [2]time.Time{start.UTC().Truncate(time.Hour), end.UTC()}
	if m, ok := cache.get(key, now); ok {
		return m, nil
	}
	m, err := r.DeploymentRegions(ctx, key[0], key[1])
	if err != nil {
		return nil, err
	}
	cache.put(key, regionMap(m), now)
	return regionMap(m), nil
}

// regionsFresh is how long a range's regions are reused.
const regionsFresh = time.Minute

// regionCache is the regions of the last few ranges read, with the time
// each was read.
type regionCache struct {
	mu      sync.Mutex
	entries map[[2]time.Time]regionEntry
}

type regionEntry struct {
	regions regionMap
	at      time.Time
}

func (c *regionCache) get(key [2]time.Time, now time.Time) (regionMap, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok || now.Sub(e.at) > regionsFresh || now.Before(e.at) {
		return nil, false
	}
	return e.regions, true
}

func (c *regionCache) put(key [2]time.Time, m regionMap, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil || len(c.entries) >= 64 {
		c.entries = map[[2]time.Time]regionEntry{} // a handful of zones' months: start over rather than evict
	}
	c.entries[key] = regionEntry{regions: m, at: now}
}
