{{/* The chart's name, and the release's full name (63 characters at most). */}}
{{- define "tollgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tollgate.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "tollgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tollgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tollgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "tollgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "tollgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tollgate.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The Secret and key holding the admin token. */}}
{{- define "tollgate.adminSecret" -}}
{{- default (printf "%s-admin" (include "tollgate.fullname" .)) .Values.admin.existingSecret -}}
{{- end -}}

{{/* Refuses value combinations that cannot work, naming the value. */}}
{{- define "tollgate.validate" -}}
{{- if not (has .Values.kind (list "Deployment" "DaemonSet")) -}}
{{- fail (printf "kind: %q is neither Deployment nor DaemonSet" .Values.kind) -}}
{{- end -}}
{{- if and .Values.autoscaling.enabled (eq .Values.kind "DaemonSet") -}}
{{- fail "autoscaling.enabled: a DaemonSet runs one pod per node and cannot be autoscaled; use kind: Deployment" -}}
{{- end -}}
{{- if and .Values.admin.token (lt (len .Values.admin.token) 16) -}}
{{- fail "admin.token: tollgate needs at least 16 characters" -}}
{{- end -}}
{{- if and .Values.redis.existingSecret (not .Values.redis.url) -}}
{{- fail "redis.existingSecret: set redis.url too (it may read the password as ${REDIS_PASSWORD})" -}}
{{- end -}}
{{- if not (kindIs "map" .Values.config) -}}
{{- fail "config: must be a map (the tollgate config as YAML)" -}}
{{- end -}}
{{- if hasKey .Values.config "listeners" -}}
{{- fail "config.listeners: set by the chart (from ports and tls); remove it from config" -}}
{{- end -}}
{{- range $key := list "bind" "token" "enabled" -}}
{{- if hasKey (default (dict) $.Values.config.admin) $key -}}
{{- fail (printf "config.admin.%s: set by the chart (from ports.admin and admin); remove it from config" $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The tollgate config: the values' config with the chart's parts set. */}}
{{- define "tollgate.config" -}}
{{- $config := deepCopy .Values.config -}}
{{- $listeners := list (dict "name" "http" "bind" (printf "0.0.0.0:%d" (int .Values.ports.http))) -}}
{{- if .Values.tls.secrets -}}
{{- $certs := list -}}
{{- range .Values.tls.secrets -}}
{{- $certs = append $certs (dict "cert" (printf "/etc/tollgate/tls/%s/tls.crt" .) "key" (printf "/etc/tollgate/tls/%s/tls.key" .)) -}}
{{- end -}}
{{- $listeners = append $listeners (dict "name" "https" "bind" (printf "0.0.0.0:%d" (int .Values.ports.https)) "tls" (dict "certs" $certs)) -}}
{{- end -}}
{{- $_ := set $config "listeners" $listeners -}}
{{- $admin := default (dict) $config.admin -}}
{{- $_ = set $admin "bind" (printf "0.0.0.0:%d" (int .Values.ports.admin)) -}}
{{- $_ = set $admin "token" (list "${TOLLGATE_ADMIN_TOKEN}") -}}
{{- $_ = set $config "admin" $admin -}}
{{- if .Values.redis.url -}}
{{- $store := default (dict) $config.store -}}
{{- $_ = set $store "kind" "redis" -}}
{{- $_ = set $store "url" .Values.redis.url -}}
{{- if and (eq .Values.kind "Deployment") (not .Values.autoscaling.enabled) (not (hasKey $store "replicas")) -}}
{{- $_ = set $store "replicas" (int .Values.replicaCount) -}}
{{- end -}}
{{- $_ = set $config "store" $store -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}
