package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"tokenmeter/billing"
	"tokenmeter/ingest"
	"tokenmeter/ingest/otlp"
	"tokenmeter/internal/adapter/kafkaconn"
	"tokenmeter/internal/envflag"
	"tokenmeter/internal/ident"
	"tokenmeter/internal/logsetup"
	"tokenmeter/internal/tlsfiles"
	"tokenmeter/rollup"
	"tokenmeter/usagemetrics"
)

// envClickHousePassword is the environment variable of ClickHouse's
// password, the other way to give it than --clickhouse-password-file
// (Kafka's is kafkaconn.EnvPassword).
const envClickHousePassword = "METER_CLICKHOUSE_PASSWORD"

// Config is meterd's whole configuration, read from flags with METER_*
// environment fallbacks.
type Config struct {
	Roles        []string
	Dev          bool
	DataDir      string
	KafkaBrokers []string
	ClickHouse   string
	Database     string
	// Cluster is --clickhouse-cluster: the remote_servers cluster of cluster
	// mode, empty for one server.
	Cluster     string
	Compression string
	HTTPAddr    string
	GRPCAddr    string
	AuthKeys    string
	EventsTopic string
	GPUTopic    string
	// EngineTopic carries engine samples ("": not ingested).
	EngineTopic string
	PricesFile  string
	DLQTopic    string
	GroupID     string
	BatchSize   int
	// MinuteRetention is how long minute rollup rows are kept (0: for ever).
	MinuteRetention time.Duration
	BatchTimeout    time.Duration
	MaxBatch        int
	MaxBody         int
	HTTPTimeouts    [3]time.Duration // read, write, idle
	LogLevel        string
	SLOFile         string
	RollupEvery     time.Duration
	Pprof           bool
	MemoryMiB       int
	ValidateOnly    bool
	Security        Security
	// BillingGrace is how long after its end a billing period may close.
	BillingGrace time.Duration
	// BillingZones is --billing-zones: "tenant=zone,..." (see billingZones).
	BillingZones string
	// BillingAccounts is --billing-accounts: the billing accounts file
	// (billing.ParseAccounts), empty for none.
	BillingAccounts string
	// BillingByDeployment splits statement lines per deployment.
	BillingByDeployment bool
	// BillingEvents is where closed statements' events go (api role).
	BillingEvents BillingEvents
	// TenantCost shows tenant keys the provider's cost of serving them
	// (api.Config.TenantCost).
	TenantCost bool
	// OTLP is the OTLP trace receiver of the api role (off when both
	// addresses are empty).
	OTLP OTLPConfig
	// UsageMetrics serves the business metrics for Prometheus on
	// --http-addr (api role), UsageMetricsMaxSeries and UsageMetricsInterval
	// being their cardinality cap and cache interval.
	UsageMetrics          bool
	UsageMetricsMaxSeries int
	UsageMetricsInterval  time.Duration
}

// OTLPConfig is the --otlp-* flags.
type OTLPConfig struct {
	GRPCAddr, HTTPAddr string
	TenantAttribute    string
	TTFTFromE2E        bool
}

// billingZones reads BillingZones, "acme=Asia/Kolkata,beta=+05:30": each
// tenant's billing time zone (billing.ParseZone), UTC for the others.
func (c Config) billingZones() (map[string]*time.Location, error) {
	zones := map[string]*time.Location{}
	var errs []error
	for _, entry := range envflag.List(c.BillingZones) {
		tenant, name, ok := strings.Cut(entry, "=")
		tenant, name = strings.TrimSpace(tenant), strings.TrimSpace(name)
		if !ok || tenant == "" || name == "" {
			errs = append(errs, fmt.Errorf("--billing-zones: %q: want tenant=zone, such as acme=Asia/Kolkata or acme=+05:30", entry))
			continue
		}
		if err := ident.Check("tenant_id", tenant); err != nil {
			errs = append(errs, fmt.Errorf("--billing-zones: %q: %w", entry, err))
			continue
		}
		if _, dup := zones[tenant]; dup {
			errs = append(errs, fmt.Errorf("--billing-zones: tenant %q is given twice", tenant))
			continue
		}
		z, err := billing.ParseZone(name)
		if err != nil {
			errs = append(errs, fmt.Errorf("--billing-zones: tenant %q: %w", tenant, err))
			continue
		}
		zones[tenant] = z
	}
	return zones, errors.Join(errs...)
}

