package api

import (
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"strings"
	"testing"
)

// TestVendoredFilesMatchVersion checks the vendored Swagger UI files
// against the checksums scripts/vendor-swagger-ui.sh recorded in VERSION
// when it copied them from npm: the embedded renderer is the published
// package's, not a hand-edited copy.
func TestVendoredFilesMatchVersion(t *testing.T) {
	const dir = "ui/vendor/swagger-ui"
	version, err := fs.ReadFile(dashboardFiles, dir+"/VERSION")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, line := range strings.Split(string(version), "\n") {
		sum, name, ok := strings.Cut(line, "  ")
		if !ok || len(sum) != 64 {
			continue
		}
		b, err := fs.ReadFile(dashboardFiles, dir+"/"+name)
		if err != nil {
			t.Errorf("VERSION lists %s: %v", name, err)
			continue
		}
		got := sha256.Sum256(b)
		if hex.EncodeToString(got[:]) != sum {
			t.Errorf("%s: sha256 %x, VERSION says %s (re-run scripts/vendor-swagger-ui.sh)", name, got, sum)
		}
		checked++
	}
	if checked < 2 {
		t.Errorf("VERSION lists %d checksums, want the bundle's and the stylesheet's", checked)
	}
}
