package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"regexp"
	"time"

	"tokenmeter/ingest"
	"tokenmeter/ingest/engine"
	"tokenmeter/ingest/gpu"
	"tokenmeter/internal/adapter/kafkaconn"
	"tokenmeter/internal/envflag"
	"tokenmeter/internal/logsetup"
)

// SourceNone runs no GPU source: the agent scrapes engine endpoints only.
const SourceNone = "none"

// Config is gpu-agent's whole configuration, read from flags with METER_*
// environment fallbacks (--kafka-brokers: METER_KAFKA_BROKERS).
type Config struct {
	Source        string
	DCGMMode      string
	DCGMAddress   string
	ExporterURL   string
	File          string
	Loop          bool
	Interval      time.Duration
	KafkaBrokers  []string
	Topic         string
	Node          string
	NodeSet       bool // --node or METER_NODE was given, not defaulted
	Region        string
	Pool          string
	DeploymentMap string
	PodRegex      string
	Once          bool
	HTTPAddr      string
	LogLevel      string
	BufferSamples int
	ValidateOnly  bool
	// EngineEndpoints are the engine replicas to scrape (--engine-endpoints).
	EngineEndpoints []engine.Target
	EngineTopic     string
	// EnginePods finds engine replicas as pods by label (Selector empty: off).
	EnginePods engine.PodDiscoveryConfig
	// Kafka's TLS and SASL (the password is read by Kafka.Resolve).
	Kafka kafkaconn.Flags
}

