package closing

import (
	"context"
	"time"

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

// StatementRows is the export rows of a statement as v shows it: its lines
// with their regions, then its rounding row (export.StatementRows).
func (s *Service) StatementRows(ctx context.Context, v StatementView) ([]export.StatementRow, error) {
	st := v.Statement
	rows := export.StatementRows(st)
	regions, err := s.regions(ctx, st.PeriodStart, st.PeriodEnd)
	if err != nil {
		return nil, err
	}
	for i := range rows {
		if rows[i].Kind == export.RowLine {
			rows[i].Region = regions.of(rows[i].Line.Deployment)
		}
	}
	return rows, nil
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

// regions reads the regions of the deployments over [start, end), whole
// hours; none when the store cannot say.
func (s *Service) regions(ctx context.Context, start, end time.Time) (regionMap, error) {
	r, ok := s.d.Store.(Regions)
	if !ok {
		return nil, nil
	}
	if h := end.UTC().Truncate(time.Hour); h.Before(end) {
		end = h.Add(time.Hour) // the hour holding the end is in the range
	}
	m, err := r.DeploymentRegions(ctx, start.UTC().Truncate(time.Hour), end.UTC())
	return regionMap(m), err
}