// billingAccounts reads the --billing-accounts file (nil without one) and
// the tenants' zones: those of the file and of --billing-zones, which must
// agree on a tenant both name.
func (c Config) billingAccounts() (*billing.Accounts, map[string]*time.Location, error) {
	zones, err := c.billingZones()
	if err != nil {
		return nil, nil, err
	}
	if c.BillingAccounts == "" {
		return nil, zones, nil
	}
	data, err := os.ReadFile(c.BillingAccounts)
	if err != nil {
		return nil, nil, fmt.Errorf("--billing-accounts: %w", err)
	}
	accounts, err := billing.ParseAccounts(data)
	if err != nil {
		return nil, nil, fmt.Errorf("--billing-accounts %s: %w", c.BillingAccounts, err)
	}
	fileZones, err := accounts.Zones()
	if err != nil {
		return nil, nil, fmt.Errorf("--billing-accounts %s: %w", c.BillingAccounts, err)
	}
	var errs []error
	for _, tenant := range slices.Sorted(maps.Keys(fileZones)) {
		z := fileZones[tenant]
		if flag, ok := zones[tenant]; ok && flag.String() != z.String() {
			errs = append(errs, fmt.Errorf("tenant %q: --billing-zones says %s, --billing-accounts %s says %s", tenant, flag, c.BillingAccounts, z))
			continue
		}
		zones[tenant] = z
	}
	if err := errors.Join(errs...); err != nil {
		return nil, nil, err
	}
	return accounts, zones, nil
}

// Security is the transport security and credentials of meterd's
// listeners, Kafka clients and ClickHouse connections. Passwords come from
// files or the environment, never from flag values.
type Security struct {
	// TLS of the gRPC and HTTP listeners.
	TLS tlsfiles.Server
	// Kafka's TLS and SASL (the password is read by Kafka.Resolve).
	Kafka          kafkaconn.Flags
	ClickHouseUser string
	// ClickHousePasswordFile or METER_CLICKHOUSE_PASSWORD.
	ClickHousePasswordFile string
	clickHousePasswordEnv  string
	ClickHouseTLS          tlsfiles.Client
}

// ClickHousePassword reads ClickHouse's password.
func (s Security) ClickHousePassword() (string, error) {
	return envflag.Secret("clickhouse-password-file", s.ClickHousePasswordFile, envClickHousePassword, s.clickHousePasswordEnv)
}

// validate reports every problem at once, reading the files.
func (s Security) validate(dev, privateClickHouse bool) error {
	var errs []error
	if err := s.TLS.Validate("--tls"); err != nil {
		errs = append(errs, err)
	}
	k, err := s.Kafka.Resolve()
	if err != nil {
		errs = append(errs, err)
		k.Password = "unread" // reported just above, not as missing
	}
	if err := k.Validate(); err != nil {
		errs = append(errs, err)
	}
	if dev && (k.TLS.Enabled() || k.SASLMechanism != "") {
		errs = append(errs, errors.New("--kafka-tls* and --kafka-sasl-* do not apply to --dev's embedded broker"))
	}
	pw, err := s.ClickHousePassword()
	if err != nil {
		errs = append(errs, err)
	}
	if err := s.ClickHouseTLS.Validate("--clickhouse-tls"); err != nil {
		errs = append(errs, err)
	}
	if privateClickHouse && (s.ClickHouseUser != "" || pw != "" || s.ClickHouseTLS.Enabled()) {
		errs = append(errs, errors.New("--clickhouse-user, a ClickHouse password and --clickhouse-tls* need --clickhouse (--dev's private server has none)"))
	}
	return errors.Join(errs...)
}

var knownRoles = []string{"ingest", "rollup", "api"}

// HasRole tells whether the process runs role r.
func (c Config) HasRole(r string) bool {
	for _, x := range c.Roles {
		if x == r {
			return true
		}
	}
	return false
}

