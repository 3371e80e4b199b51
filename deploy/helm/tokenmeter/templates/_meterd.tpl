{{/*
One meterd role as a Deployment: dict "root" $ "role" ingest|rollup|api.
Every configuration value is a flag (the same as meterd -h lists);
passwords and keys are files mounted from Secrets.
*/}}
{{- define "tokenmeter.meterd" -}}
{{- $root := .root -}}
{{- $role := .role -}}
{{- $cfg := index $root.Values $role -}}
{{- $v := $root.Values -}}
{{- $p := include "tokenmeter.paths" $root | fromYaml -}}
{{- $sel := dict "root" $root "component" $role -}}
{{- $replicas := $cfg.replicas -}}
{{- if eq $role "ingest" }}{{ $replicas = include "tokenmeter.ingestReplicas" $root | int }}{{ end -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "tokenmeter.fullname" $root }}-{{ $role }}
  labels:
    {{- include "tokenmeter.labels" $sel | nindent 4 }}
spec:
  replicas: {{ $replicas }}
  revisionHistoryLimit: 5
  selector:
    matchLabels:
      {{- include "tokenmeter.selectorLabels" $sel | nindent 6 }}
  strategy:
    type: RollingUpdate
    rollingUpdate:
      maxSurge: 1
      maxUnavailable: 0
  template:
    metadata:
      labels:
        {{- include "tokenmeter.labels" $sel | nindent 8 }}
        {{- with $v.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- $ann := deepCopy $v.podAnnotations }}
      {{- if and (eq $role "rollup") $v.slo }}
      {{- $_ := set $ann "checksum/slo" ($v.slo | toJson | sha256sum) }}
      {{- end }}
      {{- with $ann }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      automountServiceAccountToken: false
      {{- with $v.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $v.podSecurityContext | nindent 8 }}
      # The consumers write and commit the batches in hand within 30 s of SIGTERM.
      terminationGracePeriodSeconds: 45
      topologySpreadConstraints:
        - maxSkew: 1
          topologyKey: kubernetes.io/hostname
          whenUnsatisfiable: ScheduleAnyway
          labelSelector:
            matchLabels:
              {{- include "tokenmeter.selectorLabels" $sel | nindent 14 }}
      {{- with $cfg.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $cfg.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $cfg.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      containers:
        - name: meterd
          image: {{ include "tokenmeter.image" (dict "root" $root "image" $v.image) }}
          imagePullPolicy: {{ $v.image.pullPolicy }}
          args:
            - --role={{ $role }}
            - --http-addr=:8080
            - --grpc-addr=:9090
            - --log-level={{ $v.logLevel }}
            - --memory-limit-mib={{ int $cfg.memoryLimitMiB }}
            {{- include "tokenmeter.kafkaArgs" $root | nindent 12 }}
            - --events-topic={{ $v.kafka.topics.events.name }}
            - --gpu-topic={{ $v.kafka.topics.gpu }}
            - --engine-topic={{ $v.kafka.topics.engine }}
            - --dlq-topic={{ $v.kafka.topics.dlq }}
            - --group-id={{ $v.kafka.groupId }}
            - --clickhouse={{ required "clickhouse.address: host:port of ClickHouse's native protocol" $v.clickhouse.address }}
            - --clickhouse-database={{ $v.clickhouse.database }}
            - --clickhouse-compression={{ $v.clickhouse.compression }}
            {{- with $v.clickhouse.cluster }}
            - --clickhouse-cluster={{ . }}
            {{- end }}
            {{- with $v.clickhouse.user }}
            - --clickhouse-user={{ . }}
            {{- end }}
            {{- if $v.clickhouse.existingSecret }}
            - --clickhouse-password-file={{ $p.clickhouse }}/{{ $v.clickhouse.passwordKey }}
            {{- end }}
            {{- if $v.clickhouse.tls.enabled }}
            - --clickhouse-tls=true
            {{- if $v.clickhouse.tls.existingSecret }}
            - --clickhouse-tls-ca={{ $p.clickhouseTLS }}/{{ $v.clickhouse.tls.caKey }}
            {{- end }}
            {{- with $v.clickhouse.tls.serverName }}
            - --clickhouse-tls-server-name={{ . }}
            {{- end }}
            {{- end }}
            {{- if $v.tls.enabled }}
            - --tls-cert={{ $p.tls }}/tls.crt
            - --tls-key={{ $p.tls }}/tls.key
            {{- end }}
            {{- if eq $role "ingest" }}
            - --batch-size={{ int $cfg.batchSize }}
            - --batch-timeout={{ $cfg.batchTimeout }}
            {{- end }}
            {{- if eq $role "rollup" }}
            - --rollup-interval={{ $cfg.interval }}
            - --minute-retention={{ $v.minuteRetention }}
            {{- if $v.prices.existingSecret }}
            - --prices={{ $p.prices }}/{{ $v.prices.key }}
            {{- end }}
            {{- if $v.slo }}
            - --slo-file={{ $p.slo }}/slo.json
            {{- end }}
            {{- end }}
            {{- if eq $role "api" }}
            - --minute-retention={{ $v.minuteRetention }}
            - --auth-keys={{ $p.keys }}/{{ $v.auth.key }}
            {{- with $v.billing.zones }}
            - --billing-zones={{ . }}
            {{- end }}
            {{- with $v.billing.grace }}
            - --billing-grace={{ . }}
            {{- end }}
            {{- if $v.billing.byDeployment }}
            - --billing-by-deployment=true
            {{- end }}
            {{- with $v.billing.events.topic }}
            - --billing-events-topic={{ . }}
            {{- end }}
            {{- with $v.billing.events.webhook.url }}
            - --billing-webhook-url={{ . }}
            - --billing-webhook-secret-file={{ $p.billingWebhook }}/{{ $v.billing.events.webhook.secretKey }}
            {{- end }}
            {{- if $cfg.otlp.enabled }}
            - --otlp-grpc-addr=:{{ int $cfg.otlp.grpcPort }}
            - --otlp-http-addr=:{{ int $cfg.otlp.httpPort }}
            - --otlp-tenant-attribute={{ $cfg.otlp.tenantAttribute }}
            {{- if $cfg.otlp.ttftFromE2E }}
            - --otlp-ttft-from-e2e=true
            {{- end }}
            {{- end }}
            {{- if $cfg.usageMetrics.enabled }}
            - --usage-metrics=true
            - --usage-metrics-max-series={{ int $cfg.usageMetrics.maxSeries }}
            - --usage-metrics-interval={{ $cfg.usageMetrics.interval }}
            {{- end }}
            {{- end }}
            {{- with $cfg.extraArgs }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          ports:
            - name: http
              containerPort: 8080
              protocol: TCP
            - name: grpc
              containerPort: 9090
              protocol: TCP
            {{- if and (eq $role "api") $cfg.otlp.enabled }}
            - name: otlp-grpc
              containerPort: {{ int $cfg.otlp.grpcPort }}
              protocol: TCP
            - name: otlp-http
              containerPort: {{ int $cfg.otlp.httpPort }}
              protocol: TCP
            {{- end }}
          {{- include "tokenmeter.probes" (dict "tls" $v.tls.enabled) | nindent 10 }}
          resources:
            {{- toYaml $cfg.resources | nindent 12 }}
          securityContext:
            {{- toYaml $v.securityContext | nindent 12 }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
            {{- include "tokenmeter.kafkaVolumeMounts" $root | nindent 12 }}
            {{- if $v.clickhouse.existingSecret }}
            - name: clickhouse-password
              mountPath: {{ $p.clickhouse }}
              readOnly: true
            {{- end }}
            {{- if and $v.clickhouse.tls.enabled $v.clickhouse.tls.existingSecret }}
            - name: clickhouse-tls
              mountPath: {{ $p.clickhouseTLS }}
              readOnly: true
            {{- end }}
            {{- if $v.tls.enabled }}
            - name: tls
              mountPath: {{ $p.tls }}
              readOnly: true
            {{- end }}
            {{- if and (eq $role "rollup") $v.prices.existingSecret }}
            - name: prices
              mountPath: {{ $p.prices }}
              readOnly: true
            {{- end }}
            {{- if and (eq $role "rollup") $v.slo }}
            - name: slo
              mountPath: {{ $p.slo }}
              readOnly: true
            {{- end }}
            {{- if eq $role "api" }}
            - name: auth-keys
              mountPath: {{ $p.keys }}
              readOnly: true
            {{- end }}
            {{- if and (eq $role "api") $v.billing.events.webhook.url }}
            - name: billing-webhook
              mountPath: {{ $p.billingWebhook }}
              readOnly: true
            {{- end }}
      volumes:
        - name: tmp
          emptyDir:
            sizeLimit: 64Mi
        {{- include "tokenmeter.kafkaVolumes" $root | nindent 8 }}
        {{- if $v.clickhouse.existingSecret }}
        - name: clickhouse-password
          secret:
            secretName: {{ $v.clickhouse.existingSecret }}
            items:
              - key: {{ $v.clickhouse.passwordKey }}
                path: {{ $v.clickhouse.passwordKey }}
        {{- end }}
        {{- if and $v.clickhouse.tls.enabled $v.clickhouse.tls.existingSecret }}
        - name: clickhouse-tls
          secret:
            secretName: {{ $v.clickhouse.tls.existingSecret }}
            items:
              - key: {{ $v.clickhouse.tls.caKey }}
                path: {{ $v.clickhouse.tls.caKey }}
        {{- end }}
        {{- if $v.tls.enabled }}
        - name: tls
          secret:
            secretName: {{ required "tls.existingSecret (a kubernetes.io/tls Secret) is required with tls.enabled" $v.tls.existingSecret }}
            items:
              - key: tls.crt
                path: tls.crt
              - key: tls.key
                path: tls.key
        {{- end }}
        {{- if and (eq $role "rollup") $v.prices.existingSecret }}
        - name: prices
          secret:
            secretName: {{ $v.prices.existingSecret }}
            items:
              - key: {{ $v.prices.key }}
                path: {{ $v.prices.key }}
        {{- end }}
        {{- if and (eq $role "rollup") $v.slo }}
        - name: slo
          configMap:
            name: {{ include "tokenmeter.fullname" $root }}-slo
            items:
              - key: slo.json
                path: slo.json
        {{- end }}
        {{- if and (eq $role "api") $v.billing.events.webhook.url }}
        - name: billing-webhook
          secret:
            secretName: {{ required "billing.events.webhook.existingSecret (holding the webhook's signing secret) is required with billing.events.webhook.url" $v.billing.events.webhook.existingSecret }}
            items:
              - key: {{ $v.billing.events.webhook.secretKey }}
                path: {{ $v.billing.events.webhook.secretKey }}
        {{- end }}
        {{- if eq $role "api" }}
        - name: auth-keys
          secret:
            secretName: {{ $v.auth.existingSecret | default (printf "%s-api-keys" (include "tokenmeter.fullname" $root)) }}
            items:
              - key: {{ $v.auth.key }}
                path: {{ $v.auth.key }}
        {{- end }}
{{- end -}}
