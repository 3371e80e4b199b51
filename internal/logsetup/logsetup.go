// Package logsetup builds the binaries' loggers, so that every binary names
// its levels and writes its lines the same way: services (meterd,
// gpu-agent) write JSON lines from the level --log-level names, tools and
// test helpers write text lines, warnings and errors only.
package logsetup

import (
	"fmt"
	"io"
	"log/slog"
)

// CheckLevel reports an error naming --log-level unless name is one of
// the levels a service accepts: debug, info, warn or error.
func CheckLevel(name string) error {
	switch name {
	case "debug", "info", "warn", "error":
		return nil
	}
	return fmt.Errorf("--log-level %q: want debug, info, warn or error", name)
}

// JSON returns a service's logger: JSON lines on w from the level named
// by name, which CheckLevel accepted (any other name logs from info).
func JSON(w io.Writer, name string) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(name))
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
}

// Warnings returns a tool's or test helper's logger: text lines on w,
// warnings and errors only.
func Warnings(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}
