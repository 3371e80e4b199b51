// Package tlsfiles builds crypto/tls configurations from PEM files: the
// server side of meterd's listeners and the client side of its Kafka and
// ClickHouse connections. Certificates, keys and the CA that verifies
// client certificates are read again when their files change (checked at
// most every CheckEvery, on the next handshake), so that a renewed
// certificate is served without a restart; a new set that does not load
// (a key that does not match, a half-written file) is logged and the one in
// use stays.
//
// It does not issue or renew certificates, and the CA a client verifies
// servers with is read once, at start.
package tlsfiles

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"
)

// DefaultCheckEvery is how often, at most, the files are looked at again.
const DefaultCheckEvery = 2 * time.Second

// Options tune how files are watched.
type Options struct {
	// CheckEvery is the least time between two reads of the files. Zero
	// means DefaultCheckEvery.
	CheckEvery time.Duration
	// Logger receives reloads and reload failures. Nil discards them.
	Logger *slog.Logger
	// Now is the clock. Nil means time.Now.
	Now func() time.Time
}

func (o Options) withDefaults() Options {
	if o.CheckEvery <= 0 {
		o.CheckEvery = DefaultCheckEvery
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// watched holds the value parsed from a set of files and parses them again
// when their content changes.
type watched[T any] struct {
	what  string // "certificate", "client CA", for the log
	paths []string
	parse func(contents [][]byte) (T, error)
	opts  Options

	mu       sync.Mutex
	next     time.Time // no read before this
	seen     [][]byte  // contents last parsed, whether they loaded or not
	lastFail string    // the last failure logged, so that it is logged once
	val      T
}

// newWatched reads and parses the files once; an error there is returned.
func newWatched[T any](what string, paths []string, parse func([][]byte) (T, error), opts Options) (*watched[T], error) {
	w := &watched[T]{what: what, paths: paths, parse: parse, opts: opts.withDefaults()}
	contents, err := readAll(paths)
	if err != nil {
		return nil, err
	}
	if w.val, err = parse(contents); err != nil {
		return nil, err
	}
	w.seen = contents
	w.next = w.opts.Now().Add(w.opts.CheckEvery)
	return w, nil
}

// get returns the value in use, first reloading it if CheckEvery has passed
// since the last look and the files changed.
func (w *watched[T]) get() T {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.opts.Now()
	if now.Before(w.next) {
		return w.val
	}
	w.next = now.Add(w.opts.CheckEvery)
	contents, err := readAll(w.paths)
	if err != nil {
		w.fail(err)
		return w.val
	}
	if equalAll(contents, w.seen) {
		return w.val
	}
	w.seen = contents
	v, err := w.parse(contents)
	if err != nil {
		w.fail(err)
		return w.val
	}
	w.val, w.lastFail = v, ""
	w.opts.Logger.Info("TLS "+w.what+" reloaded", "files", w.paths)
	return w.val
}

// fail logs a reload failure, once for as long as it repeats.
func (w *watched[T]) fail(err error) {
	if msg := err.Error(); msg != w.lastFail {
		w.lastFail = msg
		w.opts.Logger.Error("TLS "+w.what+" not reloaded; the one in use stays", "files", w.paths, "error", err)
	}
}

func readAll(paths []string) ([][]byte, error) {
	out := make([][]byte, len(paths))
	for i, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		out[i] = b
	}
	return out, nil
}

func equalAll(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// Pair is a certificate chain and its private key, read from PEM files and
// read again when they change.
type Pair struct {
	w *watched[*tls.Certificate]
}

// NewPair loads the pair; it fails if the files cannot be read or do not
// make a pair.
func NewPair(certFile, keyFile string, opts Options) (*Pair, error) {
	w, err := newWatched("certificate", []string{certFile, keyFile}, parsePair, opts)
	if err != nil {
		return nil, fmt.Errorf("load certificate %s and key %s: %w", certFile, keyFile, err)
	}
	return &Pair{w: w}, nil
}

func parsePair(c [][]byte) (*tls.Certificate, error) {
	cert, err := tls.X509KeyPair(c[0], c[1])
	if err != nil {
		return nil, err
	}
	return &cert, nil
}

// Certificate returns the pair in use.
func (p *Pair) Certificate() *tls.Certificate { return p.w.get() }

// GetCertificate serves the pair as tls.Config.GetCertificate.
func (p *Pair) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return p.w.get(), nil
}

// GetClientCertificate serves the pair as tls.Config.GetClientCertificate.
func (p *Pair) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return p.w.get(), nil
}

// Pool is a set of CA certificates read from a PEM file and read again when
// it changes.
type Pool struct {
	w *watched[*x509.CertPool]
}

// NewPool loads the CA file; it fails if it holds no certificate.
func NewPool(file string, opts Options) (*Pool, error) {
	w, err := newWatched("CA", []string{file}, parsePool, opts)
	if err != nil {
		return nil, fmt.Errorf("load CA %s: %w", file, err)
	}
	return &Pool{w: w}, nil
}

func parsePool(c [][]byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(c[0]) {
		return nil, errors.New("no PEM certificate in the file")
	}
	return pool, nil
}

// CertPool returns the pool in use.
func (p *Pool) CertPool() *x509.CertPool { return p.w.get() }

// Server configures the TLS side of a listener.
type Server struct {
	// CertFile and KeyFile are the server's certificate chain and key (PEM).
	CertFile, KeyFile string
	// ClientCAFile, when set, requires every client to present a
	// certificate signed by one of its CAs (mutual TLS).
	ClientCAFile string
}

