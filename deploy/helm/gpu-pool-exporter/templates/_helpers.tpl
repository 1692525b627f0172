{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "gpu-pool-exporter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: the release name if it already contains the chart name, else
"<release>-<chart>". Scrape jobs take their name from it, and the shipped
alert GPUExporterDown matches job=~".*gpu-pool-exporter.*".
*/}}
{{- define "gpu-pool-exporter.fullname" -}}
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

{{- define "gpu-pool-exporter.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpu-pool-exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-pool-exporter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gpu-pool-exporter.labels" -}}
helm.sh/chart: {{ include "gpu-pool-exporter.chart" . }}
{{ include "gpu-pool-exporter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: exporter
app.kubernetes.io/part-of: gpu-pool-exporter
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "gpu-pool-exporter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpu-pool-exporter.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "gpu-pool-exporter.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.variant }}
{{- $tag = printf "%s-%s" $tag .Values.image.variant }}
{{- end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* Namespace of an optional object: its own setting, else the release's. */}}
{{- define "gpu-pool-exporter.namespaceOr" -}}
{{- default .root.Release.Namespace .namespace }}
{{- end }}

{{- define "gpu-pool-exporter.webConfigEnabled" -}}
{{- if or .Values.web.tls.enabled .Values.web.basicAuth.enabled .Values.web.extraConfig }}true{{ end }}
{{- end }}

{{- define "gpu-pool-exporter.scheme" -}}
{{- if .Values.web.tls.enabled }}https{{ else }}http{{ end }}
{{- end }}

{{/* Secret holding the basic-auth credentials the scrapers send. */}}
{{- define "gpu-pool-exporter.basicAuthSecretName" -}}
{{- printf "%s-basic-auth" (include "gpu-pool-exporter.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpu-pool-exporter.validate" -}}
{{- if and .Values.web.tls.enabled (not .Values.web.tls.secretName) }}
{{- fail "web.tls.enabled needs web.tls.secretName (a kubernetes.io/tls Secret)" }}
{{- end }}
{{- if and .Values.web.basicAuth.enabled (not .Values.web.basicAuth.password) }}
{{- fail "web.basicAuth.enabled needs web.basicAuth.password" }}
{{- end }}
{{- if and .Values.serviceMonitor.enabled .Values.podMonitor.enabled }}
{{- fail "enable serviceMonitor or podMonitor, not both: each GPU would be scraped twice" }}
{{- end }}
{{- if .Values.web.basicAuth.enabled }}
{{- range $kind := list "serviceMonitor" "podMonitor" }}
{{- $ns := (get $.Values $kind).namespace }}
{{- if and (get $.Values $kind).enabled $ns (ne $ns $.Release.Namespace) }}
{{- fail (printf "%s.namespace must be the release namespace with basic auth: the credentials Secret lives there" $kind) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and .Values.exporter.compatCounters.customMetrics .Values.exporter.compatCounters.existingConfigMap }}
{{- fail "set exporter.compatCounters.customMetrics or exporter.compatCounters.existingConfigMap, not both: each names the counters file" }}
{{- end }}
{{- if and (or .Values.exporter.compatCounters.customMetrics .Values.exporter.compatCounters.existingConfigMap) (not .Values.exporter.compatCounters.key) }}
{{- fail "exporter.compatCounters.key names the counters file in its ConfigMap: it must not be empty" }}
{{- end }}
{{- if and .Values.securityContext.privileged (eq (toString .Values.securityContext.allowPrivilegeEscalation) "false") }}
{{- fail "securityContext.privileged=true needs allowPrivilegeEscalation unset or true (the API rejects the pair)" }}
{{- end }}
{{- end }}


{{/*
The scrape shape of the ServiceMonitor and PodMonitor. Without
--compat.dcgm-exporter: honorLabels, so the exporter's namespace, pod and
container labels (the workload holding a GPU) win over the target's. With
it: honorLabels false, as dcgm-exporter's chart scrapes, so the DCGM_FI_*
families arrive as dcgm-exporter's do (the holder in exported_namespace,
exported_pod, exported_container; the exporter pod in namespace, pod,
container), and metricRelabelings that give the gpu_* families their own
namespace, pod and container back: the shipped rules
(gpu-pool-exporter.rules.yml) and dashboards read them unchanged.
*/}}
{{- define "gpu-pool-exporter.honorLabels" -}}
{{ not (include "gpu-pool-exporter.compatOn" .) }}
{{- end }}

{{/*
"true" when the dcgm-exporter families are served: compatDCGMExporter, or
a counters file (which implies it), else "".
*/}}
{{- define "gpu-pool-exporter.compatOn" -}}
{{- if or .Values.exporter.compatDCGMExporter (include "gpu-pool-exporter.compatCountersConfigMap" .) (include "gpu-pool-exporter.podMetaOn" .) .Values.exporter.compatKubernetes.enableDRA }}true{{ end }}
{{- end }}

{{/*
"true" when the exporter watches this node's pods on the API server (pod
labels or UIDs on the DCGM_FI_* series), else "".
*/}}
{{- define "gpu-pool-exporter.podMetaOn" -}}
{{- if or .Values.exporter.compatKubernetes.enablePodLabels .Values.exporter.compatKubernetes.enablePodUID }}true{{ end }}
{{- end }}

{{/*
"true" when the exporter calls the API server at all (pod labels or UIDs,
the ResourceSlice watch, the node condition): its token is mounted then.
*/}}
{{- define "gpu-pool-exporter.apiOn" -}}
{{- if or (include "gpu-pool-exporter.podMetaOn" .) .Values.exporter.draResourceSlices.enabled .Values.exporter.nodeCondition.enabled }}true{{ end }}
{{- end }}

{{/*
The ConfigMap holding dcgm-exporter's counters file: this chart's (from
exporter.compatCounters.customMetrics) or an existing one; "" for none.
*/}}
{{- define "gpu-pool-exporter.compatCountersConfigMap" -}}
{{- if .Values.exporter.compatCounters.customMetrics }}{{ include "gpu-pool-exporter.fullname" . }}-dcgm-exporter-counters
{{- else if .Values.exporter.compatCounters.existingConfigMap }}{{ .Values.exporter.compatCounters.existingConfigMap }}
{{- end }}
{{- end }}

{{- define "gpu-pool-exporter.compatMetricRelabelings" -}}
{{- if include "gpu-pool-exporter.compatOn" . }}
{{- range $l := list "namespace" "pod" "container" }}
- sourceLabels: [__name__, exported_{{ $l }}]
  regex: "gpu_.*;(.+)"
  targetLabel: {{ $l }}
  replacement: "$1"
  action: replace
- sourceLabels: [__name__]
  regex: "gpu_.*"
  targetLabel: exported_{{ $l }}
  replacement: ""
  action: replace
{{- end }}
{{- end }}
{{- end }}

{{/*
The rules file's gpu-pool-exporter.remediators group for the remediators
listed in . (the remediators value, shaped as alerts/remediators.yml's
list): the same text alerts.Remediators.RemediatorsGroup writes (the
chart's tests render the shipped list and compare).
*/}}
{{- define "gpu-pool-exporter.remediatorsGroup" -}}
{{- $gpuNodes := "          and on (node)\n            up{job=\"gpu-pool-exporter\"}\n" -}}
{{ "  " }}# BEGIN remediators: generated by make generate from alerts/remediators.yml; edit that file, not this group.
  # Who holds a node or a GPU: the remediators of alerts/remediators.yml,
  # each a verdict read from kube-state-metrics' node objects (a condition
  # True, a taint, a label) or the exporter's DRA device taints (NoSchedule
  # or NoExecute). Every result is sparse: series only where a remediator
  # holds something, on nodes with an exporter. Evaluated every cycle: the
  # critical GPU alerts read it.
  - name: gpu-pool-exporter.remediators
    rules:
{{- range $i, $r := . }}
{{- $rank := add1 $i }}
{{- if not (regexMatch "^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$" (toString $r.name)) }}
{{- fail (printf "remediators[%d].name %q: want letters, digits, '_', '-' or '.', up to 63 (it is the remediator label's value)" $i (toString $r.name)) }}
{{- end }}
{{- if eq $r.name "none" }}
{{- fail (printf "remediators[%d].name: \"none\" is the label of a fault nobody holds; name the remediator otherwise" $i) }}
{{- end }}
{{- $parts := list }}
{{- $kinds := list }}
{{- if $r.conditions }}
{{- $re := list }}{{- range $r.conditions }}{{- $re = append $re (. | regexQuoteMeta | replace "\\" "\\\\") }}{{- end }}
{{- $kinds = append $kinds "node conditions True" }}
{{- $parts = append $parts (printf "label_replace(label_replace(\n  group by (node, condition) (kube_node_status_condition{condition=~\"%s\", status=\"true\"} == 1),\n  \"verdict\", \"condition $1\", \"condition\", \"(.+)\"), \"condition\", \"\", \"\", \"\")" (join "|" $re)) }}
{{- end }}
{{- if $r.taints }}
{{- $re := list }}{{- range $r.taints }}{{- $re = append $re (. | regexQuoteMeta | replace "\\" "\\\\") }}{{- end }}
{{- $kinds = append $kinds "node taints" }}
{{- $parts = append $parts (printf "label_replace(label_replace(\n  group by (node, key) (kube_node_spec_taint{key=~\"%s\"}),\n  \"verdict\", \"taint $1\", \"key\", \"(.+)\"), \"key\", \"\", \"\", \"\")" (join "|" $re)) }}
{{- end }}
{{- range $key, $values := $r.labels }}
{{- $l := printf "label_%s" (regexReplaceAll "[^a-zA-Z0-9_]" $key "_") }}
{{- $re := list }}{{- range $values }}{{- $re = append $re (. | regexQuoteMeta | replace "\\" "\\\\") }}{{- end }}
{{- $kinds = append $kinds (printf "node label %s" $key) }}
{{- $parts = append $parts (printf "label_replace(label_replace(\n  group by (node, %s) (kube_node_labels{%s=~\"%s\"}),\n  \"verdict\", \"label %s=$1\", \"%s\", \"(.+)\"), \"%s\", \"\", \"\", \"\")" $l $l (join "|" $re) $key $l $l) }}
{{- end }}
{{- if $parts }}
      # {{ $r.name }} (rank {{ $rank }}): {{ join ", " $kinds }}.
      - record: node:gpu_remediator_verdict:rank
        expr: |
          {{ $rank }} * (
{{- range $pi, $part := $parts }}
{{- if $pi }}
            or
{{- end }}
{{- range splitList "\n" $part }}
              {{ . }}
{{- end }}
{{- end }}
          )
{{ $gpuNodes }}        labels:
          remediator: {{ $r.name | quote }}
{{- end }}
{{- if $r.deviceTaints }}
{{- $re := list }}{{- range $r.deviceTaints }}{{- $re = append $re (. | regexQuoteMeta | replace "\\" "\\\\") }}{{- end }}
      # {{ $r.name }} (rank {{ $rank }}): DRA device taints.
      - record: gpu:gpu_remediator_verdict:rank
        expr: |
          {{ $rank }} * label_replace(label_replace(
            group by (node, uuid, key) (gpu_dra_device_taint{job="gpu-pool-exporter", key=~"{{ join "|" $re }}", effect=~"NoSchedule|NoExecute"}),
            "verdict", "device taint $1", "key", "(.+)"), "key", "", "", "")
        labels:
          remediator: {{ $r.name | quote }}
{{- end }}
{{- end }}
      # The remediator that holds each node (each GPU): the first in
      # alerts/remediators.yml's order of those that hold it, value 1.
      - record: node:gpu_remediator:info
        expr: group by (node, remediator) (bottomk by (node) (1, node:gpu_remediator_verdict:rank))
      - record: gpu:gpu_remediator:info
        expr: group by (node, uuid, remediator) (bottomk by (node, uuid) (1, gpu:gpu_remediator_verdict:rank))
  # END remediators
{{ end }}

{{/*
The rules file text .rules with its remediators group replaced by the one
of .root's remediators value, when that lists any.
*/}}
{{- define "gpu-pool-exporter.withRemediators" -}}
{{- $rules := .rules }}
{{- with .root.Values.remediators }}
{{- $rules = regexReplaceAllLiteral "(?s)  # BEGIN remediators: [^\n]*\n.*?  # END remediators\n" $rules (include "gpu-pool-exporter.remediatorsGroup" .) }}
{{- end }}
{{- $rules }}
{{- end }}
