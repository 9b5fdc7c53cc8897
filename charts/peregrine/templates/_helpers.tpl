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

{{/* NAMESPACE/NAME of the ServerSet the CSI driver serves (controlPlane.serverSetName). */}}
{{- define "peregrine.csiServerSet" -}}
{{- $name := .Values.controlPlane.serverSetName -}}
{{- $ns := .Values.controlPlane.serverSetNamespace -}}
{{- if not $name -}}
{{- $name = ternary .Values.serverSet.name "tank" .Values.serverSet.enabled -}}
{{- end -}}
{{- if not $ns -}}
{{- $ns = ternary (include "peregrine.storeNamespace" .) "default" .Values.serverSet.enabled -}}
{{- end -}}
{{- printf "%s/%s" $ns $name -}}
{{- end }}

{{/* The CSI driver's flag for the control plane, its certificate mounted at /etc/peregrine-tls. */}}
{{- define "peregrine.csiTLSArg" -}}
{{- if .Values.controlPlane.insecure -}}
- --insecure-control-plane
{{- else -}}
- --tls-dir=/etc/peregrine-tls
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

{{/*
The engine policy (operator.enginePolicy), comma-joined as the operator's flags take it. The
allowed images always include the chart's own engine repository (images.engine.repository, any
tag or digest), so that the chart's ServerSet and the samples run without listing it twice.
*/}}
{{- define "peregrine.allowedImages" -}}
{{- $repo := .Values.images.engine.repository -}}
{{- $l := concat .Values.operator.enginePolicy.allowedImages (list (printf "%s:" $repo) (printf "%s@" $repo)) -}}
{{- join "," (uniq $l) -}}
{{- end }}

{{- define "peregrine.allowedHostPaths" -}}
{{- join "," .Values.operator.enginePolicy.allowedHostPaths -}}
{{- end }}

{{- define "peregrine.allowedDevices" -}}
{{- join "," .Values.operator.enginePolicy.allowedDevices -}}
{{- end }}

{{/*
The rules of the operator on namespaced objects: its CRs, what it renders for a ServerSet, and
its events (controller-gen's config/rbac/role.yaml, rule for rule; operator-rbac.yaml's
ClusterRole has them when operator.watchNamespaces is empty): the Role in each of those namespaces.
*/}}
{{- define "peregrine.operatorNamespacedRules" -}}
- apiGroups: [""]
  resources: [configmaps, services]
  verbs: [create, get, list, patch, update, watch]
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [""]
  resources: [secrets]
  verbs: [create, get, patch, update]
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [create, get, list, patch, update, watch]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [create, get, list, patch, update, watch]
- apiGroups: [storage.peregrine.dev]
  resources: [containers, pools]
  verbs: [get, list, patch, update, watch]
- apiGroups: [storage.peregrine.dev]
  resources: [containers/finalizers, pools/finalizers, serversets/finalizers]
  verbs: [update]
- apiGroups: [storage.peregrine.dev]
  resources: [containers/status, pools/status, serversets/status]
  verbs: [get, patch, update]
- apiGroups: [storage.peregrine.dev]
  resources: [serversets]
  verbs: [get, list, watch]
{{- end }}
