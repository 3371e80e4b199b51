package deploy

import (
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
)

const fullname = "tm-tokenmeter"

var roles = []string{"ingest", "rollup", "api"}

// secureValues is an existing Kafka with TLS (a client certificate) and
// SASL, an existing ClickHouse with a user, a password Secret and TLS,
// listeners over TLS, a price book, an SLO set and a deployment map.
const secureValues = `
kafka:
  brokers: [b-1.kafka.example.net:9096, b-2.kafka.example.net:9096]
  topics:
    events: {name: prod.meter.events.v1, partitions: 24}
    gpu: prod.meter.gpu.v1
    dlq: prod.meter.dlq.v1
  groupId: prod-ingest
  tls: {enabled: true, existingSecret: kafka-tls, caKey: ca.crt, clientCert: true, certKey: tls.crt, keyKey: tls.key, serverName: kafka.example.net}
  sasl: {mechanism: SCRAM-SHA-512, user: tokenmeter, existingSecret: kafka-sasl, passwordKey: sasl-password}
clickhouse:
  address: clickhouse.db.svc:9440
  database: metering
  user: tokenmeter
  existingSecret: clickhouse-credentials
  passwordKey: ch-password
  tls: {enabled: true, existingSecret: clickhouse-ca, caKey: ca.crt, serverName: clickhouse.db.svc}
auth: {existingSecret: prod-api-keys, key: keys.json}
prices: {existingSecret: price-book, key: prices.json}
tls: {enabled: true, existingSecret: meterd-tls}
slo:
  default_class: interactive
  rules:
    - {slo_class: interactive, ttft_ms: 500, itl_ms: 250}
    - {slo_class: batch, e2e_ms: 600000}
billing:
  zones: "acme=Asia/Kolkata,beta=+05:30"
  grace: 48h
  byDeployment: true
  events: {topic: prod.meter.billing.v1, webhook: {url: "https://erp.example.com/hooks/tokenmeter", existingSecret: billing-webhook, secretKey: signing-secret}}
gpuAgent:
  region: us-east-1
  pool: reserved
  deploymentMap:
    nodes: {gpu-node-a: {"*": llama-70b-prod}}
    namespaces: {batch-inference: mistral-7b-batch}
`

type chartCase struct {
	name   string
	values string
	// The ingest replicas expected.
	ingest int
	gpu    bool
	// Secrets the pods must reference: secret name -> keys.
	secrets map[string][]string
	monitor bool
}

var chartCases = []chartCase{
	{name: "defaults", values: "", ingest: 3, gpu: true,
		secrets: map[string][]string{fullname + "-api-keys": {"keys.json"}}},
	{name: "existing Kafka with TLS and SASL, ClickHouse with a password Secret", values: secureValues, ingest: 6, gpu: true,
		secrets: map[string][]string{
			"kafka-tls": {"ca.crt", "tls.crt", "tls.key"}, "kafka-sasl": {"sasl-password"},
			"clickhouse-credentials": {"ch-password"}, "clickhouse-ca": {"ca.crt"},
			"prod-api-keys": {"keys.json"}, "price-book": {"prices.json"}, "meterd-tls": {"tls.crt", "tls.key"},
			"billing-webhook": {"signing-secret"},
		}},
	{name: "gpu-agent disabled", values: "gpuAgent: {enabled: false}", ingest: 3, gpu: false,
		secrets: map[string][]string{fullname + "-api-keys": {"keys.json"}}},
	{name: "serviceMonitor enabled", values: "serviceMonitor: {enabled: true, labels: {release: kube-prometheus-stack}}", ingest: 3, gpu: true, monitor: true,
		secrets: map[string][]string{fullname + "-api-keys": {"keys.json"}}},
	{name: "many ingest replicas", values: "kafka: {topics: {events: {partitions: 96}}}\ningest: {replicas: 96}\napi: {replicas: 6}", ingest: 96, gpu: true,
		secrets: map[string][]string{fullname + "-api-keys": {"keys.json"}}},
	{name: "ingest replicas from the partitions", values: "kafka: {topics: {events: {partitions: 64}}}\ningest: {partitionsPerReplica: 3}", ingest: 22, gpu: true,
		secrets: map[string][]string{fullname + "-api-keys": {"keys.json"}}},
	{name: "gpu-agent on NVML with the NVIDIA runtime", values: "gpuAgent: {source: nvml, runtimeClassName: nvidia}", ingest: 3, gpu: true,
		secrets: map[string][]string{fullname + "-api-keys": {"keys.json"}}},
	{name: "gpu-agent on a standalone nv-hostengine", values: "gpuAgent: {source: dcgm}", ingest: 3, gpu: true,
		secrets: map[string][]string{fullname + "-api-keys": {"keys.json"}}},
}

