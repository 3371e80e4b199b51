package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"tokenmeter/api"
	"tokenmeter/internal/adapter/devenv"
	"tokenmeter/rollup"
)

// startDevMode starts the development mode's engines (the broker, and a private
// ClickHouse unless --clickhouse names one) and, without --auth-keys, the
// dev API keys. It returns cfg pointed at them, the keys it made, and stop,
// which stops the engines.
func startDevMode(ctx context.Context, cfg Config, logger *slog.Logger) (_ Config, keys []devKey, stop func(), err error) {
	env, err := devenv.Start(ctx, devenv.Config{
		DataDir:               cfg.DataDir,
		KafkaAddr:             cfg.KafkaBrokers[0],
		Topics:                devTopics(cfg),
		SinglePartitionTopics: []string{rollup.DefaultLeaseTopic},
		ClickHouse:            cfg.ClickHouse,
		Logger:                logger,
	})
	if err != nil {
		return cfg, nil, nil, err
	}
	cfg.KafkaBrokers = []string{env.KafkaAddr}
	cfg.ClickHouse = env.ClickHouseAddr
	if cfg.AuthKeys == "" {
		if keys, err = ensureDevKeys(cfg.DataDir); err != nil {
			env.Close()
			return cfg, nil, nil, err
		}
		cfg.AuthKeys = filepath.Join(cfg.DataDir, "auth-keys.json")
	}
	return cfg, keys, env.Close, nil
}

// devTopics are the topics the dev broker creates.
func devTopics(cfg Config) []string {
	topics := []string{cfg.EventsTopic, cfg.DLQTopic}
	for _, t := range []string{cfg.GPUTopic, cfg.EngineTopic, cfg.BillingEvents.Topic} {
		if t != "" {
			topics = append(topics, t)
		}
	}
	return topics
}

type devKey struct {
	Role   api.Role
	Tenant string
	Key    string
}

// ensureDevKeys creates, once per data dir, one key of each role (a tenant key
// for tenant "acme") and writes both the keys file and the plain keys
// (DIR/keys/<name>.key) so that scripts can read them.
func ensureDevKeys(dir string) ([]devKey, error) {
	keysDir := filepath.Join(dir, "keys")
	wanted := []struct {
		name   string
		role   api.Role
		tenant string
	}{
		{"ingest", api.RoleIngest, ""}, {"admin", api.RoleAdmin, ""},
		{"finance", api.RoleFinance, ""}, {"tenant-acme", api.RoleTenant, "acme"},
	}
	if err := os.MkdirAll(keysDir, 0o700); err != nil {
		return nil, fmt.Errorf("dev keys: %w", err)
	}
	var file api.KeysFile
	var out []devKey
	for _, w := range wanted {
		path := filepath.Join(keysDir, w.name+".key")
		b, err := os.ReadFile(path)
		key := string(b)
		if errors.Is(err, os.ErrNotExist) {
			if key, err = api.NewKey(); err != nil {
				return nil, err
			}
			if err := os.WriteFile(path, []byte(key), 0o600); err != nil {
				return nil, fmt.Errorf("dev keys: %w", err)
			}
		} else if err != nil {
			return nil, fmt.Errorf("dev keys: %w", err)
		}
		file.Keys = append(file.Keys, api.KeyEntry{Name: "dev-" + w.name, SHA256: api.HashKey(key), Role: w.role, TenantID: w.tenant})
		out = append(out, devKey{Role: w.role, Tenant: w.tenant, Key: key})
	}
	data, err := json.MarshalIndent(file, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "auth-keys.json"), data, 0o600); err != nil {
		return nil, fmt.Errorf("dev keys: %w", err)
	}
	return out, nil
}

func printDevBanner(w io.Writer, cfg Config, s *api.Server, keys []devKey) {
	fmt.Fprintf(w, "tokenmeter dev mode (data in %s)\n", cfg.DataDir)
	scheme := "http"
	if cfg.Security.TLS.Enabled() {
		scheme = "https"
	}
	fmt.Fprintf(w, "  REST        %s://%s   (POST /v1/events, GET /v1/usage|latency|goodput|traffic|cost|gpu-usage, /metrics, /healthz/ready)\n", scheme, s.HTTPAddr())
	fmt.Fprintf(w, "  gRPC        %s\n", s.GRPCAddr())
	fmt.Fprintf(w, "  Kafka       %s   (topics %s)\n", cfg.KafkaBrokers[0], strings.Join(devTopics(cfg), ", "))
	fmt.Fprintf(w, "  ClickHouse  %s   (database %s)\n", cfg.ClickHouse, cfg.Database)
	if len(keys) > 0 {
		fmt.Fprintf(w, "  dev API keys (also in %s):\n", filepath.Join(cfg.DataDir, "keys"))
		for _, k := range keys {
			role := string(k.Role)
			if k.Tenant != "" {
				role += " (" + k.Tenant + ")"
			}
			fmt.Fprintf(w, "    %-16s %s\n", role, k.Key)
		}
	}
}
