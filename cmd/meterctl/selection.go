package main

import (
	"flag"
	"fmt"
	"slices"
	"strings"
	"time"
)

// selection is what every query command (usage and the series commands)
// takes: how to reach the API, the tenant, the range, the group-by
// dimensions and the output.
type selection struct {
	connConfig
	// shape is the selector the endpoint takes.
	shape  selectorShape
	Tenant string
	// Start (inclusive) and End (exclusive) lie on whole units of the
	// shape when it names its unit.
	Start, End   time.Time
	GroupBy      []string
	Output       string
	ValidateOnly bool
}

// register adds the connection flags and --tenant (when shape takes one),
// --start, --end, --group-by, --output and --validate to fs; jsonHolds says
// what --output json writes. The returned function completes c once fs has
// parsed the arguments: --end defaults to now rounded down to shape's unit.
func (c *selection) register(fs *flag.FlagSet, shape selectorShape, jsonHolds string) (finish func(getenv func(string) string, now time.Time) error) {
	c.shape = shape
	c.connConfig.register(fs)
	if shape.tenant {
		fs.StringVar(&c.Tenant, "tenant", "", "only this tenant (a tenant key always sees only its own)")
	}
	onUnit, endDefault := "", "now"
	if shape.unitName != "" {
		onUnit, endDefault = " on a whole "+shape.unitName, "now, rounded down to the "+shape.unitName
	}
	start := fs.String("start", "", "inclusive start"+onUnit+", RFC 3339 or a date such as 2026-11-23 (default: 24h before --end)")
	end := fs.String("end", "", "exclusive end"+onUnit+", RFC 3339 or a date (default: "+endDefault+")")
	groupBy := fs.String("group-by", "", "comma-separated dimensions: "+strings.Join(shape.groupFields, ", "))
	fs.StringVar(&c.Output, "output", "table", "table, csv or json ("+jsonHolds+")")
	fs.BoolVar(&c.ValidateOnly, "validate", false, "check the flags and exit")
	return func(getenv func(string) string, now time.Time) error {
		c.connConfig.resolve(getenv)
		var err error
		c.Start, c.End, err = timeRange(*start, *end, now.UTC().Truncate(shape.unit))
		c.GroupBy = splitList(*groupBy)
		return err
	}
}

// validate reports every problem of c.
func (c selection) validate() []error {
	errs := c.connConfig.validate()
	if c.shape.unitName != "" {
		for _, t := range []struct {
			flag string
			at   time.Time
		}{{"--start", c.Start}, {"--end", c.End}} {
			if !t.at.Truncate(c.shape.unit).Equal(t.at) {
				errs = append(errs, fmt.Errorf("%s %s: must be a whole %s", t.flag, t.at.Format(time.RFC3339Nano), c.shape.unitName))
			}
		}
	}
	if !c.Start.Before(c.End) {
		errs = append(errs, fmt.Errorf("--start %s is not before --end %s", c.Start.Format(time.RFC3339), c.End.Format(time.RFC3339)))
	}
	for _, g := range c.GroupBy {
		if !slices.Contains(c.shape.groupFields, g) {
			errs = append(errs, fmt.Errorf("--group-by %q: want any of %s", g, strings.Join(c.shape.groupFields, ", ")))
		}
	}
	if !slices.Contains(outputs, c.Output) {
		errs = append(errs, fmt.Errorf("--output %q: want %s", c.Output, strings.Join(outputs, ", ")))
	}
	return errs
}