func TestChartRenders(t *testing.T) {
	certs := newPKI(t)
	for _, tc := range chartCases {
		t.Run(tc.name, func(t *testing.T) {
			m := mustRender(t, tc.values)
			vals := values(t, tc.values)
			checkNames(t, m)
			checkMeterd(t, m, tc, vals, certs)
			checkGPUAgent(t, m, tc, vals, certs)
			checkServices(t, m)
			checkPDBs(t, m)
			checkSecretsReferenced(t, m, tc.secrets)
			checkServiceMonitor(t, m, tc.monitor)
			if !strings.Contains(m.notes, fullname+"-api") {
				t.Errorf("NOTES.txt does not name the api Service:\n%s", m.notes)
			}
		})
	}
}

// values is values.yaml with the case's values over it, as Helm merges them.
func values(t *testing.T, overlay string) chartutil.Values {
	t.Helper()
	base, err := chartutil.ReadValuesFile(chartDir + "/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	over, err := chartutil.ReadValues([]byte(overlay))
	if err != nil {
		t.Fatal(err)
	}
	return chartutil.CoalesceTables(over, base)
}

func lookup(t *testing.T, v chartutil.Values, path string) any {
	t.Helper()
	x, err := v.PathValue(path)
	if err != nil {
		t.Fatalf("values %s: %v", path, err)
	}
	return x
}

func checkNames(t *testing.T, m *manifests) {
	t.Helper()
	check := func(kind string, meta metav1.ObjectMeta, podLabels map[string]string) {
		for _, e := range validation.IsDNS1123Subdomain(meta.Name) {
			t.Errorf("%s %s: name: %s", kind, meta.Name, e)
		}
		for _, set := range []map[string]string{meta.Labels, podLabels} {
			for k, v := range set {
				for _, e := range append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...) {
					t.Errorf("%s %s: label %s=%s: %s", kind, meta.Name, k, v, e)
				}
			}
		}
	}
	for _, d := range m.deployments {
		check("Deployment", d.ObjectMeta, d.Spec.Template.Labels)
	}
	for _, d := range m.daemonSets {
		check("DaemonSet", d.ObjectMeta, d.Spec.Template.Labels)
	}
	for _, s := range m.services {
		check("Service", s.ObjectMeta, nil)
		for _, e := range validation.IsDNS1035Label(s.Name) {
			t.Errorf("Service %s: name: %s", s.Name, e)
		}
	}
	for _, c := range m.configMaps {
		check("ConfigMap", c.ObjectMeta, nil)
	}
	for _, p := range m.pdbs {
		check("PodDisruptionBudget", p.ObjectMeta, nil)
	}
}

