// Package envflag parses a binary's flags with environment fallbacks: a
// flag not given on the command line takes METER_<NAME> (upper case, "-"
// as "_"), so --batch-size falls back to METER_BATCH_SIZE.
package envflag

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
)

// EnvName is the environment variable a flag falls back to.
func EnvName(flagName string) string {
	return "METER_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Parse parses args into fs, refuses positional arguments, then sets every
// flag that was not given from its environment variable, if set. Errors
// name the variable and value, and are joined.
func Parse(fs *flag.FlagSet, args []string, getenv func(string) string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		env := EnvName(f.Name)
		if v := getenv(env); v != "" && !given[f.Name] {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", env, v, err))
			}
		}
	})
	return errors.Join(errs...)
}

// List splits a comma-separated flag value, dropping blanks.
func List(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// Secret returns a secret (a password) given either in a file, named by the
// flag fileFlag, so that it never shows in a process listing, or in the
// environment variable envName, whose value is envValue; giving both is an
// error. The file's trailing newline is dropped. Neither given is "".
func Secret(fileFlag, file, envName, envValue string) (string, error) {
	switch {
	case file != "" && envValue != "":
		return "", fmt.Errorf("--%s and %s are both set: give one", fileFlag, envName)
	case file == "":
		return envValue, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("--%s: %w", fileFlag, err)
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return "", fmt.Errorf("--%s %s: the file is empty", fileFlag, file)
	}
	return s, nil
}