// Validate reports every problem at once.
func (c Config) Validate() error {
	var errs []error
	switch c.Source {
	case SourceNone:
		if !c.scrapesEngines() {
			errs = append(errs, errors.New("--source none: nothing to do without --engine-endpoints or --engine-pod-selector"))
		}
	case gpu.SourceDCGM:
		switch gpu.DCGMMode(c.DCGMMode) {
		case gpu.DCGMEmbedded, gpu.DCGMStandalone:
		default:
			errs = append(errs, fmt.Errorf("--dcgm-mode %q: want embedded or standalone", c.DCGMMode))
		}
		if gpu.DCGMMode(c.DCGMMode) == gpu.DCGMStandalone && c.DCGMAddress == "" {
			errs = append(errs, errors.New("--dcgm-address is required with --dcgm-mode standalone"))
		}
	case gpu.SourceNVML: // nothing to configure: NVML finds the driver itself
	case gpu.SourceExporter:
		if u, err := url.Parse(c.ExporterURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("--exporter-url %q: want http(s)://host:port/metrics", c.ExporterURL))
		}
	case gpu.SourceReplay:
		if c.File == "" {
			errs = append(errs, errors.New("--file is required with --source replay"))
		}
	default:
		errs = append(errs, fmt.Errorf("--source %q: want %s, %s, %s, %s or %s", c.Source, gpu.SourceDCGM, gpu.SourceNVML, gpu.SourceExporter, gpu.SourceReplay, SourceNone))
	}
	if c.Interval <= 0 {
		errs = append(errs, fmt.Errorf("--interval %s: must be positive", c.Interval))
	}
	if !c.Once {
		if len(c.KafkaBrokers) == 0 {
			errs = append(errs, errors.New("--kafka-brokers: no broker (or use --once)"))
		}
		for _, b := range c.KafkaBrokers {
			if _, _, err := net.SplitHostPort(b); err != nil {
				errs = append(errs, fmt.Errorf("--kafka-brokers %q: %w", b, err))
			}
		}
		if c.Topic == "" && c.Source != SourceNone {
			errs = append(errs, errors.New("--topic is empty"))
		}
		if c.EngineTopic == "" && c.scrapesEngines() {
			errs = append(errs, errors.New("--engine-topic is empty"))
		}
		k, err := c.Kafka.Resolve()
		if err != nil {
			errs = append(errs, err)
			k.Password = "unread" // reported just above, not as missing
		}
		if err := k.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.HTTPAddr != "" {
		if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil {
			errs = append(errs, fmt.Errorf("--http-addr %q: %w", c.HTTPAddr, err))
		}
	}
	if c.Node == "" {
		errs = append(errs, errors.New("--node is empty and the hostname is unknown"))
	}
	if c.PodRegex != "" {
		if re, err := regexp.Compile(c.PodRegex); err != nil {
			errs = append(errs, fmt.Errorf("--pod-deployment-regex: %w", err))
		} else if re.NumSubexp() == 0 {
			errs = append(errs, fmt.Errorf("--pod-deployment-regex %q: needs a group (named deployment, or the first) to take the deployment from", c.PodRegex))
		}
	}
	if c.EnginePods.Selector != "" && (c.EnginePods.Port <= 0 || c.EnginePods.Port > 65535) {
		errs = append(errs, fmt.Errorf("--engine-pod-port %d: give the engines' metrics port with --engine-pod-selector", c.EnginePods.Port))
	}
	if c.BufferSamples <= 0 {
		errs = append(errs, fmt.Errorf("--buffer-samples %d: must be positive", c.BufferSamples))
	}
	if err := logsetup.CheckLevel(c.LogLevel); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// scrapesEngines tells whether engine endpoints are scraped.
func (c Config) scrapesEngines() bool {
	return len(c.EngineEndpoints) > 0 || c.EnginePods.Selector != ""
}

// parseConfig reads flags, then METER_<FLAG_NAME> for every flag not given.
func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (Config, error) {
	var c Config
	fs := flag.NewFlagSet("gpu-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.Source, "source", gpu.SourceDCGM, "where readings come from: dcgm, nvml (the NVIDIA driver's libnvidia-ml, for nodes without DCGM), dcgm-exporter, replay, or none (engine endpoints only)")
	endpoints := fs.String("engine-endpoints", "", "inference engine replicas to scrape (vLLM, SGLang, TGI): comma-separated deployment=http://host:port/metrics[@replica]; their samples go to --engine-topic")
	fs.StringVar(&c.EngineTopic, "engine-topic", ingest.DefaultEngineTopic, "Kafka topic of engine samples")
	fs.StringVar(&c.EnginePods.Selector, "engine-pod-selector", "", "also scrape the running pods matching this Kubernetes label selector (in-cluster API, service account allowed to list pods)")
	fs.StringVar(&c.EnginePods.Namespace, "engine-pod-namespace", "", "namespace of --engine-pod-selector (default: the agent's own)")
	fs.IntVar(&c.EnginePods.Port, "engine-pod-port", 0, "the engines' metrics port on each pod (vLLM 8000, SGLang 30000, TGI 80)")
	fs.StringVar(&c.EnginePods.Path, "engine-pod-path", "/metrics", "the engines' metrics path on each pod")
	fs.StringVar(&c.EnginePods.DeploymentLabel, "engine-pod-deployment-label", "app.kubernetes.io/instance", "pod label naming the deployment a discovered replica serves")
	fs.StringVar(&c.DCGMMode, "dcgm-mode", string(gpu.DCGMEmbedded), "dcgm source: embedded (load libdcgm in this process) or standalone (connect to nv-hostengine)")
	fs.StringVar(&c.DCGMAddress, "dcgm-address", gpu.DefaultDCGMAddress, "standalone nv-hostengine: host:port, a unix socket path, or a tcp:// or unix:// URL")
	fs.StringVar(&c.ExporterURL, "exporter-url", gpu.DefaultExporterURL, "dcgm-exporter source: the /metrics URL (or a Prometheus /federate URL)")
	fs.StringVar(&c.File, "file", "", "replay source: JSON-lines file of GpuSample (protojson), as meterctl gpu-samples writes it")
	fs.BoolVar(&c.Loop, "loop", false, "replay source: start over at the end of the file, shifting the timeline, instead of stopping")
	fs.DurationVar(&c.Interval, "interval", 10*time.Second, "time between two readings")
	brokers := fs.String("kafka-brokers", "127.0.0.1:9092", "comma-separated Kafka bootstrap brokers")
	fs.StringVar(&c.Topic, "topic", ingest.DefaultGPUTopic, "Kafka topic of GPU samples")
	fs.StringVar(&c.Node, "node", "", "node name of the samples (default: this machine's hostname; with dcgm-exporter, the exporter's Hostname label unless given)")
	fs.StringVar(&c.Region, "region", "", "region written into every sample (prices depend on it)")
	fs.StringVar(&c.Pool, "pool", "", "capacity pool written into every sample: reserved, on-demand, spot...")
	fs.StringVar(&c.DeploymentMap, "deployment-map", "", "JSON file mapping nodes/GPUs, namespaces and pod prefixes to deployments (see gpu.DeploymentMap)")
	fs.StringVar(&c.PodRegex, "pod-deployment-regex", gpu.DefaultPodDeploymentRegex, "regex deriving a deployment from a pod name (group \"deployment\", else the first); empty: off")
	fs.BoolVar(&c.Once, "once", false, "read once, print the samples as JSON lines to stdout and exit; no Kafka")
	fs.StringVar(&c.HTTPAddr, "http-addr", "127.0.0.1:9402", "/metrics and /healthz listen address; empty: none")
	fs.IntVar(&c.BufferSamples, "buffer-samples", 50_000, "most samples kept while Kafka does not acknowledge; the oldest are dropped beyond")
	fs.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&c.ValidateOnly, "validate", false, "check the configuration (and the deployment map) and exit")
	c.Kafka.Register(fs)
	if err := envflag.Parse(fs, args, getenv); err != nil {
		return c, err
	}
	c.Kafka.ReadEnv(getenv)
	c.KafkaBrokers = envflag.List(*brokers)
	var terr error
	if c.EngineEndpoints, terr = engine.ParseTargets(*endpoints); terr != nil {
		return c, fmt.Errorf("--engine-endpoints: %w", terr)
	}
	c.NodeSet = c.Node != ""
	if !c.NodeSet {
		c.Node, _ = os.Hostname()
	}
	return c, c.Validate()
}
