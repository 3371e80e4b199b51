package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"sigs.k8s.io/yaml"
)

// alertsFile is the rule file the chart's PrometheusRule renders; the
// promtool unit tests of its alerts are alertsTests.
const (
	alertsFile  = chartDir + "/files/alerts.rules.yaml"
	alertsTests = "testdata/alerts.test.yaml"
)

// alertValues turns the alerts on (they need the business metrics).
const alertValues = "api: {usageMetrics: {enabled: true}}\nalerts: {enabled: true}\n"

// ruleFile is a Prometheus rule file.
type ruleFile struct {
	Groups []monitoringv1.RuleGroup `json:"groups"`
}

// sourceRules reads the chart's rule file strictly.
func sourceRules(t *testing.T) ruleFile {
	t.Helper()
	b, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		t.Fatalf("%s: %v", alertsFile, err)
	}
	return f
}

// renderedRules renders the chart with values and returns its one
// PrometheusRule.
func renderedRules(t *testing.T, values string) *monitoringv1.PrometheusRule {
	t.Helper()
	m := mustRender(t, values)
	r := m.prometheusRules[fullname]
	if r == nil || len(m.prometheusRules) != 1 {
		t.Fatalf("want one PrometheusRule %s, got %v", fullname, keys(m.prometheusRules))
	}
	return r
}

// promtool finds promtool (Debian's prometheus package). Without it the
// test skips, or fails under CI=true.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool not installed; CI must install it (apt-get install prometheus): the alert rules are checked and unit-tested with it")
		}
		t.Skip("promtool not installed (apt-get install prometheus): alert rules not checked")
	}
	return p
}

// runPromtool runs promtool with args in dir and fails the test with its
// output when it fails.
func runPromtool(t *testing.T, bin, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestAlertRulesPromtool renders the chart with alerts.enabled, writes the
// PrometheusRule's groups as a rule file and runs `promtool check rules`
// and `promtool test rules` (testdata/alerts.test.yaml: every alert fires
// in some case and stays quiet in others) on it: the rules Prometheus
// would load are the ones tested.
func TestAlertRulesPromtool(t *testing.T) {
	bin := promtool(t)
	rule := renderedRules(t, alertValues)
	dir := t.TempDir()
	b, err := yaml.Marshal(ruleFile{Groups: rule.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts.rules.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(alertsTests)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts.test.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	out := runPromtool(t, bin, dir, "check", "rules", "alerts.rules.yaml")
	if n := len(alertNames(sourceRules(t))); !strings.Contains(out, "SUCCESS: "+strconv.Itoa(n)+" rules found") {
		t.Errorf("promtool check rules: want %d rules:\n%s", n, out)
	}
	runPromtool(t, bin, dir, "test", "rules", "alerts.test.yaml")

	// Every alert is tested: named by an alert_rule_test with alerts
	// expected, and by one expecting none. (A case lists every alert of
	// its name firing at its time, so the inputs meant to stay quiet
	// beside a firing one are checked too.)
	var unit struct {
		Tests []struct {
			Name  string `json:"name"`
			Cases []struct {
				Alert  string `json:"alertname"`
				Alerts []any  `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(tests, &unit); err != nil {
		t.Fatal(err)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range unit.Tests {
		for _, c := range tc.Cases {
			if len(c.Alerts) > 0 {
				fires[c.Alert] = true
			} else {
				quiet[c.Alert] = true
			}
		}
	}
	for _, name := range alertNames(sourceRules(t)) {
		if !fires[name] || !quiet[name] {
			t.Errorf("%s: promtool cases where it fires %v, where none does %v: want both", name, fires[name], quiet[name])
		}
	}
}

// alertNames lists the alerts of f in order.
func alertNames(f ruleFile) []string {
	var names []string
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			names = append(names, r.Alert)
		}
	}
	return names
}

// TestAlertRulesChart: off by default; on, the PrometheusRule holds the
// rule file's groups unchanged (its one source), with alerts.labels on
// the object; alerts.ruleLabels are added to every alert without
// overriding its own; alerts.disabled leaves alerts out; the chart refuses
// alerts without the business metrics they read, and an unknown name in
// alerts.disabled.
func TestAlertRulesChart(t *testing.T) {
	if m := mustRender(t, ""); len(m.prometheusRules) != 0 {
		t.Errorf("default values rendered PrometheusRules %v; alerts are off by default", keys(m.prometheusRules))
	}

	src := sourceRules(t)
	rule := renderedRules(t, alertValues+"alerts: {enabled: true, labels: {release: kube-prometheus-stack}}\n")
	if !reflect.DeepEqual(src.Groups, rule.Spec.Groups) {
		a, _ := yaml.Marshal(src.Groups)
		b, _ := yaml.Marshal(rule.Spec.Groups)
		t.Errorf("rendered groups differ from %s:\n%s\nrendered:\n%s", alertsFile, a, b)
	}
	if rule.Labels["release"] != "kube-prometheus-stack" || rule.Labels["app.kubernetes.io/component"] != "alerts" {
		t.Errorf("PrometheusRule labels %v: want alerts.labels and the chart's", rule.Labels)
	}

	rule = renderedRules(t, alertValues+"alerts: {enabled: true, ruleLabels: {team: ml, severity: page}, disabled: [GPUTemperatureHigh, LLMQueueDepthHigh]}\n")
	var got []string
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			got = append(got, r.Alert)
			if r.Labels["team"] != "ml" || r.Labels["severity"] == "page" || r.Labels["severity"] == "" {
				t.Errorf("%s: labels %v, want team=ml added and its own severity kept", r.Alert, r.Labels)
			}
		}
	}
	want := slices.DeleteFunc(alertNames(src), func(n string) bool { return n == "GPUTemperatureHigh" || n == "LLMQueueDepthHigh" })
	if !slices.Equal(got, want) {
		t.Errorf("alerts with two disabled: %v, want %v", got, want)
	}

	for _, tc := range []struct{ name, values, want string }{
		{"without usage metrics", "alerts: {enabled: true}", "set api.usageMetrics.enabled"},
		{"unknown alert disabled", alertValues + "alerts: {enabled: true, disabled: [NoSuchAlert]}", `no alert "NoSuchAlert"`},
	} {
		if _, err := render(t, tc.values); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: render error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}
