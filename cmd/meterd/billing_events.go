package main

import (
	"errors"
	"flag"
	"fmt"
	"time"

	"tokenmeter/billing/notify"
	"tokenmeter/internal/envflag"
)

// envWebhookSecret is the environment variable of the billing webhook's
// signing secret, the other way to give it than
// --billing-webhook-secret-file.
const envWebhookSecret = "METER_BILLING_WEBHOOK_SECRET"

// BillingEvents is the --billing-events-* and --billing-webhook-* flags:
// where the api role sends an event per closed statement (billing/notify).
type BillingEvents struct {
	// Topic is the Kafka topic of the events; empty: none.
	Topic string
	// WebhookURL receives each event as a signed POST; empty: none.
	WebhookURL        string
	WebhookSecretFile string
	webhookSecretEnv  string
	WebhookTimeout    time.Duration
	// MaxBackoff caps the wait before a failed delivery is retried.
	MaxBackoff time.Duration
}

// register adds the flags to fs.
func (b *BillingEvents) register(fs *flag.FlagSet) {
	fs.StringVar(&b.Topic, "billing-events-topic", "", "api role: Kafka topic that gets a record per closed statement (JSON statement.closed, key tenant/period; docs/architecture.md, Events out), e.g. "+notify.DefaultTopic+"; empty: none")
	fs.StringVar(&b.WebhookURL, "billing-webhook-url", "", "api role: URL that gets each closed statement's event as a signed POST (needs --billing-webhook-secret-file or "+envWebhookSecret+"); empty: none")
	fs.StringVar(&b.WebhookSecretFile, "billing-webhook-secret-file", "", "file holding the billing webhook's signing secret (or set "+envWebhookSecret+")")
	fs.DurationVar(&b.WebhookTimeout, "billing-webhook-timeout", 10*time.Second, "longest wait for the billing webhook's answer to one POST")
	fs.DurationVar(&b.MaxBackoff, "billing-events-max-backoff", notify.DefaultMaxBackoff, "longest wait before a failed billing event delivery is retried (the wait doubles from 1s)")
}

// readEnv takes the secret's environment variable; call it after parsing.
func (b *BillingEvents) readEnv(getenv func(string) string) {
	b.webhookSecretEnv = getenv(envWebhookSecret)
}

// on tells whether any sink is configured.
func (b BillingEvents) on() bool { return b.Topic != "" || b.WebhookURL != "" }

// webhookSecret reads the webhook's secret.
func (b BillingEvents) webhookSecret() (string, error) {
	return envflag.Secret("billing-webhook-secret-file", b.WebhookSecretFile, envWebhookSecret, b.webhookSecretEnv)
}

// validate reports every problem at once, reading the secret.
func (b BillingEvents) validate(apiRole bool) error {
	var errs []error
	if b.on() && !apiRole {
		errs = append(errs, errors.New("--billing-events-topic and --billing-webhook-url are the api role's (closes happen there): add it to --role"))
	}
	secret, secretErr := b.webhookSecret()
	if secretErr != nil {
		errs = append(errs, secretErr)
	}
	if b.WebhookURL != "" {
		if err := notify.CheckWebhookURL(b.WebhookURL); err != nil {
			errs = append(errs, fmt.Errorf("--billing-webhook-url: %w", err))
		}
		if secretErr == nil && secret == "" {
			errs = append(errs, errors.New("--billing-webhook-url needs a signing secret: --billing-webhook-secret-file or "+envWebhookSecret))
		}
	}
	if b.WebhookTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--billing-webhook-timeout %s: must be positive", b.WebhookTimeout))
	}
	if b.MaxBackoff < time.Second {
		errs = append(errs, fmt.Errorf("--billing-events-max-backoff %s: must be at least 1s", b.MaxBackoff))
	}
	return errors.Join(errs...)
}

// newBillingEvents makes the notifier of closed statements when a sink is
// configured (nil otherwise); its sinks close with the process.
func (p *process) newBillingEvents() (*notify.Notifier, error) {
	cfg := p.cfg.BillingEvents
	if !cfg.on() {
		return nil, nil
	}
	var sinks []notify.Sink
	if cfg.Topic != "" {
		k, err := notify.NewKafkaSink(notify.KafkaConfig{Brokers: p.cfg.KafkaBrokers, Topic: cfg.Topic, Kafka: p.kafka})
		if err != nil {
			return nil, err
		}
		p.onClose(func() { k.Close() })
		sinks = append(sinks, k)
	}
	if cfg.WebhookURL != "" {
		secret, err := cfg.webhookSecret()
		if err != nil {
			return nil, err
		}
		w, err := notify.NewWebhookSink(notify.WebhookConfig{URL: cfg.WebhookURL, Secret: []byte(secret), Timeout: cfg.WebhookTimeout})
		if err != nil {
			return nil, err
		}
		sinks = append(sinks, w)
	}
	return notify.New(notify.Config{MaxBackoff: cfg.MaxBackoff}, p.store, sinks, p.reg, p.logger)
}
