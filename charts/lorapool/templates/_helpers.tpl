{{/* Chart name, at most 63 characters. */}}
{{- define "lorapool.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Base name of every object. The release name when it already contains the chart name
("lorapool" -> lorapool-operator, the names deploy/rbac.yaml uses), else release-chart.
Truncated so that "<fullname>-operator-leader" stays a valid 63-character name.
*/}}
{{- define "lorapool.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 46 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 46 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 46 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "lorapool.operatorName" -}}
{{- printf "%s-operator" (include "lorapool.fullname" .) -}}
{{- end -}}

{{- define "lorapool.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "lorapool.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lorapool.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "lorapool.labels" -}}
{{ include "lorapool.selectorLabels" . }}
app.kubernetes.io/part-of: lorapool
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ include "lorapool.chart" . }}
{{- end -}}

{{- define "lorapool.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "lorapool.operatorName" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository@digest, or repository:tag (tag defaults to the chart's appVersion). */}}
{{- define "lorapool.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/* Image of the routers and sidecars the operator renders (--image). */}}
{{- define "lorapool.workloadImage" -}}
{{- default (include "lorapool.image" .) .Values.workloadImage -}}
{{- end -}}

{{/* Every replica, standbys included, serves /healthz: see values.yaml. */}}
{{- define "lorapool.probeLiveness" -}}
{{- if .Values.livenessProbe.enabled -}}
true
{{- end -}}
{{- end -}}

{{/*
The operator's rules, exactly those of deploy/rbac.yaml (tests/delivery checks that they are equal).
*/}}
{{- define "lorapool.operatorRules" -}}
# Its own API: read specs, write status only.
- apiGroups: [lorapool.io]
  resources: [lorapools, loraadapters]
  verbs: [get, list, watch]
- apiGroups: [lorapool.io]
  resources: [lorapools/status, loraadapters/status]
  verbs: [get, patch, update]
# Children it renders, applied with server-side apply (patch; create for first apply).
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [get, list, watch, create, patch]
# ConfigMaps: also deleted when a shrunk adapter set no longer renders a shard, only the pool's own.
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch, create, patch, delete]
# Services and NetworkPolicies: also deleted when a pool changes its front door (docs/gateway.md),
# only those the pool controls.
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create, patch, delete]
# Deployments and PodDisruptionBudgets: also deleted when a pool drops its rendered shared store or
# goes back to one router (docs/high-availability.md), only those the pool controls.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch, create, patch, delete]
# The gateway door's InferencePool (Gateway API Inference Extension), applied while its CRD is served.
- apiGroups: [inference.networking.k8s.io]
  resources: [inferencepools]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, list, watch, create, patch]
# Held so it may grant the router's Role (RBAC forbids granting what you do not hold).
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
# Engine pods: read their sidecars' reports (annotation and condition, docs/status.md),
# explain Pending pods in the pool's status, and annotate each with its placement slot and
# pod-deletion-cost (docs/placement.md).
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, patch]
# Held so it may grant the engine pods' and the routers' Roles: each sidecar (its report) and each
# router (its request counts) patches its own Pod's status.
- apiGroups: [""]
  resources: [pods/status]
  verbs: [patch]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end -}}