func checkMeterd(t *testing.T, m *manifests, tc chartCase, vals chartutil.Values, certs pki) {
	t.Helper()
	if len(m.deployments) != len(roles) {
		t.Errorf("got %d Deployments, want %d (one per meterd role)", len(m.deployments), len(roles))
	}
	want := map[string]int{"ingest": tc.ingest, "rollup": 2, "api": toInt(t, lookup(t, vals, "api.replicas"))}
	for _, role := range roles {
		name := fullname + "-" + role
		d := m.deployments[name]
		if d == nil {
			t.Errorf("no Deployment %s", name)
			continue
		}
		where := "Deployment " + name
		if d.Spec.Replicas == nil || int(*d.Spec.Replicas) != want[role] {
			t.Errorf("%s: got replicas %v, want %d", where, ptrVal(d.Spec.Replicas), want[role])
		}
		checkSelector(t, where, d.Spec.Selector, d.Spec.Template.Labels)
		pod := d.Spec.Template.Spec
		checkPodSecurity(t, where, pod)
		if len(pod.Containers) != 1 {
			t.Fatalf("%s: got %d containers, want 1", where, len(pod.Containers))
		}
		c := pod.Containers[0]
		checkFlags(t, where, "meterd", c.Args)
		if got := argValue(c.Args, "role"); got != role {
			t.Errorf("%s: got --role=%s, want %s", where, got, role)
		}
		if role == "ingest" && want[role] > toInt(t, lookup(t, vals, "kafka.topics.events.partitions")) {
			t.Errorf("%s: more replicas than partitions", where)
		}
		tlsOn := lookup(t, vals, "tls.enabled") == true
		checkProbes(t, where, c, argValue(c.Args, "http-addr"), tlsOn)
		checkMounts(t, where, pod, c)
		checkResources(t, where, c)
		if mib := argValue(c.Args, "memory-limit-mib"); mib != "" {
			lim := c.Resources.Limits.Memory().Value() >> 20
			if n, _ := strconv.ParseInt(mib, 10, 64); n <= 0 || n >= lim {
				t.Errorf("%s: --memory-limit-mib=%s, want below the container's memory limit %d MiB (the Go heap's soft limit must leave room for the rest)", where, mib, lim)
			}
		}
		if got, want := argValue(c.Args, "clickhouse"), lookup(t, vals, "clickhouse.address"); got != want {
			t.Errorf("%s: got --clickhouse=%s, want %v", where, got, want)
		}
		if got := argValue(c.Args, "kafka-brokers"); got == "" {
			t.Errorf("%s: no --kafka-brokers", where)
		}
		if slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--clickhouse-cluster") }) {
			t.Errorf("%s: --clickhouse-cluster rendered without clickhouse.cluster", where)
		}
		if role == "api" && argValue(c.Args, "auth-keys") == "" {
			t.Errorf("%s: the api role needs --auth-keys", where)
		}
		validateContainer(t, m, where, "meterd", pod, c, certs)
	}
}

