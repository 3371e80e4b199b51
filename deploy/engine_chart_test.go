package deploy

import (
	"fmt"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// TestChartEngineAgent renders the chart with the engine agent on: one
// gpu-agent replica replaced with Recreate (two would count counter deltas
// twice), scraping the listed endpoints with --source none, whose flags
// gpu-agent --validate accepts; meterd ingests the engine topic. Without
// endpoints the chart refuses to render.
func TestChartEngineAgent(t *testing.T) {
	certs := newPKI(t)
	const values = `engineAgent:
  enabled: true
  interval: 15s
  endpoints:
    - {deployment: llama-70b-prod, url: "http://llama-70b-prod-0.llama:8000/metrics", replica: llama-70b-prod-0}
    - {deployment: qwen-7b, url: "http://10.0.3.7:30000/metrics"}
`
	m := mustRender(t, values)
	name := fullname + "-engine-agent"
	d := m.deployments[name]
	if d == nil {
		t.Fatalf("no Deployment %s (have %v)", name, keys(m.deployments))
	}
	where := "Deployment " + name
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 || d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("%s: replicas %v, strategy %q; want 1 and Recreate", where, ptrVal(d.Spec.Replicas), d.Spec.Strategy.Type)
	}
	checkSelector(t, where, d.Spec.Selector, d.Spec.Template.Labels)
	pod := d.Spec.Template.Spec
	checkPodSecurity(t, where, pod)
	c := pod.Containers[0]
	checkFlags(t, where, "gpu-agent", c.Args)
	want := map[string]string{
		"source":           "none",
		"engine-endpoints": "llama-70b-prod=http://llama-70b-prod-0.llama:8000/metrics@llama-70b-prod-0,qwen-7b=http://10.0.3.7:30000/metrics",
		"engine-topic":     "meter.engine.v1",
		"interval":         "15s",
	}
	for flag, v := range want {
		if got := argValue(c.Args, flag); got != v {
			t.Errorf("%s: --%s=%s, want %s", where, flag, got, v)
		}
	}
	validateContainer(t, m, where, "gpu-agent", pod, c, certs)
	if m.services[name] == nil {
		t.Errorf("no Service %s (its /metrics)", name)
	}
	ingest := m.deployments[fullname+"-ingest"]
	if got := argValue(ingest.Spec.Template.Spec.Containers[0].Args, "engine-topic"); got != "meter.engine.v1" {
		t.Errorf("meterd ingest: --engine-topic=%s, want meter.engine.v1", got)
	}

	_, err := render(t, "engineAgent: {enabled: true}")
	if err == nil || !strings.Contains(err.Error(), "engineAgent.endpoints") {
		t.Errorf("engine agent without endpoints: %v, want an error naming engineAgent.endpoints", err)
	}
}

// TestChartEngineAgentDiscovery renders the engine agent finding its
// replicas as pods by label: a service account whose Role may only list
// pods, in the namespace given, and the discovery flags.
func TestChartEngineAgentDiscovery(t *testing.T) {
	certs := newPKI(t)
	m := mustRender(t, `engineAgent: {enabled: true, discovery: {selector: "app.kubernetes.io/component=vllm", namespace: serving, port: 8000}}`)
	name := fullname + "-engine-agent"
	d := m.deployments[name]
	if d == nil {
		t.Fatalf("no Deployment %s", name)
	}
	where := "Deployment " + name
	pod := d.Spec.Template.Spec
	if pod.ServiceAccountName != name || pod.AutomountServiceAccountToken == nil || !*pod.AutomountServiceAccountToken {
		t.Errorf("%s: service account %q, automount %v; want %s and its token", where, pod.ServiceAccountName, ptrVal(pod.AutomountServiceAccountToken), name)
	}
	c := pod.Containers[0]
	checkFlags(t, where, "gpu-agent", c.Args)
	for flag, v := range map[string]string{"engine-pod-selector": "app.kubernetes.io/component=vllm", "engine-pod-namespace": "serving",
		"engine-pod-port": "8000", "engine-pod-path": "/metrics", "engine-endpoints": ""} {
		if got := argValue(c.Args, flag); got != v {
			t.Errorf("%s: --%s=%q, want %q", where, flag, got, v)
		}
	}
	validateContainer(t, m, where, "gpu-agent", pod, c, certs)
	if m.serviceAccounts[name] == nil {
		t.Errorf("no ServiceAccount %s", name)
	}
	role := m.roles[name]
	if role == nil || role.Namespace != "serving" || len(role.Rules) != 1 || fmt.Sprint(role.Rules[0].Verbs) != "[list]" || fmt.Sprint(role.Rules[0].Resources) != "[pods]" {
		t.Errorf("Role %s: %+v; want list pods in serving, nothing else", name, role)
	}
	rb := m.roleBindings[name]
	if rb == nil || rb.Namespace != "serving" || rb.RoleRef.Name != name || len(rb.Subjects) != 1 || rb.Subjects[0].Name != name || rb.Subjects[0].Namespace != namespace {
		t.Errorf("RoleBinding %s: %+v", name, rb)
	}
}

