package chstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"tokenmeter/query"
)

// The read side's SQL: package query plans each read (which level of the
// rollups, which hours from raw events, which days from the day rollups,
// who merges) and this package turns the plan into SQL and scans the rows.
// This file holds what every read shares.

// classify wraps errors that are not answers of the server (connection
// refused, reset, timeouts) with query.ErrUnavailable, for reads and writes
// alike: the API maps it to Unavailable whichever call met it.
func classify(err error) error {
	if err == nil {
		return nil
	}
	var ex *clickhouse.Exception
	if errors.As(err, &ex) {
		return err
	}
	return fmt.Errorf("%w: %w", query.ErrUnavailable, err)
}

// levelTables are the tables of the rollup levels.
var levelTables = map[query.Level]string{
	query.LevelMinute:     "rollup_minute_recent",
	query.LevelHour:       "rollup_hour",
	query.LevelTenantHour: "rollup_tenant_hour",
	query.LevelTotalHour:  "rollup_total_hour",
	// Written since migration 0011, and for older hours by it.
	query.LevelDeploymentHour: "rollup_deployment_hour",
}

// stepExpr buckets the DateTime expression col by steps of width seconds
// (0: the whole range, -1: calendar months), as Unix seconds (UInt32); the
// whole range's step is its start, a bound argument.
func stepExpr(col string, width int64, start time.Time) (string, []any) {
	switch {
	case width > 0:
		return fmt.Sprintf("toUInt32(intDiv(toUInt32(%s), %d) * %d)", col, width, width), nil
	case width < 0:
		return fmt.Sprintf("toUInt32(toDateTime(toStartOfMonth(%s, 'UTC'), 'UTC'))", col), nil
	}
	return "toUInt32(?)", []any{start.Unix()}
}

