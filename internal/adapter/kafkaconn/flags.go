package kafkaconn

import (
	"flag"

	"tokenmeter/internal/envflag"
)

// EnvPassword is the environment variable of the SASL password, the other
// way to give it than --kafka-sasl-password-file.
const EnvPassword = "METER_KAFKA_SASL_PASSWORD"

// Flags are the command-line form of a Config, the same in every binary
// that talks to Kafka: --kafka-tls*, --kafka-sasl-*. The password comes
// from a file or EnvPassword, never from a flag value (which ps shows).
type Flags struct {
	// Config holds what the flags set; its Password stays empty: see Resolve.
	Config
	PasswordFile string
	passwordEnv  string
}

// Register adds the flags to fs.
func (f *Flags) Register(fs *flag.FlagSet) {
	fs.BoolVar(&f.TLS.On, "kafka-tls", false, "connect to Kafka over TLS (implied by the other --kafka-tls-* flags)")
	fs.StringVar(&f.TLS.CAFile, "kafka-tls-ca", "", "CAs (PEM) that sign the brokers' certificates (default: the system's)")
	fs.StringVar(&f.TLS.CertFile, "kafka-tls-cert", "", "client certificate (PEM) for brokers that require one; read again when it changes")
	fs.StringVar(&f.TLS.KeyFile, "kafka-tls-key", "", "private key of --kafka-tls-cert (PEM)")
	fs.StringVar(&f.TLS.ServerName, "kafka-tls-server-name", "", "name expected in the brokers' certificates (default: the host dialed)")
	fs.StringVar(&f.SASLMechanism, "kafka-sasl-mechanism", "", "SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (default: no SASL)")
	fs.StringVar(&f.Username, "kafka-sasl-user", "", "SASL user name")
	fs.StringVar(&f.PasswordFile, "kafka-sasl-password-file", "", "file holding the SASL password (or set "+EnvPassword+")")
}

// ReadEnv takes the password's environment variable; call it after parsing.
func (f *Flags) ReadEnv(getenv func(string) string) { f.passwordEnv = getenv(EnvPassword) }

// Resolve returns the Config with the password read from its file or the
// environment.
func (f Flags) Resolve() (Config, error) {
	c := f.Config
	var err error
	c.Password, err = envflag.Secret("kafka-sasl-password-file", f.PasswordFile, EnvPassword, f.passwordEnv)
	return c, err
}