// TestChartOTLPAndUsageMetrics renders the api role with the OTLP receivers
// and the business metrics on: the flags meterd --validate accepts, the
// receivers' container ports and the api Service's ports.
func TestChartOTLPAndUsageMetrics(t *testing.T) {
	certs := newPKI(t)
	m := mustRender(t, "api: {otlp: {enabled: true}, usageMetrics: {enabled: true, maxSeries: 500}}")
	name := fullname + "-api"
	d := m.deployments[name]
	if d == nil {
		t.Fatalf("no Deployment %s", name)
	}
	pod := d.Spec.Template.Spec
	c := pod.Containers[0]
	checkFlags(t, "Deployment "+name, "meterd", c.Args)
	for flag, v := range map[string]string{"otlp-grpc-addr": ":4317", "otlp-http-addr": ":4318", "otlp-tenant-attribute": "tenant.id",
		"usage-metrics": "true", "usage-metrics-max-series": "500", "usage-metrics-interval": "30s"} {
		if got := argValue(c.Args, flag); got != v {
			t.Errorf("api: --%s=%q, want %q", flag, got, v)
		}
	}
	validateContainer(t, m, "Deployment "+name, "meterd", pod, c, certs)
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["otlp-grpc"] != 4317 || ports["otlp-http"] != 4318 {
		t.Errorf("api container ports %v, want otlp-grpc 4317 and otlp-http 4318", ports)
	}
	svc := map[string]string{}
	for _, p := range m.services[name].Spec.Ports {
		svc[p.Name] = p.TargetPort.String()
	}
	if svc["otlp-grpc"] != "otlp-grpc" || svc["otlp-http"] != "otlp-http" {
		t.Errorf("api Service ports %v, want otlp-grpc and otlp-http", svc)
	}
	// Off by default: neither flag nor port.
	def := mustRender(t, "")
	for _, a := range def.deployments[name].Spec.Template.Spec.Containers[0].Args {
		if strings.HasPrefix(a, "--otlp") || strings.HasPrefix(a, "--usage-metrics") {
			t.Errorf("default api args hold %s", a)
		}
	}
}

// TestChartUsageServiceMonitor: with the business metrics and a key
// Secret, a second ServiceMonitor scrapes /metrics/usage on the api pods
// only, with the finance key from the Secret.
func TestChartUsageServiceMonitor(t *testing.T) {
	m := mustRender(t, "serviceMonitor: {enabled: true}\napi: {usageMetrics: {enabled: true, keySecret: {name: prom-finance-key}}}")
	sm := m.serviceMonitors[fullname+"-usage"]
	if sm == nil {
		t.Fatalf("no ServiceMonitor %s-usage (got %v)", fullname, keys(m.serviceMonitors))
	}
	if len(sm.Spec.Endpoints) != 1 {
		t.Fatalf("endpoints %+v", sm.Spec.Endpoints)
	}
	ep := sm.Spec.Endpoints[0]
	if ep.Path != "/metrics/usage" || ep.Authorization == nil || ep.Authorization.Credentials == nil ||
		ep.Authorization.Credentials.Name != "prom-finance-key" || ep.Authorization.Credentials.Key != "key" {
		t.Errorf("endpoint %+v: want /metrics/usage with the key of Secret prom-finance-key", ep)
	}
	sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range m.services {
		if got, want := sel.Matches(labels.Set(s.Labels)), name == fullname+"-api"; got != want {
			t.Errorf("Service %s selected: %v, want %v (the api pods only)", name, got, want)
		}
	}
	if m := mustRender(t, "serviceMonitor: {enabled: true}\napi: {usageMetrics: {enabled: true}}"); m.serviceMonitors[fullname+"-usage"] != nil {
		t.Error("a usage ServiceMonitor without a key Secret")
	}
}