// Validate reports every problem at once.
func (c Config) Validate() error {
	var errs []error
	if len(c.Roles) == 0 {
		errs = append(errs, errors.New("--role: no role given"))
	}
	for _, r := range c.Roles {
		ok := false
		for _, k := range knownRoles {
			ok = ok || r == k
		}
		if !ok {
			errs = append(errs, fmt.Errorf("--role: unknown role %q (want %s or all)", r, strings.Join(knownRoles, ", ")))
		}
	}
	if c.Dev && c.DataDir == "" {
		errs = append(errs, errors.New("--dev needs --data-dir"))
	}
	if !c.Dev && c.ClickHouse == "" {
		errs = append(errs, errors.New("--clickhouse is required (host:port of the native protocol), unless --dev"))
	}
	if c.Dev && c.Cluster != "" {
		errs = append(errs, errors.New("--clickhouse-cluster: --dev runs one private server, not a cluster"))
	}
	if !c.Dev && c.AuthKeys == "" && c.HasRole("api") {
		errs = append(errs, errors.New("--auth-keys is required for the api role, unless --dev"))
	}
	if len(c.KafkaBrokers) == 0 {
		errs = append(errs, errors.New("--kafka-brokers: no broker"))
	}
	for _, a := range append([]string{c.HTTPAddr, c.GRPCAddr}, c.KafkaBrokers...) {
		if _, _, err := net.SplitHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("address %q: %w", a, err))
		}
	}
	if c.BatchSize <= 0 {
		errs = append(errs, fmt.Errorf("--batch-size %d: must be positive", c.BatchSize))
	}
	if c.MinuteRetention != 0 && c.MinuteRetention < 24*time.Hour {
		errs = append(errs, fmt.Errorf("--minute-retention %s: must be 0 (keep for ever) or at least 24h (minute rows are dropped by whole days)", c.MinuteRetention))
	}
	if c.BatchTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--batch-timeout %s: must be positive", c.BatchTimeout))
	}
	if c.MemoryMiB < 0 {
		errs = append(errs, fmt.Errorf("--memory-limit-mib %d: must not be negative", c.MemoryMiB))
	}
	for i, d := range c.HTTPTimeouts {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("--http-%s-timeout %s: must be positive", [...]string{"read", "write", "idle"}[i], d))
		}
	}
	if c.MaxBatch <= 0 || c.MaxBody <= 0 {
		errs = append(errs, errors.New("--max-batch-events and --max-request-bytes must be positive"))
	}
	if c.OTLP.GRPCAddr != "" || c.OTLP.HTTPAddr != "" {
		if !c.HasRole("api") {
			errs = append(errs, errors.New("--otlp-grpc-addr and --otlp-http-addr need the api role"))
		}
		for _, a := range []string{c.OTLP.GRPCAddr, c.OTLP.HTTPAddr} {
			if _, _, err := net.SplitHostPort(a); a != "" && err != nil {
				errs = append(errs, fmt.Errorf("OTLP address %q: %w", a, err))
			}
		}
		if c.OTLP.TenantAttribute == "" {
			errs = append(errs, errors.New("--otlp-tenant-attribute must not be empty"))
		}
	}
	if err := logsetup.CheckLevel(c.LogLevel); err != nil {
		errs = append(errs, err)
	}
	if c.BillingGrace <= 0 {
		errs = append(errs, fmt.Errorf("--billing-grace %s: must be positive", c.BillingGrace))
	}
	if _, _, err := c.billingAccounts(); err != nil {
		errs = append(errs, err)
	}
	if err := c.BillingEvents.validate(c.HasRole("api")); err != nil {
		errs = append(errs, err)
	}
	if c.TenantCost && !c.HasRole("api") {
		errs = append(errs, errors.New("--tenant-cost is the api role's: add it to --role"))
	}
	if c.UsageMetrics && !c.HasRole("api") {
		errs = append(errs, errors.New("--usage-metrics is served by the api role: add it to --role"))
	}
	if c.UsageMetricsMaxSeries < 1 {
		errs = append(errs, fmt.Errorf("--usage-metrics-max-series %d: must be at least 1", c.UsageMetricsMaxSeries))
	}
	if c.UsageMetricsInterval < time.Second {
		errs = append(errs, fmt.Errorf("--usage-metrics-interval %s: must be at least 1s", c.UsageMetricsInterval))
	}
	if err := c.Security.validate(c.Dev, c.Dev && c.ClickHouse == ""); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// parseConfig reads flags, then METER_<FLAG_NAME> for every flag not given.
