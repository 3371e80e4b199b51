{{/* Names and labels. */}}
{{- define "tokenmeter.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 53 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 53 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The selector labels of one component: dict "root" . "component" NAME. */}}
{{- define "tokenmeter.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tokenmeter.labels" -}}
{{ include "tokenmeter.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: tokenmeter
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "tokenmeter.image" -}}
{{- printf "%s:%s" .image.repository (.image.tag | default .root.Chart.AppVersion) -}}
{{- end -}}

{{/* Ingest replicas: explicit, or ceil(partitions / partitionsPerReplica); never more than the partitions. */}}
{{- define "tokenmeter.ingestReplicas" -}}
{{- $parts := int .Values.kafka.topics.events.partitions -}}
{{- if lt $parts 1 }}{{ fail "kafka.topics.events.partitions must be at least 1" }}{{ end -}}
{{- $r := 0 -}}
{{- if kindIs "invalid" .Values.ingest.replicas -}}
{{- $per := int .Values.ingest.partitionsPerReplica -}}
{{- if lt $per 1 }}{{ fail "ingest.partitionsPerReplica must be at least 1" }}{{ end -}}
{{- $r = div (add $parts $per -1) $per -}}
{{- else -}}
{{- $r = int .Values.ingest.replicas -}}
{{- end -}}
{{- if gt $r $parts -}}
{{- fail (printf "ingest.replicas %d exceeds kafka.topics.events.partitions %d: the replicas beyond the partitions would sit idle in the consumer group" $r $parts) -}}
{{- end -}}
{{- $r -}}
{{- end -}}

{{/* Where mounted Secrets and ConfigMaps lie in the containers. */}}
{{- define "tokenmeter.paths" -}}
keys: /etc/tokenmeter/auth
prices: /etc/tokenmeter/prices
slo: /etc/tokenmeter/slo
tls: /etc/tokenmeter/tls
kafkaTLS: /etc/tokenmeter/kafka-tls
kafkaSASL: /etc/tokenmeter/kafka-sasl
clickhouse: /etc/tokenmeter/clickhouse
clickhouseTLS: /etc/tokenmeter/clickhouse-tls
deploymentMap: /etc/tokenmeter/deployment-map
billingWebhook: /etc/tokenmeter/billing-webhook
{{- end -}}

{{/* Kafka flags shared by meterd and gpu-agent (both register the same ones). */}}
{{- define "tokenmeter.kafkaArgs" -}}
{{- $p := include "tokenmeter.paths" . | fromYaml -}}
{{- $k := .Values.kafka -}}
- --kafka-brokers={{ required "kafka.brokers: give at least one host:port" (join "," $k.brokers) }}
{{- if $k.tls.enabled }}
- --kafka-tls=true
{{- if $k.tls.existingSecret }}
{{- if $k.tls.caKey }}
- --kafka-tls-ca={{ $p.kafkaTLS }}/{{ $k.tls.caKey }}
{{- end }}
{{- if $k.tls.clientCert }}
- --kafka-tls-cert={{ $p.kafkaTLS }}/{{ $k.tls.certKey }}
- --kafka-tls-key={{ $p.kafkaTLS }}/{{ $k.tls.keyKey }}
{{- end }}
{{- end }}
{{- with $k.tls.serverName }}
- --kafka-tls-server-name={{ . }}
{{- end }}
{{- end }}
{{- if $k.sasl.mechanism }}
{{- if not (has $k.sasl.mechanism (list "PLAIN" "SCRAM-SHA-256" "SCRAM-SHA-512")) }}
{{- fail (printf "kafka.sasl.mechanism %q: want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512" $k.sasl.mechanism) }}
{{- end }}
- --kafka-sasl-mechanism={{ $k.sasl.mechanism }}
- --kafka-sasl-user={{ required "kafka.sasl.user is required with kafka.sasl.mechanism" $k.sasl.user }}
- --kafka-sasl-password-file={{ $p.kafkaSASL }}/{{ $k.sasl.passwordKey }}
{{- end }}
{{- end -}}

{{- define "tokenmeter.kafkaVolumeMounts" -}}
{{- $p := include "tokenmeter.paths" . | fromYaml -}}
{{- if and .Values.kafka.tls.enabled .Values.kafka.tls.existingSecret }}
- name: kafka-tls
  mountPath: {{ $p.kafkaTLS }}
  readOnly: true
{{- end }}
{{- if .Values.kafka.sasl.mechanism }}
- name: kafka-sasl
  mountPath: {{ $p.kafkaSASL }}
  readOnly: true
{{- end }}
{{- end -}}

{{- define "tokenmeter.kafkaVolumes" -}}
{{- $k := .Values.kafka -}}
{{- if and $k.tls.enabled $k.tls.existingSecret }}
- name: kafka-tls
  secret:
    secretName: {{ $k.tls.existingSecret }}
    items:
      {{- if $k.tls.caKey }}
      - key: {{ $k.tls.caKey }}
        path: {{ $k.tls.caKey }}
      {{- end }}
      {{- if $k.tls.clientCert }}
      - key: {{ $k.tls.certKey }}
        path: {{ $k.tls.certKey }}
      - key: {{ $k.tls.keyKey }}
        path: {{ $k.tls.keyKey }}
      {{- end }}
{{- end }}
{{- if $k.sasl.mechanism }}
- name: kafka-sasl
  secret:
    secretName: {{ required "kafka.sasl.existingSecret (the Secret holding the SASL password) is required with kafka.sasl.mechanism" $k.sasl.existingSecret }}
    items:
      - key: {{ $k.sasl.passwordKey }}
        path: {{ $k.sasl.passwordKey }}
{{- end }}
{{- end -}}

{{/* The probes of a container serving /healthz on its port named "http". */}}
{{- define "tokenmeter.probes" -}}
{{- $scheme := "HTTP" }}{{ if .tls }}{{ $scheme = "HTTPS" }}{{ end -}}
# Migrations run before the listeners open (up to minutes on a large
# upgrade: docs/operations.md): the startup probe gives them 10 minutes.
startupProbe:
  httpGet:
    path: /healthz/live
    port: http
    scheme: {{ $scheme }}
  periodSeconds: 10
  failureThreshold: 60
livenessProbe:
  httpGet:
    path: /healthz/live
    port: http
    scheme: {{ $scheme }}
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /healthz/ready
    port: http
    scheme: {{ $scheme }}
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 3
{{- end -}}
