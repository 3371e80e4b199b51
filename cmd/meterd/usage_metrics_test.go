package main

import "testing"

// TestUsageMetricsFlags: --usage-metrics and its cap and interval.
func TestUsageMetricsFlags(t *testing.T) {
	dev := []string{"--dev", "--data-dir", "d"}
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr []string
	}{
		{"on with defaults", append(dev, "--usage-metrics"), nil, nil},
		{"own cap and interval", append(dev, "--usage-metrics", "--usage-metrics-max-series", "500", "--usage-metrics-interval", "1m"), nil, nil},
		{"from the environment", dev, map[string]string{"METER_USAGE_METRICS": "true", "METER_USAGE_METRICS_MAX_SERIES": "0"},
			[]string{"--usage-metrics-max-series 0: must be at least 1"}},
		{"interval too short", append(dev, "--usage-metrics-interval", "100ms"), nil, []string{"--usage-metrics-interval 100ms: must be at least 1s"}},
		{"needs the api role", []string{"--role", "ingest", "--clickhouse", "h:9000", "--usage-metrics"}, nil,
			[]string{"--usage-metrics is served by the api role"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkParse(t, tt.args, tt.env, tt.wantErr)
		})
	}
}
