// Package kafkaconn builds how every Kafka client of tokenmeter connects:
// TLS (a CA, an optional client certificate, the server name) and SASL
// (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512), as the kafka-go Dialer that readers
// and consumer groups take and the Transport that writers take. meterd's
// consumers, dead-letter writer, publisher and rollup lease, and gpu-agent's
// producer, all get theirs here, from one Config.
//
// It does not choose brokers, topics or groups.
package kafkaconn

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"

	"tokenmeter/internal/tlsfiles"
)

// SASL mechanisms.
const (
	Plain       = "PLAIN"
	ScramSHA256 = "SCRAM-SHA-256"
	ScramSHA512 = "SCRAM-SHA-512"
)

// Mechanisms are the SASL mechanisms supported.
var Mechanisms = []string{Plain, ScramSHA256, ScramSHA512}

// Config is how to connect to the brokers. The zero Config is plaintext
// without authentication.
type Config struct {
	TLS tlsfiles.Client
	// SASLMechanism is one of Mechanisms (case-insensitive); empty means
	// no SASL.
	SASLMechanism string
	Username      string
	Password      string
}

// Validate reports every problem at once, loading the TLS files. The
// messages name meterd's and gpu-agent's flags.
func (c Config) Validate() error {
	var errs []error
	if err := c.TLS.Validate("--kafka-tls"); err != nil {
		errs = append(errs, err)
	}
	mech := strings.ToUpper(c.SASLMechanism)
	switch {
	case mech == "":
		if c.Username != "" || c.Password != "" {
			errs = append(errs, errors.New("--kafka-sasl-user or a password given without --kafka-sasl-mechanism"))
		}
	case !slices.Contains(Mechanisms, mech):
		errs = append(errs, fmt.Errorf("--kafka-sasl-mechanism %q: want %s", c.SASLMechanism, strings.Join(Mechanisms, ", ")))
	default:
		if c.Username == "" {
			errs = append(errs, fmt.Errorf("--kafka-sasl-mechanism %s needs --kafka-sasl-user", mech))
		}
		if c.Password == "" {
			errs = append(errs, fmt.Errorf("--kafka-sasl-mechanism %s needs a password (--kafka-sasl-password-file or METER_KAFKA_SASL_PASSWORD)", mech))
		}
	}
	return errors.Join(errs...)
}

// Conn is the built configuration that the clients of one process share.
// A nil *Conn is plaintext without authentication: its Dialer and Transport
// are nil, which kafka-go takes as its defaults.
type Conn struct {
	tls       *tls.Config
	sasl      sasl.Mechanism
	transport *kafka.Transport
}

// New builds the Conn of cfg; it returns nil for the zero Config.
func New(cfg Config, opts tlsfiles.Options) (*Conn, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tlsCfg, err := cfg.TLS.Config(opts)
	if err != nil {
		return nil, fmt.Errorf("kafka TLS: %w", err)
	}
	var mech sasl.Mechanism
	switch strings.ToUpper(cfg.SASLMechanism) {
	case "":
	case Plain:
		mech = plain.Mechanism{Username: cfg.Username, Password: cfg.Password}
	case ScramSHA256:
		mech, err = scram.Mechanism(scram.SHA256, cfg.Username, cfg.Password)
	case ScramSHA512:
		mech, err = scram.Mechanism(scram.SHA512, cfg.Username, cfg.Password)
	}
	if err != nil {
		return nil, fmt.Errorf("kafka SASL: %w", err)
	}
	if tlsCfg == nil && mech == nil {
		return nil, nil
	}
	return &Conn{
		tls:       tlsCfg,
		sasl:      mech,
		transport: &kafka.Transport{TLS: tlsCfg, SASL: mech},
	}, nil
}

// Dialer returns a new Dialer for readers and consumer groups, with
// kafka-go's default timeouts.
func (c *Conn) Dialer() *kafka.Dialer {
	if c == nil {
		return nil
	}
	return &kafka.Dialer{Timeout: 10 * time.Second, DualStack: true, TLS: c.tls, SASLMechanism: c.sasl}
}

// Transport returns the Transport that the writers of the process share
// (and so share its connections, as with kafka-go's default one).
func (c *Conn) Transport() kafka.RoundTripper {
	if c == nil {
		return nil
	}
	return c.transport
}

// Close closes the Transport's idle connections; call it after the
// writers' Close.
func (c *Conn) Close() {
	if c != nil {
		c.transport.CloseIdleConnections()
	}
}

// ErrRefused means that a broker refused the credentials, or that the TLS
// handshake failed on a certificate: retrying cannot help.
var ErrRefused = errors.New("refused")

// Check connects to the brokers, one after the other until one answers, as
// the clients do (TLS, SASL), and asks for metadata. It returns nil once one
// broker answered, else every broker's error; the error wraps ErrRefused
// when a broker refused the credentials or a certificate did not verify.
func (c *Conn) Check(ctx context.Context, brokers []string) error {
	d := c.Dialer()
	if d == nil {
		d = kafka.DefaultDialer
	}
	var errs []error
	for _, b := range brokers {
		err := check(ctx, d, b)
		if err == nil {
			return nil
		}
		if refused(err) {
			err = fmt.Errorf("%w: %w", ErrRefused, err)
		}
		errs = append(errs, fmt.Errorf("kafka broker %s: %w", b, err))
	}
	return errors.Join(errs...)
}

func check(ctx context.Context, d *kafka.Dialer, broker string) error {
	conn, err := d.DialContext(ctx, "tcp", broker)
	if err != nil {
		return err
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	// A broker answers ApiVersions before authentication; metadata needs it.
	_, err = conn.Brokers()
	return err
}

// refused tells whether err is a refusal that retrying cannot mend.
func refused(err error) bool {
	for _, e := range []error{kafka.SASLAuthenticationFailed, kafka.UnsupportedSASLMechanism, kafka.IllegalSASLState} {
		if errors.Is(err, e) {
			return true
		}
	}
	return tlsfiles.IsCertificateError(err)
}
