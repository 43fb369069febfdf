{{/* Names, labels and the values several templates share. */}}

{{- define "kvtier.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kvtier.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "kvtier.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "kvtier.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kvtier.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "kvtier.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component (daemon, controller, redis). */}}
{{- define "kvtier.selector" -}}
app.kubernetes.io/name: {{ include "kvtier.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "kvtier.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The Secret holding the tokens. */}}
{{- define "kvtier.tokenSecret" -}}
{{- .Values.tokens.existingSecret | default (printf "%s-tokens" (include "kvtier.fullname" .)) -}}
{{- end -}}

{{/* Whether any Redis is configured, and its URL when it carries no secret. */}}
{{- define "kvtier.redisOn" -}}
{{- if or .Values.redis.externalSecret.name .Values.redis.externalURL .Values.redis.enabled -}}true{{- end -}}
{{- end -}}

{{- define "kvtier.redisBase" -}}
{{- if .Values.redis.externalURL -}}
{{- .Values.redis.externalURL -}}
{{- else -}}
{{- printf "redis://%s-redis:%d" (include "kvtier.fullname" .) (int .Values.redis.port) -}}
{{- end -}}
{{- end -}}

{{/* The controller's URL as the daemons reach it. */}}
{{- define "kvtier.controllerURL" -}}
{{- $scheme := ternary "https" "http" (not (empty .Values.controller.tls.secret)) -}}
{{- printf "%s://%s-controller:%d" $scheme (include "kvtier.fullname" .) (int .Values.controller.port) -}}
{{- end -}}