func checkGPUAgent(t *testing.T, m *manifests, tc chartCase, vals chartutil.Values, certs pki) {
	t.Helper()
	name := fullname + "-gpu-agent"
	ds := m.daemonSets[name]
	if !tc.gpu {
		if len(m.daemonSets) != 0 || m.services[name] != nil {
			t.Errorf("gpuAgent.enabled false, got DaemonSets %v and Service %v", keys(m.daemonSets), m.services[name] != nil)
		}
		return
	}
	if ds == nil {
		t.Fatalf("no DaemonSet %s", name)
	}
	where := "DaemonSet " + name
	checkSelector(t, where, ds.Spec.Selector, ds.Spec.Template.Labels)
	pod := ds.Spec.Template.Spec
	checkPodSecurity(t, where, pod)
	want, err := vals.Table("gpuAgent.nodeSelector")
	if err != nil {
		t.Fatal(err)
	}
	if len(want) == 0 || fmt.Sprint(map[string]any(want)) != fmt.Sprint(pod.NodeSelector) {
		t.Errorf("%s: got nodeSelector %v, want %v (GPU nodes only)", where, pod.NodeSelector, want)
	}
	if !slices.ContainsFunc(pod.Tolerations, func(tol corev1.Toleration) bool { return tol.Key == "nvidia.com/gpu" }) {
		t.Errorf("%s: no toleration of nvidia.com/gpu: GPU nodes are usually tainted so", where)
	}
	c := pod.Containers[0]
	checkFlags(t, where, "gpu-agent", c.Args)
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	for _, a := range c.Args {
		for _, ref := range regexp.MustCompile(`\$\(([A-Z_]+)\)`).FindAllStringSubmatch(a, -1) {
			if _, ok := env[ref[1]]; !ok {
				t.Errorf("%s: argument %s refers to $(%s), which the container's env does not define (Kubernetes would pass it verbatim)", where, a, ref[1])
			}
		}
	}
	if e := env["NODE_IP"]; e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "status.hostIP" {
		t.Errorf("%s: NODE_IP is not the node's IP from the downward API: %+v", where, e)
	}
	source := lookup(t, vals, "gpuAgent.source")
	if got := argValue(c.Args, "source"); got != source {
		t.Errorf("%s: got --source=%s, want %v", where, got, source)
	}
	switch source {
	case "dcgm-exporter":
		// dcgm-exporter listens on 9400 on the node (its default port).
		u := argValue(c.Args, "exporter-url")
		if u != "http://$(NODE_IP):9400/metrics" {
			t.Errorf("%s: got --exporter-url=%s, want dcgm-exporter on the node, http://$(NODE_IP):9400/metrics", where, u)
		}
	case "nvml", "dcgm":
		if pod.RuntimeClassName == nil && source == "nvml" {
			t.Errorf("%s: source nvml without the NVIDIA runtime class", where)
		}
		if env["NVIDIA_DRIVER_CAPABILITIES"].Value == "" {
			t.Errorf("%s: source %s without NVIDIA_DRIVER_CAPABILITIES", where, source)
		}
	}
	if got, want := argValue(c.Args, "topic"), lookup(t, vals, "kafka.topics.gpu"); got != want {
		t.Errorf("%s: got --topic=%s, want the ingest role's --gpu-topic %v", where, got, want)
	}
	if got, want := argValue(c.Args, "kafka-brokers"), argValue(m.deployments[fullname+"-ingest"].Spec.Template.Spec.Containers[0].Args, "kafka-brokers"); got != want {
		t.Errorf("%s: got --kafka-brokers=%s, want the ingest role's %s", where, got, want)
	}
	checkProbes(t, where, c, argValue(c.Args, "http-addr"), false)
	checkMounts(t, where, pod, c)
	checkResources(t, where, c)
	validateContainer(t, m, where, "gpu-agent", pod, c, certs)
}

func checkSelector(t *testing.T, where string, sel *metav1.LabelSelector, podLabels map[string]string) {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil || s.Empty() {
		t.Errorf("%s: selector %v: %v (empty: %v)", where, sel, err, err == nil && s.Empty())
		return
	}
	if !s.Matches(labels.Set(podLabels)) {
		t.Errorf("%s: selector %s does not match its pods' labels %v", where, s, podLabels)
	}
}

func checkPodSecurity(t *testing.T, where string, pod corev1.PodSpec) {
	t.Helper()
	psc := pod.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Errorf("%s: pod securityContext %+v: want runAsNonRoot and a non-zero runAsUser", where, psc)
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Errorf("%s: the pods do not call the Kubernetes API: want automountServiceAccountToken false", where)
	}
	if pod.HostNetwork || pod.HostPID || pod.HostIPC {
		t.Errorf("%s: uses the host's namespaces", where)
	}
	for _, c := range slices.Concat(pod.InitContainers, pod.Containers) {
		sc := c.SecurityContext
		switch {
		case sc == nil:
			t.Errorf("%s: container %s has no securityContext", where, c.Name)
		case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
			t.Errorf("%s: container %s: want readOnlyRootFilesystem", where, c.Name)
		case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
			t.Errorf("%s: container %s: want allowPrivilegeEscalation false", where, c.Name)
		case sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0:
			t.Errorf("%s: container %s: want capabilities drop ALL, add none: %+v", where, c.Name, sc.Capabilities)
		case sc.Privileged != nil && *sc.Privileged:
			t.Errorf("%s: container %s is privileged", where, c.Name)
		}
		if sc != nil && sc.RunAsUser != nil && *sc.RunAsUser == 0 {
			t.Errorf("%s: container %s runs as root", where, c.Name)
		}
		if !strings.Contains(c.Image, ":") || strings.HasSuffix(c.Image, ":") {
			t.Errorf("%s: container %s: image %q without a tag", where, c.Name, c.Image)
		}
	}
}

