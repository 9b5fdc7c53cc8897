{{/*
Labels of every object: the standard ones plus commonLabels. Selectors use only
app.kubernetes.io/name, as config/ does, so that an install made with kustomize can be taken over
(selectors are immutable).
*/}}
{{- define "peregrine.labels" -}}
app.kubernetes.io/part-of: peregrine
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* image REF: "repository:tag", the tag defaulting to the chart's appVersion. */}}
{{- define "peregrine.image" -}}
{{- $img := index .root.Values.images .name -}}
{{- printf "%s:%s" $img.repository (default .root.Chart.AppVersion $img.tag) -}}
{{- end }}

{{/* The namespace of the optional ServerSet and Pool. */}}
{{- define "peregrine.storeNamespace" -}}
{{- default .Release.Namespace .Values.serverSet.namespace -}}
{{- end }}

{{/* The management service address the CSI driver uses (see csi.mgmtAddress in values.yaml). */}}
{{- define "peregrine.mgmtAddress" -}}
{{- if .Values.csi.mgmtAddress -}}
{{- .Values.csi.mgmtAddress -}}
{{- else if .Values.serverSet.enabled -}}
{{- $n := .Values.serverSet.name -}}
{{- printf "%s-0.%s.%s.svc:%v" $n $n (include "peregrine.storeNamespace" .) (default 10001 .Values.serverSet.spec.controlPort) -}}
{{- else -}}
tank-0.tank.default.svc:10001
{{- end -}}
{{- end }}

{{- define "peregrine.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The kubelet's root directory without a trailing slash. */}}
{{- define "peregrine.kubeletDir" -}}
{{- trimSuffix "/" .Values.csi.kubeletDir -}}
{{- end }}
