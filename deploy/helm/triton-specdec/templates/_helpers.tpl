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

{{/* The SPECDEC_* settings, the same in both containers: the server's models read them, and the
OpenAI gateway applies the same request limits (max_tokens, K, proposer, prompt size) before a
request leaves it. SPECDEC_SHUTDOWN_GRACE_S: how long tritonserver (--exit-timeout-secs, from the
launcher) and the gateway keep serving the streams under way after SIGTERM, the pod's
terminationGracePeriodSeconds less 5 s for the exit itself (specdec/launcher/shutdown.py). */}}
{{- define "triton-specdec.settingsEnv" -}}
{{- with .Values.models.target }}
- name: SPECDEC_TARGET_MODEL
  value: {{ . | quote }}
{{- end }}
{{- with .Values.models.draft }}
- name: SPECDEC_DRAFT_MODEL
  value: {{ . | quote }}
{{- end }}
{{- with .Values.models.eagleHead }}
- name: SPECDEC_EAGLE_HEAD
  value: {{ . | quote }}
{{- end }}
{{- with .Values.models.tokenizer }}
- name: SPECDEC_TOKENIZER
  value: {{ . | quote }}
{{- end }}
- name: SPECDEC_DEFAULT_MAX_TOKENS
  value: {{ .Values.specdec.defaultMaxTokens | int64 | quote }}
{{- with .Values.specdec.defaultProposer }}
- name: SPECDEC_DEFAULT_PROPOSER
  value: {{ . | quote }}
{{- end }}
- name: SPECDEC_DEFAULT_NUM_DRAFT_TOKENS
  value: {{ .Values.specdec.numDraftTokens | int64 | quote }}
- name: SPECDEC_MAX_DRAFT_TOKENS
  value: {{ .Values.specdec.maxDraftTokens | int64 | quote }}
- name: SPECDEC_DRAFT_TIMEOUT_S
  value: {{ .Values.specdec.draftTimeoutS | quote }}
- name: SPECDEC_MAX_SEQUENCES
  value: {{ .Values.specdec.maxSequences | int64 | quote }}
- name: SPECDEC_MAX_SEQ_LEN
  value: {{ .Values.specdec.maxSeqLen | int64 | quote }}
- name: SPECDEC_MAX_TOKENS_LIMIT
  value: {{ .Values.specdec.maxTokensLimit | int64 | quote }}
- name: SPECDEC_QUEUE_TIMEOUT_S
  value: {{ .Values.specdec.queueTimeoutS | quote }}
- name: SPECDEC_DTYPE
  value: {{ .Values.specdec.dtype | quote }}
- name: SPECDEC_ATTENTION
  value: {{ .Values.specdec.attention | quote }}
- name: SPECDEC_CUDA_GRAPHS
  value: {{ .Values.specdec.cudaGraphs | quote }}
{{- include "triton-specdec.placementEnv" . }}
- name: SPECDEC_SHUTDOWN_GRACE_S
  value: {{ max 0 (sub (int .Values.terminationGracePeriodSeconds) 5) | quote }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Where the target and the draft run (docs/deploy.md, "Targets larger than one GPU"): SPECDEC_TENSOR_PARALLEL is
specdec.tensorParallel, else gpu.count (the pod's GPUs, one rank each), unless extraEnv sets it;
with specdec.targetDevices alone, the devices' count is the degree and no degree is set. A degree
above gpu.count would leave ranks without a GPU: refused here. */}}
{{- define "triton-specdec.placementEnv" -}}
{{- $userSet := false }}
{{- range .Values.extraEnv }}
{{- if eq .name "SPECDEC_TENSOR_PARALLEL" }}{{ $userSet = true }}{{ end }}
{{- end }}
{{- $gpus := int .Values.gpu.count }}
{{- $degree := int (.Values.specdec.tensorParallel | default (max 1 $gpus)) }}
{{- if and (gt $gpus 0) (gt $degree $gpus) }}
{{- fail (printf "specdec.tensorParallel %d needs a GPU per rank: gpu.count is %d" $degree $gpus) }}
{{- end }}
{{- if not (or $userSet (and .Values.specdec.targetDevices (not .Values.specdec.tensorParallel))) }}
- name: SPECDEC_TENSOR_PARALLEL
  value: {{ $degree | quote }}
{{- end }}
{{- with .Values.specdec.targetDevices }}
- name: SPECDEC_TARGET_DEVICES
  value: {{ . | quote }}
{{- end }}
{{- with .Values.specdec.draftDevice }}
- name: SPECDEC_DRAFT_DEVICE
  value: {{ . | quote }}
{{- end }}
{{- end }}
