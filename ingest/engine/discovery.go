package engine

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// PodDiscoveryConfig finds engine replicas as Kubernetes pods by label.
type PodDiscoveryConfig struct {
	// APIServer is the Kubernetes API's base URL; default the in-cluster
	// one (https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT).
	APIServer string
	// TokenFile and CAFile authenticate to the API; default the pod's
	// service account's.
	TokenFile, CAFile string
	// Namespace to list pods in; default the pod's own namespace.
	Namespace string
	// Selector is a label selector, e.g. "app.kubernetes.io/component=vllm".
	Selector string
	// Port and Path of the engine's metrics on each pod (default path /metrics).
	Port int
	Path string
	// DeploymentLabel names the pod label holding the deployment
	// (default app.kubernetes.io/instance); a pod without it is skipped.
	DeploymentLabel string
	// Client is the HTTP client; default one trusting CAFile.
	Client *http.Client
}

// ServiceAccountDir is where Kubernetes mounts a pod's service account.
const ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// PodDiscovery lists the running pods that match a label selector and
// makes a Target of each: its deployment from a label, replica the pod's
// name, node the pod's node, URL http://podIP:port/path.
//
// It calls the pods list of the Kubernetes REST API itself (one GET,
// reading five fields of each pod) rather than through client-go, whose
// dependency tree is larger than the rest of gpu-agent's for this one call.
type PodDiscovery struct {
	cfg    PodDiscoveryConfig
	client *http.Client
}

// NewPodDiscovery checks cfg and fills the in-cluster defaults.
func NewPodDiscovery(cfg PodDiscoveryConfig) (*PodDiscovery, error) {
	if cfg.Selector == "" {
		return nil, errors.New("pod discovery: a label selector is required")
	}
	if cfg.Port <= 0 || cfg.Port > 65535 {
		return nil, fmt.Errorf("pod discovery: port %d: want the engine's metrics port", cfg.Port)
	}
	if cfg.Path == "" {
		cfg.Path = "/metrics"
	}
	if cfg.DeploymentLabel == "" {
		cfg.DeploymentLabel = "app.kubernetes.io/instance"
	}
	if cfg.APIServer == "" {
		host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
		if host == "" || port == "" {
			return nil, errors.New("pod discovery: not in a Kubernetes pod (KUBERNETES_SERVICE_HOST unset): give the API server")
		}
		cfg.APIServer = "https://" + net.JoinHostPort(host, port)
	}
	if cfg.TokenFile == "" {
		cfg.TokenFile = ServiceAccountDir + "/token"
	}
	if cfg.Namespace == "" {
		ns, err := os.ReadFile(ServiceAccountDir + "/namespace")
		if err != nil {
			return nil, fmt.Errorf("pod discovery: no namespace given and none mounted: %w", err)
		}
		cfg.Namespace = strings.TrimSpace(string(ns))
	}
	client := cfg.Client
	if client == nil {
		if cfg.CAFile == "" {
			cfg.CAFile = ServiceAccountDir + "/ca.crt"
		}
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("pod discovery: read the API's CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("pod discovery: no certificate in %s", cfg.CAFile)
		}
		client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	}
	return &PodDiscovery{cfg: cfg, client: client}, nil
}

// podList is the part of a Kubernetes PodList that discovery reads.
type podList struct {
	Items []struct {
		Metadata struct {
			Name   string            `json:"name"`
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
		Spec struct {
			NodeName string `json:"nodeName"`
		} `json:"spec"`
		Status struct {
			Phase string `json:"phase"`
			PodIP string `json:"podIP"`
		} `json:"status"`
	} `json:"items"`
}

// Targets lists the matching pods that are running and have an IP and the
// deployment label, in name order.
func (d *PodDiscovery) Targets(ctx context.Context) ([]Target, error) {
	token, err := os.ReadFile(d.cfg.TokenFile) // re-read: the kubelet rotates it
	if err != nil {
		return nil, fmt.Errorf("pod discovery: read the service account token: %w", err)
	}
	u := strings.TrimSuffix(d.cfg.APIServer, "/") + "/api/v1/namespaces/" + url.PathEscape(d.cfg.Namespace) +
		"/pods?labelSelector=" + url.QueryEscape(d.cfg.Selector)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("pod discovery: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	req.Header.Set("Accept", "application/json")
	resp, err := d.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("pod discovery: list pods: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("pod discovery: list pods in %s: HTTP %d: %s", d.cfg.Namespace, resp.StatusCode, snippet)
	}
	var list podList
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&list); err != nil {
		return nil, fmt.Errorf("pod discovery: decode the pod list: %w", err)
	}
	var out []Target
	for _, p := range list.Items {
		dep := p.Metadata.Labels[d.cfg.DeploymentLabel]
		if p.Status.Phase != "Running" || p.Status.PodIP == "" || dep == "" {
			continue
		}
		out = append(out, Target{
			Deployment: dep, Replica: p.Metadata.Name, Node: p.Spec.NodeName,
			URL: "http://" + net.JoinHostPort(p.Status.PodIP, strconv.Itoa(d.cfg.Port)) + d.cfg.Path,
		})
	}
	slices.SortFunc(out, func(a, b Target) int { return strings.Compare(a.Replica, b.Replica) })
	return out, nil
}