func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (Config, error) {
	var c Config
	fs := flag.NewFlagSet("meterd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	roles := fs.String("role", "all", "comma-separated roles to run: ingest, rollup, api (all = every role)")
	fs.BoolVar(&c.Dev, "dev", false, "development mode: embedded Kafka-protocol broker and a private ClickHouse server, data in --data-dir")
	fs.StringVar(&c.DataDir, "data-dir", "", "data directory of --dev (broker log, ClickHouse data, dev keys)")
	brokers := fs.String("kafka-brokers", "127.0.0.1:9092", "comma-separated Kafka bootstrap brokers (in --dev, the embedded broker's listen address)")
	fs.StringVar(&c.ClickHouse, "clickhouse", "", "ClickHouse native address host:port (in --dev, default: start a private server)")
	fs.StringVar(&c.Database, "clickhouse-database", "tokenmeter", "ClickHouse database (created if missing)")
	fs.StringVar(&c.Cluster, "clickhouse-cluster", "", "cluster mode: the cluster (remote_servers) to create Replicated and Distributed tables on (docs/cluster.md); empty: one server")
	fs.StringVar(&c.Compression, "clickhouse-compression", "lz4", "native protocol compression: lz4 or none (none is faster on loopback)")
	fs.StringVar(&c.HTTPAddr, "http-addr", "127.0.0.1:8080", "REST, /metrics and /healthz listen address")
	fs.StringVar(&c.GRPCAddr, "grpc-addr", "127.0.0.1:9090", "gRPC listen address")
	fs.StringVar(&c.AuthKeys, "auth-keys", "", "JSON file of API keys (see README, API keys); --dev generates one")
	fs.StringVar(&c.EventsTopic, "events-topic", ingest.DefaultEventsTopic, "Kafka topic of inference events")
	fs.StringVar(&c.GPUTopic, "gpu-topic", ingest.DefaultGPUTopic, "Kafka topic of GPU samples (from gpu-agent); empty: do not ingest GPU samples")
	fs.StringVar(&c.EngineTopic, "engine-topic", ingest.DefaultEngineTopic, "Kafka topic of engine samples (from gpu-agent --engine-endpoints); empty: do not ingest engine samples")
	fs.StringVar(&c.PricesFile, "prices", "", "JSON price book (GPU $/hour, token list prices; see docs/operations.md); a changed file becomes a new price version at start")
	fs.StringVar(&c.DLQTopic, "dlq-topic", ingest.DefaultDLQTopic, "Kafka dead-letter topic")
	fs.StringVar(&c.GroupID, "group-id", ingest.DefaultGroupID, "Kafka consumer group of the ingest role")
	fs.IntVar(&c.BatchSize, "batch-size", 100_000, "flush an insert batch at this many records (fewer when --batch-timeout comes first)")
	fs.DurationVar(&c.BatchTimeout, "batch-timeout", 500*time.Millisecond, "flush a non-empty batch this long after its first record")
	fs.IntVar(&c.MaxBatch, "max-batch-events", 10_000, "most events in one publish request, and spans in one OTLP export request")
	fs.IntVar(&c.MaxBody, "max-request-bytes", 16<<20, "largest request body or gRPC message")
	fs.DurationVar(&c.HTTPTimeouts[0], "http-read-timeout", time.Minute, "longest time to read an HTTP request, body included")
	fs.DurationVar(&c.HTTPTimeouts[1], "http-write-timeout", 2*time.Minute, "longest time from the end of an HTTP request's headers to the end of its response")
	fs.DurationVar(&c.HTTPTimeouts[2], "http-idle-timeout", 2*time.Minute, "close a keep-alive HTTP connection idle this long")
	fs.StringVar(&c.SLOFile, "slo-file", "", "JSON SLO set for goodput (see docs/operations.md); a changed file becomes a new SLO version at start")
	fs.DurationVar(&c.RollupEvery, "rollup-interval", 10*time.Second, "how often the rollup role recomputes changed hours")
	fs.DurationVar(&c.MinuteRetention, "minute-retention", rollup.DefaultMinuteRetention, "keep minute rollup rows this long (whole UTC days; hour and day rows are kept for ever); queries at a minute step before it are refused; 0 = keep for ever")
	fs.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.IntVar(&c.MemoryMiB, "memory-limit-mib", 256, "soft limit of the Go heap in MiB (runtime/debug.SetMemoryLimit; GOMEMLIMIT overrides; 0 = none)")
	fs.BoolVar(&c.Pprof, "pprof", false, "serve Go profiles under /debug/pprof/ on --http-addr")
	fs.DurationVar(&c.BillingGrace, "billing-grace", billing.DefaultGrace, "how long after its end a billing period may close (an admin's close may ask for another)")
	fs.StringVar(&c.BillingZones, "billing-zones", "", "billing time zones of tenants, tenant=zone,...: an IANA name or an offset (acme=Asia/Kolkata,beta=+05:30); UTC for the others")
	fs.StringVar(&c.BillingAccounts, "billing-accounts", "", "JSON billing accounts file: the operator's names, invoice numbering and seller, each tenant's display name, billing account, zone, buyer, tax rate and contract (see deploy/billing-accounts.example.json); zones must agree with --billing-zones")
	fs.BoolVar(&c.BillingByDeployment, "billing-by-deployment", false, "split statement lines per deployment as well as per model")
	c.BillingEvents.register(fs)
	fs.BoolVar(&c.TenantCost, "tenant-cost", false, "api role: show tenant keys the provider's cost of serving them (the allocated GPU cost in /v1/cost, the finance parts of their statements and exports); off, a tenant key sees its usage and charges only")
	fs.BoolVar(&c.UsageMetrics, "usage-metrics", false, "api role: serve business metrics for Prometheus (llm_requests_total, llm_tokens_*_total, llm_latency, ... per tenant and model) on --http-addr at /metrics/usage, to finance and admin keys")
	fs.IntVar(&c.UsageMetricsMaxSeries, "usage-metrics-max-series", usagemetrics.DefaultMaxSeries, "most (tenant, model) pairs, and (deployment, model) pairs and GPU deployments, /metrics/usage exposes each, \"__other__\" included; the smallest others are summed into it")
	fs.DurationVar(&c.UsageMetricsInterval, "usage-metrics-interval", usagemetrics.DefaultInterval, "/metrics/usage reads the rollups at most this often and serves a cache in between")
	fs.StringVar(&c.OTLP.GRPCAddr, "otlp-grpc-addr", "", "OTLP/gRPC trace receiver listen address (api role; GenAI spans become events); empty: off")
	fs.StringVar(&c.OTLP.HTTPAddr, "otlp-http-addr", "", "OTLP/HTTP trace receiver listen address, POST /v1/traces (api role); empty: off")
	fs.StringVar(&c.OTLP.TenantAttribute, "otlp-tenant-attribute", otlp.DefaultTenantAttribute, "span or resource attribute naming the tenant of OTLP spans (else the ingest key's tenant)")
	fs.BoolVar(&c.OTLP.TTFTFromE2E, "otlp-ttft-from-e2e", false, "OTLP spans without time to first token: take e2e as TTFT and label the event ttft_source=e2e, instead of rejecting them")
	fs.BoolVar(&c.ValidateOnly, "validate", false, "check the configuration and exit")
	sec := &c.Security
	fs.StringVar(&sec.TLS.CertFile, "tls-cert", "", "serve gRPC and HTTP over TLS with this certificate (PEM, chain first); read again when it changes")
	fs.StringVar(&sec.TLS.KeyFile, "tls-key", "", "private key of --tls-cert (PEM)")
	fs.StringVar(&sec.TLS.ClientCAFile, "tls-client-ca", "", "require client certificates signed by these CAs (PEM) on both listeners (mutual TLS)")
	sec.Kafka.Register(fs)
	fs.StringVar(&sec.ClickHouseUser, "clickhouse-user", "", "ClickHouse user (default: default)")
	fs.StringVar(&sec.ClickHousePasswordFile, "clickhouse-password-file", "", "file holding the ClickHouse password (or set "+envClickHousePassword+")")
	fs.BoolVar(&sec.ClickHouseTLS.On, "clickhouse-tls", false, "connect to ClickHouse over TLS, to its tcp_port_secure (implied by the other --clickhouse-tls-* flags)")
	fs.StringVar(&sec.ClickHouseTLS.CAFile, "clickhouse-tls-ca", "", "CAs (PEM) that sign ClickHouse's certificate (default: the system's)")
	fs.StringVar(&sec.ClickHouseTLS.CertFile, "clickhouse-tls-cert", "", "client certificate (PEM) for a ClickHouse that requires one")
	fs.StringVar(&sec.ClickHouseTLS.KeyFile, "clickhouse-tls-key", "", "private key of --clickhouse-tls-cert (PEM)")
	fs.StringVar(&sec.ClickHouseTLS.ServerName, "clickhouse-tls-server-name", "", "name expected in ClickHouse's certificate (default: the host dialed)")
	if err := envflag.Parse(fs, args, getenv); err != nil {
		return c, err
	}
	sec.Kafka.ReadEnv(getenv)
	c.BillingEvents.readEnv(getenv)
	sec.clickHousePasswordEnv = getenv(envClickHousePassword)
	if *roles == "all" {
		c.Roles = knownRoles
	} else {
		c.Roles = envflag.List(*roles)
	}
	c.KafkaBrokers = envflag.List(*brokers)
	return c, c.Validate()
}
