package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// -h prints the flags and succeeds, without "flag: help requested".
func TestHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"-h"}, func(string) string { return "" }, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run -h: %v", err)
	}
	if !strings.Contains(stderr.String(), "-kafka-brokers") {
		t.Errorf("usage does not list the flags:\n%s", stderr.String())
	}
}
