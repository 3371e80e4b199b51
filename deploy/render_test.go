package deploy

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

const (
	chartDir  = "helm/tokenmeter"
	release   = "tm"
	namespace = "metering"
)

// kubeVersion is the Kubernetes the chart is rendered and linted for.
var kubeVersion = chartutil.KubeVersion{Version: "v1.31.0", Major: "1", Minor: "31"}

// manifests is a rendered chart, every object decoded strictly into its
// Kubernetes (or prometheus-operator) type.
type manifests struct {
	deployments     map[string]*appsv1.Deployment
	daemonSets      map[string]*appsv1.DaemonSet
	services        map[string]*corev1.Service
	configMaps      map[string]*corev1.ConfigMap
	pdbs            map[string]*policyv1.PodDisruptionBudget
	serviceMonitors map[string]*monitoringv1.ServiceMonitor
	prometheusRules map[string]*monitoringv1.PrometheusRule
	serviceAccounts map[string]*corev1.ServiceAccount
	roles           map[string]*rbacv1.Role
	roleBindings    map[string]*rbacv1.RoleBinding
	notes           string
	count           int
}

// render renders the chart with values (YAML, over values.yaml) as an
// install of release "tm" in namespace "metering", with Helm's strict
// engine (a template reading a value that values.yaml lacks fails).
func render(t *testing.T, values string) (*manifests, error) {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	vals, err := chartutil.ReadValues([]byte(values))
	if err != nil {
		t.Fatalf("values: %v", err)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = kubeVersion
	if !chartutil.IsCompatibleRange(ch.Metadata.KubeVersion, caps.KubeVersion.String()) {
		t.Fatalf("Chart.yaml kubeVersion %q does not admit Kubernetes %s", ch.Metadata.KubeVersion, caps.KubeVersion)
	}
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: release, Namespace: namespace, IsInstall: true, Revision: 1}, caps)
	if err != nil {
		return nil, err
	}
	files, err := engine.Engine{Strict: true, LintMode: false}.Render(ch, rv)
	if err != nil {
		return nil, err
	}
	m := &manifests{
		deployments: map[string]*appsv1.Deployment{}, daemonSets: map[string]*appsv1.DaemonSet{},
		services: map[string]*corev1.Service{}, configMaps: map[string]*corev1.ConfigMap{},
		pdbs: map[string]*policyv1.PodDisruptionBudget{}, serviceMonitors: map[string]*monitoringv1.ServiceMonitor{},
		prometheusRules: map[string]*monitoringv1.PrometheusRule{},
		serviceAccounts: map[string]*corev1.ServiceAccount{}, roles: map[string]*rbacv1.Role{}, roleBindings: map[string]*rbacv1.RoleBinding{},
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if strings.HasSuffix(name, "NOTES.txt") {
			m.notes = files[name]
			continue
		}
		if strings.HasPrefix(filepath.Base(name), "_") {
			continue
		}
		for i, doc := range splitDocs(files[name]) {
			if err := m.add(doc); err != nil {
				t.Fatalf("%s, document %d: %v\n%s", name, i+1, err, doc)
			}
		}
	}
	return m, nil
}

// mustRender renders values that must render.
func mustRender(t *testing.T, values string) *manifests {
	t.Helper()
	m, err := render(t, values)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	return m
}

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

// splitDocs splits a rendered file into its YAML documents, dropping the
// empty ones (comments only, or nothing).
func splitDocs(s string) []string {
	var docs []string
	for _, d := range docSep.Split(s, -1) {
		empty := true
		for _, line := range strings.Split(d, "\n") {
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
				empty = false
				break
			}
		}
		if !empty {
			docs = append(docs, d)
		}
	}
	return docs
}

