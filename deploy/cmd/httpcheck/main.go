// Command httpcheck is the health check of tokenmeter's container images,
// which have no shell, curl or wget: it GETs a URL and exits 0 when the
// answer is 2xx, 1 otherwise (compose's healthcheck, docker's HEALTHCHECK).
//
//	httpcheck http://127.0.0.1:8080/healthz/ready
//	httpcheck --timeout 2s --insecure https://127.0.0.1:8080/healthz/live
//
// --insecure skips verifying the server's certificate: the check dials the
// container's own listener, whose certificate names the Service, not
// 127.0.0.1.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "httpcheck:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("httpcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	timeout := fs.Duration("timeout", 3*time.Second, "longest time for the whole request")
	insecure := fs.Bool("insecure", false, "do not verify the server's TLS certificate")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("want one URL, such as http://127.0.0.1:8080/healthz/ready")
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fs.Arg(0), nil)
	if err != nil {
		return fmt.Errorf("request: %w", err)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if *insecure {
		tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} // the container's own listener: see the package doc
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return fmt.Errorf("get %s: %w", fs.Arg(0), err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16)); err != nil {
		return fmt.Errorf("read answer of %s: %w", fs.Arg(0), err)
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("get %s: %s", fs.Arg(0), resp.Status)
	}
	return nil
}
