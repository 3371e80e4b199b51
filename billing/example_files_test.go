package billing

import (
	"os"
	"testing"
)

// The price books shipped for people to copy must stay valid.
func TestShippedPriceBooksParse(t *testing.T) {
	for _, path := range []string{"../deploy/prices.example.json", "../testdata/billing/prices/example.json"} {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ParsePriceBook(data); err != nil {
			t.Errorf("%s: %v", path, err)
		}
	}
}