// checkProbes checks that the liveness and readiness probes GET
// /healthz/live and /healthz/ready on the port the process listens on
// (--http-addr), by a port the container declares.
func checkProbes(t *testing.T, where string, c corev1.Container, httpAddr string, tlsOn bool) {
	t.Helper()
	_, portStr, err := net.SplitHostPort(httpAddr)
	if err != nil {
		t.Errorf("%s: --http-addr=%q: %v", where, httpAddr, err)
		return
	}
	listen, _ := strconv.Atoi(portStr)
	for _, p := range []struct {
		kind  string
		probe *corev1.Probe
		path  string
	}{
		{"startup", c.StartupProbe, "/healthz/live"},
		{"liveness", c.LivenessProbe, "/healthz/live"},
		{"readiness", c.ReadinessProbe, "/healthz/ready"},
	} {
		if p.probe == nil {
			if p.kind != "startup" {
				t.Errorf("%s: no %s probe", where, p.kind)
			}
			continue
		}
		g := p.probe.HTTPGet
		if g == nil {
			t.Errorf("%s: %s probe is not an httpGet", where, p.kind)
			continue
		}
		if g.Path != p.path {
			t.Errorf("%s: %s probe GETs %s, want %s", where, p.kind, g.Path, p.path)
		}
		if got := containerPort(c, g.Port); got != listen {
			t.Errorf("%s: %s probe's port %s is container port %d, want %d (--http-addr %s)", where, p.kind, g.Port.String(), got, listen, httpAddr)
		}
		wantScheme := corev1.URISchemeHTTP
		if tlsOn {
			wantScheme = corev1.URISchemeHTTPS
		}
		if g.Scheme != wantScheme && !(g.Scheme == "" && wantScheme == corev1.URISchemeHTTP) {
			t.Errorf("%s: %s probe's scheme %s, want %s", where, p.kind, g.Scheme, wantScheme)
		}
	}
}

// containerPort resolves a named or numbered port of c; 0 when c has none
// by that name or number.
func containerPort(c corev1.Container, p intstr.IntOrString) int {
	for _, cp := range c.Ports {
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return int(cp.ContainerPort)
		}
	}
	return 0
}

// fileFlag tells whether a flag's value is a file the process reads.
var fileFlag = regexp.MustCompile(`(-file|^auth-keys|^prices|^deployment-map|-ca|-cert|-key)$`)

// checkMounts checks that each volume mount has its volume, that every file
// a flag names lies in a mounted Secret or ConfigMap item, and that no
// mount is left unused.
func checkMounts(t *testing.T, where string, pod corev1.PodSpec, c corev1.Container) {
	t.Helper()
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		vols[v.Name] = v
	}
	files := map[string]bool{}
	for _, vm := range c.VolumeMounts {
		v, ok := vols[vm.Name]
		if !ok {
			t.Errorf("%s: volume mount %s has no volume", where, vm.Name)
			continue
		}
		var items []corev1.KeyToPath
		switch {
		case v.Secret != nil:
			items = v.Secret.Items
		case v.ConfigMap != nil:
			items = v.ConfigMap.Items
		case v.EmptyDir != nil:
			continue
		default:
			t.Errorf("%s: volume %s is neither a Secret, a ConfigMap nor an emptyDir", where, v.Name)
		}
		if !vm.ReadOnly {
			t.Errorf("%s: mount %s of a Secret or ConfigMap is not readOnly", where, vm.Name)
		}
		for _, it := range items {
			files[strings.TrimSuffix(vm.MountPath, "/")+"/"+it.Path] = false
		}
	}
	for _, a := range c.Args {
		name, val, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !fileFlag.MatchString(name) {
			continue
		}
		if _, ok := files[val]; !ok {
			t.Errorf("%s: --%s=%s is no file of a mounted Secret or ConfigMap (mounted: %v)", where, name, val, keys(files))
			continue
		}
		files[val] = true
	}
	for f, used := range files {
		if !used {
			t.Errorf("%s: %s is mounted but no flag reads it", where, f)
		}
	}
}