// Enabled tells whether any file is set; Validate checks they make sense.
func (s Server) Enabled() bool { return s.CertFile != "" || s.KeyFile != "" || s.ClientCAFile != "" }

// Validate reports every problem at once, loading the files. prefix names
// the flags in messages ("--tls").
func (s Server) Validate(prefix string) error {
	if !s.Enabled() {
		return nil
	}
	var errs []error
	if s.CertFile == "" || s.KeyFile == "" {
		errs = append(errs, fmt.Errorf("%s-cert and %s-key go together", prefix, prefix))
	} else if _, err := NewPair(s.CertFile, s.KeyFile, Options{}); err != nil {
		errs = append(errs, fmt.Errorf("%s-cert, %s-key: %w", prefix, prefix, err))
	}
	if s.ClientCAFile != "" {
		if _, err := NewPool(s.ClientCAFile, Options{}); err != nil {
			errs = append(errs, fmt.Errorf("%s-client-ca: %w", prefix, err))
		}
	}
	return errors.Join(errs...)
}

// Config returns the listener's TLS configuration (TLS 1.2 or later), or
// nil when s is not Enabled. The certificate, and the client CA, are read
// again when their files change.
func (s Server) Config(opts Options) (*tls.Config, error) {
	if !s.Enabled() {
		return nil, nil
	}
	if s.CertFile == "" || s.KeyFile == "" {
		return nil, errors.New("tls: a certificate needs both its file and its key file")
	}
	pair, err := NewPair(s.CertFile, s.KeyFile, opts)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: pair.GetCertificate}
	if s.ClientCAFile != "" {
		pool, err := NewPool(s.ClientCAFile, opts)
		if err != nil {
			return nil, err
		}
		// The handshake asks for a certificate and VerifyConnection checks it
		// against the pool in use, which, unlike ClientCAs, can change.
		cfg.ClientAuth = tls.RequireAnyClientCert
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			return verifyClient(cs.PeerCertificates, pool.CertPool())
		}
	}
	return cfg, nil
}

// verifyClient checks a client's chain against roots, as tls does with
// ClientCAs and RequireAndVerifyClientCert.
func verifyClient(chain []*x509.Certificate, roots *x509.CertPool) error {
	if len(chain) == 0 {
		return errors.New("tls: client certificate required")
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{
		Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return fmt.Errorf("tls: client certificate: %w", err)
	}
	return nil
}

// Client configures the TLS side of a connection to a server (Kafka,
// ClickHouse).
type Client struct {
	// On enables TLS; setting any file enables it too.
	On bool
	// CAFile verifies the server's certificate; empty means the system's
	// roots.
	CAFile string
	// CertFile and KeyFile, when set, are presented to the server (mutual
	// TLS); they are read again when they change.
	CertFile, KeyFile string
	// ServerName is checked against the server's certificate; empty means
	// the host of the address dialed.
	ServerName string
}

// Enabled tells whether TLS is on.
func (c Client) Enabled() bool {
	return c.On || c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" || c.ServerName != ""
}

// Validate reports every problem at once, loading the files. prefix names
// the flags in messages ("--kafka-tls").
func (c Client) Validate(prefix string) error {
	if !c.Enabled() {
		return nil
	}
	var errs []error
	if c.CAFile != "" {
		if _, err := NewPool(c.CAFile, Options{}); err != nil {
			errs = append(errs, fmt.Errorf("%s-ca: %w", prefix, err))
		}
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		errs = append(errs, fmt.Errorf("%s-cert and %s-key go together", prefix, prefix))
	} else if c.CertFile != "" {
		if _, err := NewPair(c.CertFile, c.KeyFile, Options{}); err != nil {
			errs = append(errs, fmt.Errorf("%s-cert, %s-key: %w", prefix, prefix, err))
		}
	}
	return errors.Join(errs...)
}

// Config returns the client's TLS configuration (TLS 1.2 or later), or nil
// when c is not Enabled.
func (c Client) Config(opts Options) (*tls.Config, error) {
	if !c.Enabled() {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName}
	if c.CAFile != "" {
		pool, err := NewPool(c.CAFile, opts)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool.CertPool()
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return nil, errors.New("tls: a client certificate needs both its file and its key file")
	}
	if c.CertFile != "" {
		pair, err := NewPair(c.CertFile, c.KeyFile, opts)
		if err != nil {
			return nil, err
		}
		cfg.GetClientCertificate = pair.GetClientCertificate
	}
	return cfg, nil
}

// IsCertificateError tells whether err is a TLS handshake that failed on a
// certificate (not trusted, another name, expired, refused by the peer) or
// on a peer that does not speak TLS: retrying cannot mend it.
func IsCertificateError(err error) bool {
	var (
		verr   *tls.CertificateVerificationError
		alert  tls.AlertError
		record tls.RecordHeaderError
		unk    x509.UnknownAuthorityError
		host   x509.HostnameError
		inval  x509.CertificateInvalidError
	)
	if errors.As(err, &verr) || errors.As(err, &alert) || errors.As(err, &record) ||
		errors.As(err, &unk) || errors.As(err, &host) || errors.As(err, &inval) {
		return true
	}
	// An alert from the peer (certificate required, bad certificate,
	// unknown CA) comes as a net.OpError "remote error".
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "remote error"
}
