package envflag

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParse(t *testing.T) {
	env := map[string]string{"METER_BATCH_SIZE": "7", "METER_NAME": "from-env", "METER_BAD": "x"}
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    [2]any
		wantErr bool
	}{
		{"flags win over env", []string{"--batch-size", "3", "--name", "cli", "--bad", "2"}, env, [2]any{3, "cli"}, false},
		{"env fills the rest", []string{"--bad", "1"}, env, [2]any{7, "from-env"}, false},
		{"bad env value", nil, env, [2]any{7, "from-env"}, true},
		{"positional args", []string{"extra"}, nil, [2]any{1, "def"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := flag.NewFlagSet("x", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			n := fs.Int("batch-size", 1, "")
			s := fs.String("name", "def", "")
			fs.Int("bad", 0, "")
			err := Parse(fs, tt.args, func(k string) string { return tt.env[k] })
			if (err != nil) != tt.wantErr {
				t.Fatalf("err %v, want error %v", err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, [2]any{*n, *s}); diff != "" {
				t.Errorf("values (-want +got):\n%s", diff)
			}
		})
	}
	if got := List(" a, b,,c ,"); !cmp.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("List: %q", got)
	}
}

func TestSecret(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	withNewline, empty := file("pw", "s3cret \n"), file("empty", "\n")
	tests := []struct {
		name      string
		file, env string
		want      string
		wantErr   bool
	}{
		{"neither", "", "", "", false},
		{"environment", "", "from-env", "from-env", false},
		{"file, newline dropped, spaces kept", withNewline, "", "s3cret ", false},
		{"both", withNewline, "from-env", "", true},
		{"unreadable file", filepath.Join(dir, "missing"), "", "", true},
		{"empty file", empty, "", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Secret("db-password-file", tt.file, "METER_DB_PASSWORD", tt.env)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("got %q, %v; want %q, error: %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}