func checkResources(t *testing.T, where string, c corev1.Container) {
	t.Helper()
	r := c.Resources
	if r.Requests.Cpu().IsZero() || r.Requests.Memory().IsZero() {
		t.Errorf("%s: want CPU and memory requests, got %v", where, r.Requests)
	}
	if lim := r.Limits.Memory(); lim.IsZero() || lim.Cmp(*r.Requests.Memory()) < 0 {
		t.Errorf("%s: want a memory limit at or above the request, got %v", where, r.Limits)
	}
}

// podsOf returns, for each workload, its pods' labels and containers.
func podsOf(m *manifests) map[string]corev1.PodTemplateSpec {
	pods := map[string]corev1.PodTemplateSpec{}
	for n, d := range m.deployments {
		pods[n] = d.Spec.Template
	}
	for n, d := range m.daemonSets {
		pods[n] = d.Spec.Template
	}
	return pods
}

// checkServices checks that every Service selects the pods of exactly one
// workload, and that its target ports are ports those pods declare; the api
// Service serves the api pods' http and grpc ports.
func checkServices(t *testing.T, m *manifests) {
	t.Helper()
	pods := podsOf(m)
	for name, s := range m.services {
		sel := labels.SelectorFromSet(s.Spec.Selector)
		if sel.Empty() {
			t.Errorf("Service %s selects every pod", name)
			continue
		}
		var matched []string
		for w, p := range pods {
			if sel.Matches(labels.Set(p.Labels)) {
				matched = append(matched, w)
			}
		}
		if len(matched) != 1 || matched[0] != name {
			t.Errorf("Service %s selects the pods of %v, want those of %s alone", name, matched, name)
			continue
		}
		c := pods[name].Spec.Containers[0]
		for _, sp := range s.Spec.Ports {
			if containerPort(c, sp.TargetPort) == 0 {
				t.Errorf("Service %s: port %s targets %s, which the pods do not declare", name, sp.Name, sp.TargetPort.String())
			}
		}
	}
	api := m.services[fullname+"-api"]
	if api == nil {
		t.Fatalf("no Service %s-api", fullname)
	}
	var names []string
	for _, p := range api.Spec.Ports {
		names = append(names, p.Name)
	}
	if !slices.Contains(names, "http") || !slices.Contains(names, "grpc") || api.Spec.ClusterIP == corev1.ClusterIPNone {
		t.Errorf("Service %s-api: ports %v, clusterIP %q: want http and grpc on a cluster IP", fullname, names, api.Spec.ClusterIP)
	}
}

