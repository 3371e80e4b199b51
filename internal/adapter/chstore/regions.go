package chstore

import (
	"context"
	"time"
)

// regionsSQL is the query of DeploymentRegions: the regions of each
// deployment's GPU samples in [start, end), from the GPU cost rows
// (gpu_hour keeps the samples' region per deployment-hour).
func regionsSQL(start, end time.Time) (string, []any) {
	where, args := scope("hour", start, end, "")
	return "SELECT deployment, arraySort(groupUniqArray(region)) FROM gpu_hour WHERE " + where +
		" AND region != '' GROUP BY deployment ORDER BY deployment", args
}

// DeploymentRegions returns the regions each deployment's GPU samples name
// in [start, end) (whole hours), sorted; a deployment without samples, or
// whose samples name no region, is absent. The billing exports give FOCUS
// rows their RegionId from it.
func (s *Store) DeploymentRegions(ctx context.Context, start, end time.Time) (map[string][]string, error) {
	stmt, args := regionsSQL(start, end)
	out := map[string][]string{}
	var (
		dep     string
		regions []string
	)
	err := s.each(ctx, "deployment regions", stmt, args, []any{&dep, &regions}, func() error {
		out[dep] = append([]string(nil), regions...)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
