{{/* Chart name, truncated to the 63 characters a label allows. */}}
{{- define "triton-specdec.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Resource name: release-chart, or fullnameOverride. */}}
{{- define "triton-specdec.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "triton-specdec.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "triton-specdec.selectorLabels" -}}
app.kubernetes.io/name: {{ include "triton-specdec.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "triton-specdec.labels" -}}
helm.sh/chart: {{ include "triton-specdec.chart" . }}
{{ include "triton-specdec.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Whether a checkpoint volume is configured (PVC or hostPath); "true" or "". */}}
{{- define "triton-specdec.hasModelVolume" -}}
{{- if or .Values.models.existingClaim .Values.models.hostPath }}true{{ end }}
{{- end }}

{{/* The model name the OpenAI container serves: openai.servedModelName, else the name of the
tokenizer's directory (models.tokenizer, else models.target, else the image's default target). */}}
{{- define "triton-specdec.servedModelName" -}}
{{- .Values.openai.servedModelName | default (base (.Values.models.tokenizer | default .Values.models.target | default "/opt/specdec/models/default/target")) }}
{{- end }}