// checkPDBs checks one PodDisruptionBudget per meterd role that selects
// exactly that role's pods and lets at least one go.
func checkPDBs(t *testing.T, m *manifests) {
	t.Helper()
	if len(m.pdbs) != len(roles) {
		t.Errorf("got %d PodDisruptionBudgets (%v), want one per meterd role", len(m.pdbs), keys(m.pdbs))
	}
	pods := podsOf(m)
	for _, role := range roles {
		name := fullname + "-" + role
		pdb := m.pdbs[name]
		if pdb == nil {
			t.Errorf("no PodDisruptionBudget %s", name)
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || sel.Empty() {
			t.Errorf("PodDisruptionBudget %s: selector %v: %v", name, pdb.Spec.Selector, err)
			continue
		}
		for w, p := range pods {
			if got, want := sel.Matches(labels.Set(p.Labels)), w == name; got != want {
				t.Errorf("PodDisruptionBudget %s: selects the pods of %s: %v, want %v", name, w, got, want)
			}
		}
		replicas := int(ptrVal(m.deployments[name].Spec.Replicas))
		switch {
		case pdb.Spec.MinAvailable != nil && pdb.Spec.MaxUnavailable != nil:
			t.Errorf("PodDisruptionBudget %s: both minAvailable and maxUnavailable", name)
		case pdb.Spec.MinAvailable != nil:
			if v, err := intstr.GetScaledValueFromIntOrPercent(pdb.Spec.MinAvailable, replicas, true); err != nil || v >= replicas {
				t.Errorf("PodDisruptionBudget %s: minAvailable %s of %d replicas blocks every eviction (a node drain would hang)", name, pdb.Spec.MinAvailable.String(), replicas)
			}
		case pdb.Spec.MaxUnavailable != nil:
			if v, err := intstr.GetScaledValueFromIntOrPercent(pdb.Spec.MaxUnavailable, replicas, true); err != nil || v < 1 {
				t.Errorf("PodDisruptionBudget %s: maxUnavailable %s blocks every eviction", name, pdb.Spec.MaxUnavailable.String())
			}
		default:
			t.Errorf("PodDisruptionBudget %s: neither minAvailable nor maxUnavailable", name)
		}
	}
}

// checkSecretsReferenced checks that the pods mount each expected Secret
// with the expected keys (and no other Secret), and that no environment
// variable holds a literal credential: they are referenced, never inlined
// (render fails on a Secret object among the manifests).
func checkSecretsReferenced(t *testing.T, m *manifests, want map[string][]string) {
	t.Helper()
	got := map[string][]string{}
	for w, p := range podsOf(m) {
		for _, v := range p.Spec.Volumes {
			if v.Secret == nil {
				continue
			}
			if len(v.Secret.Items) == 0 {
				t.Errorf("%s: Secret volume %s mounts every key: name the keys (items)", w, v.Name)
			}
			for _, it := range v.Secret.Items {
				if !slices.Contains(got[v.Secret.SecretName], it.Key) {
					got[v.Secret.SecretName] = append(got[v.Secret.SecretName], it.Key)
				}
			}
		}
		for _, c := range p.Spec.Containers {
			for _, e := range c.Env {
				if regexp.MustCompile(`(?i)pass|secret|token|key`).MatchString(e.Name) && e.Value != "" {
					t.Errorf("%s: env %s holds a literal value: want a secretKeyRef", w, e.Name)
				}
			}
			for _, a := range c.Args {
				if regexp.MustCompile(`(?i)password=|secret=`).MatchString(a) && !strings.Contains(a, "-file=") {
					t.Errorf("%s: argument %s holds a credential", w, a)
				}
			}
		}
	}
	for s := range got {
		slices.Sort(got[s])
	}
	for s := range want {
		slices.Sort(want[s])
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Secrets referenced (name: keys):\n got %v\nwant %v", got, want)
	}
}

func checkServiceMonitor(t *testing.T, m *manifests, enabled bool) {
	t.Helper()
	if !enabled {
		if len(m.serviceMonitors) != 0 {
			t.Errorf("serviceMonitor.enabled false, got ServiceMonitors %v", keys(m.serviceMonitors))
		}
		return
	}
	sm := m.serviceMonitors[fullname]
	if sm == nil {
		t.Fatalf("no ServiceMonitor %s (got %v)", fullname, keys(m.serviceMonitors))
	}
	if sm.Labels["release"] != "kube-prometheus-stack" {
		t.Errorf("ServiceMonitor labels %v lack serviceMonitor.labels", sm.Labels)
	}
	if !slices.Contains(sm.Spec.NamespaceSelector.MatchNames, namespace) {
		t.Errorf("ServiceMonitor namespaceSelector %v does not hold the release's namespace", sm.Spec.NamespaceSelector)
	}
	sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	// Every workload's metrics: each meterd role and gpu-agent.
	want := []string{fullname + "-api", fullname + "-gpu-agent", fullname + "-ingest", fullname + "-rollup"}
	var selected []string
	for name, s := range m.services {
		if !sel.Matches(labels.Set(s.Labels)) {
			continue
		}
		selected = append(selected, name)
		for _, ep := range sm.Spec.Endpoints {
			if !slices.ContainsFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port }) {
				t.Errorf("ServiceMonitor endpoint port %q: Service %s has no such port", ep.Port, name)
			}
			if ep.Path != "/metrics" {
				t.Errorf("ServiceMonitor endpoint path %q, want /metrics", ep.Path)
			}
		}
	}
	slices.Sort(selected)
	if !slices.Equal(selected, want) {
		t.Errorf("ServiceMonitor selects Services %v, want %v", selected, want)
	}
}

