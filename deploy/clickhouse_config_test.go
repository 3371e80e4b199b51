package deploy

import (
	"encoding/xml"
	"os"
	"strings"
	"testing"
)

// TestComposeClickHouseCompression: compose's ClickHouse writes merged parts
// of 10 MiB or more with ZSTD and leaves inserts in LZ4, the section that
// docs/operations.md ("ClickHouse settings for production") gives operators.
func TestComposeClickHouseCompression(t *testing.T) {
	b, err := os.ReadFile("compose/clickhouse/tokenmeter.xml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Cases []struct {
			MinPartSize      int64   `xml:"min_part_size"`
			MinPartSizeRatio float64 `xml:"min_part_size_ratio"`
			Method           string  `xml:"method"`
		} `xml:"compression>case"`
	}
	if err := xml.Unmarshal(b, &cfg); err != nil {
		t.Fatalf("tokenmeter.xml does not parse: %v", err)
	}
	if len(cfg.Cases) != 1 {
		t.Fatalf("compression cases: got %d, want 1", len(cfg.Cases))
	}
	c := cfg.Cases[0]
	if c.Method != "zstd" || c.MinPartSize != 10<<20 || c.MinPartSizeRatio != 0 {
		t.Errorf("compression case: got %+v, want zstd from 10 MiB (10485760), ratio 0", c)
	}
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<min_part_size>10485760</min_part_size>", "<method>zstd</method>"} {
		if !strings.Contains(string(doc), want) {
			t.Errorf("docs/operations.md does not give %s", want)
		}
	}
}
