package main

import (
	"fmt"
	"os"
	"path/filepath"
)

// outputFile is the file of -o, written through a temporary file beside it
// and renamed to its name by Commit: a failed or interrupted write leaves
// no file of that name (and an older one untouched).
type outputFile struct {
	dest string
	tmp  *os.File
}

// createOutput starts writing dest.
func createOutput(dest string) (*outputFile, error) {
	tmp, err := os.CreateTemp(filepath.Dir(dest), "."+filepath.Base(dest)+".*.part")
	if err != nil {
		return nil, fmt.Errorf("-o %s: %w", dest, err)
	}
	return &outputFile{dest: dest, tmp: tmp}, nil
}

func (f *outputFile) Write(p []byte) (int, error) { return f.tmp.Write(p) }

// Commit makes what was written the file dest (mode 0644, synced).
func (f *outputFile) Commit() error {
	for _, step := range []func() error{func() error { return f.tmp.Chmod(0o644) }, f.tmp.Sync, f.tmp.Close,
		func() error { return os.Rename(f.tmp.Name(), f.dest) }} {
		if err := step(); err != nil {
			return fmt.Errorf("-o %s: %w", f.dest, err)
		}
	}
	f.tmp = nil
	return nil
}

// Discard removes what was written unless it was committed; deferred
// after createOutput.
func (f *outputFile) Discard() {
	if f.tmp != nil {
		f.tmp.Close()
		os.Remove(f.tmp.Name())
		f.tmp = nil
	}
}