// TestChartRefuses checks values the chart must refuse with a message.
func TestChartRefuses(t *testing.T) {
	for _, tc := range []struct{ name, values, want string }{
		{"more ingest replicas than partitions", "kafka: {topics: {events: {partitions: 4}}}\ningest: {replicas: 5}", "exceeds kafka.topics.events.partitions"},
		{"SASL without its Secret", "kafka: {sasl: {mechanism: PLAIN, user: u}}", "kafka.sasl.existingSecret"},
		{"SASL mechanism meterd lacks", "kafka: {sasl: {mechanism: GSSAPI, user: u, existingSecret: s}}", "want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"},
		{"listener TLS without its Secret", "tls: {enabled: true}", "tls.existingSecret"},
		{"no ClickHouse", "clickhouse: {address: \"\"}", "clickhouse.address"},
		{"gpu-agent replay source", "gpuAgent: {source: replay}", "want dcgm-exporter, nvml or dcgm"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, tc.values)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("render: got error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestChartClickHouseCluster: clickhouse.cluster renders
// --clickhouse-cluster on every meterd role, and only then, and meterd -h
// lists the flag.
func TestChartClickHouseCluster(t *testing.T) {
	m := mustRender(t, "clickhouse: {cluster: tokenmeter}")
	if !binaryFlags(t, "meterd")["clickhouse-cluster"] {
		t.Fatal("meterd -h does not list --clickhouse-cluster")
	}
	for _, role := range roles {
		c := m.deployments[fullname+"-"+role].Spec.Template.Spec.Containers[0]
		if got := argValue(c.Args, "clickhouse-cluster"); got != "tokenmeter" {
			t.Errorf("%s: got --clickhouse-cluster=%q, want tokenmeter", role, got)
		}
		checkFlags(t, role, "meterd", c.Args)
	}
}

// TestChartLint runs Helm's linter (helm lint) on the chart, offline,
// with the default values, the secure ones and the alerts on.
func TestChartLint(t *testing.T) {
	for _, tc := range []struct{ name, values string }{{"defaults", ""}, {"secure", secureValues}, {"alerts", alertValues}} {
		t.Run(tc.name, func(t *testing.T) {
			vals, err := chartutil.ReadValues([]byte(tc.values))
			if err != nil {
				t.Fatal(err)
			}
			res := lint.AllWithKubeVersion(chartDir, vals, namespace, &kubeVersion)
			for _, msg := range res.Messages {
				if msg.Severity >= support.WarningSev {
					t.Errorf("helm lint: %s", msg)
				} else {
					t.Logf("helm lint: %s", msg)
				}
			}
		})
	}
}

// argValue returns the value of --name=value in args ("" when absent).
func argValue(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	return ""
}

func toInt(t *testing.T, v any) int {
	t.Helper()
	switch x := v.(type) {
	case float64:
		return int(x)
	case int:
		return x
	case int64:
		return int(x)
	}
	t.Fatalf("%v (%T) is not a number", v, v)
	return 0
}

func ptrVal[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func keys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