// add decodes one document strictly (an unknown or duplicate field is an
// error) into the Go type of its apiVersion and kind.
func (m *manifests) add(doc string) error {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
		return fmt.Errorf("not YAML: %w", err)
	}
	var (
		obj  metav1.Object
		into any
	)
	switch gvk := tm.APIVersion + " " + tm.Kind; gvk {
	case "apps/v1 Deployment":
		o := &appsv1.Deployment{}
		obj, into = o, o
		defer func() { m.deployments[o.Name] = o }()
	case "apps/v1 DaemonSet":
		o := &appsv1.DaemonSet{}
		obj, into = o, o
		defer func() { m.daemonSets[o.Name] = o }()
	case "v1 Service":
		o := &corev1.Service{}
		obj, into = o, o
		defer func() { m.services[o.Name] = o }()
	case "v1 ConfigMap":
		o := &corev1.ConfigMap{}
		obj, into = o, o
		defer func() { m.configMaps[o.Name] = o }()
	case "policy/v1 PodDisruptionBudget":
		o := &policyv1.PodDisruptionBudget{}
		obj, into = o, o
		defer func() { m.pdbs[o.Name] = o }()
	case "monitoring.coreos.com/v1 ServiceMonitor":
		o := &monitoringv1.ServiceMonitor{}
		obj, into = o, o
		defer func() { m.serviceMonitors[o.Name] = o }()
	case "monitoring.coreos.com/v1 PrometheusRule":
		o := &monitoringv1.PrometheusRule{}
		obj, into = o, o
		defer func() { m.prometheusRules[o.Name] = o }()
	case "v1 ServiceAccount":
		o := &corev1.ServiceAccount{}
		obj, into = o, o
		defer func() { m.serviceAccounts[o.Name] = o }()
	case "rbac.authorization.k8s.io/v1 Role":
		o := &rbacv1.Role{}
		obj, into = o, o
		defer func() { m.roles[o.Name] = o }()
	case "rbac.authorization.k8s.io/v1 RoleBinding":
		o := &rbacv1.RoleBinding{}
		obj, into = o, o
		defer func() { m.roleBindings[o.Name] = o }()
	default:
		// A Secret among them would mean a credential in values: the chart
		// only references Secrets the operator creates.
		return fmt.Errorf("unexpected object %q: the test knows no Go type for it", gvk)
	}
	// As the API server decodes with strict field validation: field names
	// are case-sensitive (encoding/json, which sigs.k8s.io/yaml.UnmarshalStrict
	// uses, would take readOnlyRootFileSystem for readOnlyRootFilesystem),
	// and an unknown or duplicate field is an error.
	data, err := yaml.YAMLToJSONStrict([]byte(doc))
	if err != nil {
		return fmt.Errorf("%s %s: %w", tm.APIVersion, tm.Kind, err)
	}
	strict, err := kjson.UnmarshalStrict(data, into)
	if err = errors.Join(append(strict, err)...); err != nil {
		return fmt.Errorf("decode %s %s strictly: %w", tm.APIVersion, tm.Kind, err)
	}
	if obj.GetName() == "" {
		return fmt.Errorf("%s without a name", tm.Kind)
	}
	m.count++
	return nil
}

// pki writes a self-signed certificate and its key, for the files that
// meterd --validate and gpu-agent --validate read.
type pki struct{ certPEM, keyPEM []byte }

func newPKI(t *testing.T) pki {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tokenmeter test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, DNSNames: []string{"tokenmeter.test"},
		KeyUsage:    x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pki{
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
	}
}

// validateContainer runs `binary --validate` with a container's args, as
// the container would: every file the args name under a volume mount is
// written to a temporary folder (ConfigMap items with their rendered data,
// Secret items with a test certificate, key or password by their name) and
// the path rewritten to it; $(VAR) takes a sample value of the variable.
func validateContainer(t *testing.T, m *manifests, where, binary string, pod corev1.PodSpec, c corev1.Container, certs pki) {
	t.Helper()
	dir, err := binaries()
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		vols[v.Name] = v
	}
	for _, vm := range c.VolumeMounts {
		v := vols[vm.Name]
		var items []corev1.KeyToPath
		var data map[string]string
		switch {
		case v.Secret != nil:
			items = v.Secret.Items
		case v.ConfigMap != nil:
			items = v.ConfigMap.Items
			cm := m.configMaps[v.ConfigMap.Name]
			if cm == nil {
				t.Errorf("%s: volume %s: the chart renders no ConfigMap %s", where, v.Name, v.ConfigMap.Name)
				continue
			}
			data = cm.Data
		default:
			continue
		}
		for _, it := range items {
			path := filepath.Join(root, vm.MountPath, it.Path)
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			content := []byte("s3cret-for-the-test\n")
			switch {
			case data != nil:
				content = []byte(data[it.Key])
			case strings.HasSuffix(it.Key, ".key"):
				content = certs.keyPEM
			case strings.HasSuffix(it.Key, ".crt") || strings.HasSuffix(it.Key, ".pem"):
				content = certs.certPEM
			}
			if err := os.WriteFile(path, content, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	sample := map[string]string{"NODE_NAME": "gpu-node-a", "NODE_IP": "10.0.0.5"}
	var args []string
	for _, a := range c.Args {
		for k, v := range sample {
			a = strings.ReplaceAll(a, "$("+k+")", v)
		}
		if name, val, ok := strings.Cut(a, "="); ok && strings.HasPrefix(val, "/etc/") {
			a = name + "=" + filepath.Join(root, val)
		}
		args = append(args, a)
	}
	args = append(args, "--validate")
	var out bytes.Buffer
	cmd := exec.Command(filepath.Join(dir, binary), args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	if err := cmd.Run(); err != nil {
		t.Errorf("%s: %s %s: %v\n%s", where, binary, strings.Join(args, " "), err, out.String())
	}
}
