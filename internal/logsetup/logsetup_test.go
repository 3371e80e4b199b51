package logsetup_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"tokenmeter/internal/logsetup"
)

func TestCheckLevel(t *testing.T) {
	for _, tt := range []struct {
		name    string
		wantErr string
	}{
		{"debug", ""}, {"info", ""}, {"warn", ""}, {"error", ""},
		{"", `--log-level "": want debug, info, warn or error`},
		{"INFO", `--log-level "INFO": want debug, info, warn or error`},
		{"trace", `--log-level "trace": want debug, info, warn or error`},
	} {
		err := logsetup.CheckLevel(tt.name)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tt.wantErr {
			t.Errorf("CheckLevel(%q): got error %q, want %q", tt.name, got, tt.wantErr)
		}
	}
}

func TestJSONFiltersByLevel(t *testing.T) {
	for _, tt := range []struct {
		level string
		want  []string
	}{
		{"debug", []string{"debug line", "info line", "warn line", "error line"}},
		{"info", []string{"info line", "warn line", "error line"}},
		{"warn", []string{"warn line", "error line"}},
		{"error", []string{"error line"}},
	} {
		var buf bytes.Buffer
		logger := logsetup.JSON(&buf, tt.level)
		logger.Debug("debug line")
		logger.Info("info line")
		logger.Warn("warn line")
		logger.Error("error line")
		var got []string
		for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			var rec struct{ Msg string }
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Fatalf("level %s: line %q is not JSON: %v", tt.level, line, err)
			}
			got = append(got, rec.Msg)
		}
		if strings.Join(got, "|") != strings.Join(tt.want, "|") {
			t.Errorf("level %s: got %q, want %q", tt.level, got, tt.want)
		}
	}
}

func TestWarningsWritesTextFromWarn(t *testing.T) {
	var buf bytes.Buffer
	logger := logsetup.Warnings(&buf)
	logger.Info("info line")
	logger.Warn("warn line", "k", "v")
	got := strings.TrimSpace(buf.String())
	if strings.Contains(got, "info line") || !strings.Contains(got, `level=WARN msg="warn line" k=v`) {
		t.Errorf("got %q, want only the warning as text", got)
	}
}