// hourList writes hours as a ClickHouse IN list of Unix seconds.
func hourList(hours []time.Time) string {
	parts := make([]string, len(hours))
	for i, h := range hours {
		parts[i] = strconv.FormatInt(h.Unix(), 10)
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// scope is the WHERE clause (and its arguments) of a read of the rows of
// [start, end) of time column col, of one tenant when tenant is not empty.
func scope(col string, start, end time.Time, tenant string) (string, []any) {
	where := col + " >= toDateTime(?) AND " + col + " < toDateTime(?)"
	args := []any{start.Unix(), end.Unix()}
	if tenant != "" {
		where += " AND tenant_id = ?"
		args = append(args, tenant)
	}
	return where, args
}

// newestRows is the FROM clause (and its arguments) of a read of the rows
// of table whose time column (bucket or hour) and tenant match scope, and
// that pass filter (an expression without arguments). For the hour rollups
// and the cost tables these are the rows of the newest computation of each
// hour: a computation writes all its rows of a table in one INSERT, with
// one version, and no tenant or group ever drops out of a later one (events
// and samples stay), so this is FINAL's answer without FINAL's merge of
// every part (on 18.16, a tenant's month of latency 0.39 s with FINAL,
// 0.12 s without; every tenant's month of cost 1.8 s, 0.36 s).
// rollup_minute_recent, written in several inserts per hour, is read with FINAL.
func newestRows(table, timeCol, scope string, scopeArgs []any, filter string) (string, []any) {
	where := scope
	if filter != "" {
		where += " AND " + filter
	}
	if table == "rollup_minute_recent" {
		return fmt.Sprintf("%s FINAL\nWHERE %s", table, where), scopeArgs
	}
	final := ""
	if table == "rollup_deployment_hour" {
		// Two replicas that ran migration 0011's backfill at once wrote
		// the same rows at the same version; FINAL keeps one of each until
		// the merge does (the table holds a few rows an hour).
		final = " FINAL"
	}
	return fmt.Sprintf("%[1]s%[5]s\nWHERE %[2]s\n  AND (%[3]s, version) IN (SELECT %[3]s, max(version) FROM %[1]s WHERE %[4]s GROUP BY %[3]s)",
		table, where, timeCol, scope, final), slices.Concat(scopeArgs, scopeArgs)
}

// withDays is the FROM clause of a read of the columns cols (a list) of
// rollup_tenant_hour in the range and scope of where in which days are read
// from rollup_tenant_day: the newest rows of those days, and of the other
// hours.
func withDays(cols string, days []time.Time, where string, whereArgs []any) (string, []any) {
	list := hourList(days)
	dayFrom, dayArgs := newestRows("rollup_tenant_day", "bucket", where, whereArgs, "toUInt32(bucket) IN "+list)
	hourFrom, hourArgs := newestRows("rollup_tenant_hour", "bucket", where, whereArgs, "intDiv(toUInt32(bucket), 86400) * 86400 NOT IN "+list)
	return fmt.Sprintf("(\n  SELECT %[1]s\n  FROM %[2]s\n  UNION ALL\n  SELECT %[1]s\n  FROM %[3]s\n)", cols, dayFrom, hourFrom),
		slices.Concat(dayArgs, hourArgs)
}

// stepKey reads the leading columns of a grouped row: the step's start
// (Unix seconds) and the group-by values.
type stepKey struct {
	b      uint32
	groups []string
}

func newStepKey(fields int) *stepKey { return &stepKey{groups: make([]string, fields)} }

// dest returns scan destinations for the key columns, then more.
func (k *stepKey) dest(more ...any) []any {
	d := make([]any, 0, 1+len(k.groups)+len(more))
	d = append(d, &k.b)
	for i := range k.groups {
		d = append(d, &k.groups[i])
	}
	return append(d, more...)
}

// start is the step's start; for a step of the whole range (width 0), the
// range's start.
func (k *stepKey) start(width int64, rangeStart time.Time) time.Time {
	if width == 0 {
		return rangeStart.UTC()
	}
	return time.Unix(int64(k.b), 0).UTC()
}

// id identifies the step and group, as a map key (query.StepID).
func (k *stepKey) id() string { return query.StepID(int64(k.b), k.groups) }

func groupMap(fields, values []string) map[string]string {
	g := make(map[string]string, len(fields))
	for i, f := range fields {
		g[f] = values[i]
	}
	return g
}

// parseArray parses ClickHouse's text form of an array of integers of the
// given bit size (16: Int16, 64: UInt64), such as "[-3,0,17]", in one pass.
func parseArray[T int16 | uint64](text string, bits int) ([]T, error) {
	if len(text) < 2 || text[0] != '[' || text[len(text)-1] != ']' {
		return nil, fmt.Errorf("not an array: %.40q", text)
	}
	body := text[1 : len(text)-1]
	if body == "" {
		return nil, nil
	}
	signed := bits < 64
	out := make([]T, 0, strings.Count(body, ",")+1)
	var (
		v      uint64
		neg    bool
		digits int
	)
	for i := 0; i <= len(body); i++ {
		if i == len(body) || body[i] == ',' {
			switch {
			case digits == 0:
				return nil, fmt.Errorf("bad array element in %.40q", text)
			case signed && !neg && v > math.MaxInt16, signed && neg && v > -math.MinInt16:
				return nil, fmt.Errorf("array element out of range in %.40q", text)
			case neg:
				out = append(out, T(-int64(v)))
			default:
				out = append(out, T(v))
			}
			v, neg, digits = 0, false, 0
			continue
		}
		c := body[i]
		switch {
		case c == '-' && signed && digits == 0 && !neg:
			neg = true
		case c >= '0' && c <= '9':
			d := uint64(c - '0')
			if v > (math.MaxUint64-d)/10 {
				return nil, fmt.Errorf("array element out of range in %.40q", text)
			}
			v = v*10 + d
			digits++
		default:
			return nil, fmt.Errorf("bad array element in %.40q", text)
		}
	}
	return out, nil
}

// ReadSQL is the SQL and arguments a read runs: r is a query.UsageRead,
// query.RollupRead, query.TrafficRead, a normalized query.CostQuery or
// query.GPUUsageQuery, or a normalized query.RollupQuery (its raw latency
// read). For logs, explanations and tests of what reaches ClickHouse.
func ReadSQL(r any) (string, []any, error) {
	var (
		stmt string
		args []any
	)
	switch r := r.(type) {
	case query.UsageRead:
		stmt, args = usageSQL(r)
	case query.RollupRead:
		stmt, args = rollupSQL(r)
	case query.TrafficRead:
		stmt, args = trafficSQL(r)
	case query.RollupQuery:
		stmt, args = rawLatencySQL(r)
	case query.CostQuery:
		return costSQL(r)
	case query.GPUUsageQuery:
		stmt, args = gpuUsageSQL(r)
	case query.EngineQuery:
		stmt, args = engineSQL(r)
	default:
		return "", nil, fmt.Errorf("no SQL for a read of type %T", r)
	}
	return stmt, args, nil
}

// each runs a read, scanning each row into dest and then calling row, which
// copies out what it keeps (dest is reused). Errors name what is read.
func (s *Store) each(ctx context.Context, what, stmt string, args, dest []any, row func() error) error {
	rows, err := s.conn.Query(ctx, stmt, args...)
	if err != nil {
		return fmt.Errorf("query %s: %w", what, classify(err))
	}
	defer rows.Close()
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return fmt.Errorf("scan %s: %w", what, err)
		}
		if err := row(); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read %s: %w", what, classify(err))
	}
	return nil
}

// quoteString writes s as a ClickHouse string literal, for filters that take
// no arguments.
func quoteString(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}
