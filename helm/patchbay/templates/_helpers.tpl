{{/* Object name prefix: the release name, plus the chart name unless it is already in it. */}}
{{- define "patchbay.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "patchbay.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ default .Chart.Name .Values.nameOverride }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: pass (list $ "plugin"). */}}
{{- define "patchbay.selectorLabels" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ default $.Chart.Name $.Values.nameOverride }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "patchbay.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "patchbay.pluginServiceAccount" -}}
{{- default (printf "%s-plugin" (include "patchbay.fullname" .)) .Values.kubeletPlugin.serviceAccount.name -}}
{{- end -}}

{{/* The plugin's vfConfig setting: explicit, else the file rendered from vfConfigData. */}}
{{- define "patchbay.vfConfig" -}}
{{- if .Values.kubeletPlugin.vfConfig -}}
{{- .Values.kubeletPlugin.vfConfig -}}
{{- else if .Values.kubeletPlugin.vfConfigData -}}
/etc/patchbay/vf-config.yaml
{{- end -}}
{{- end -}}

{{/* A setting as an env var (flag --x-y == env X_Y): pass (list "CDI_ROOT" value). Empty values are left out (= the process default "unset"). */}}
{{- define "patchbay.env" -}}
{{- $v := index . 1 -}}
{{- $s := toString $v -}}
{{- /* YAML numbers arrive as float64: a whole one is written as an integer
     (8388608, not 8.388608e+06, which an integer setting refuses). */ -}}
{{- if and (kindIs "float64" $v) (eq $v (float64 (int64 $v))) }}{{ $s = toString (int64 $v) }}{{ end -}}
{{- if or (kindIs "bool" $v) (kindIs "float64" $v) (kindIs "int64" $v) (kindIs "int" $v) (ne $s "") }}
- name: {{ index . 0 }}
  value: {{ $s | quote }}
{{- end -}}
{{- end -}}

{{/* The Secret holding the chart's TLS (ca.crt, tls.crt, tls.key): tls.secretName, else the one tls.yaml makes; empty when there is none (no fabric served, or fabricInsecure). */}}
{{- define "patchbay.tlsSecret" -}}
{{- if .Values.tls.secretName -}}
{{- .Values.tls.secretName -}}
{{- else if and .Values.fabric.enabled (not .Values.controller.fabricInsecure) -}}
{{- printf "%s-tls" (include "patchbay.fullname" .) -}}
{{- end -}}
{{- end -}}
