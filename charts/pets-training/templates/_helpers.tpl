{{/*
Names and labels shared by every template of the chart.
*/}}

{{/* The chart's short name: .Chart.Name unless nameOverride is set. */}}
{{- define "pets-training.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The name given to the release's objects. Truncated to 63 characters (the DNS label limit).
If the release name already contains the chart name, it is used as is.
*/}}
{{- define "pets-training.fullname" -}}
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

{{/* chart name and version, for the helm.sh/chart label. */}}
{{- define "pets-training.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object of the release. */}}
{{- define "pets-training.labels" -}}
helm.sh/chart: {{ include "pets-training.chart" . }}
{{ include "pets-training.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: pets-training
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels that select the operator's pods: stable across upgrades. */}}
{{- define "pets-training.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pets-training.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The ServiceAccount the operator runs as. */}}
{{- define "pets-training.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "pets-training.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name must be set when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator image: repository:tag (tag defaults to the chart's appVersion), or @digest. */}}
{{- define "pets-training.image" -}}
{{- $repo := .Values.image.repository }}
{{- if .Values.image.registry }}
{{- $repo = printf "%s/%s" .Values.image.registry .Values.image.repository }}
{{- end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repo .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repo (default .Chart.AppVersion .Values.image.tag | toString) }}
{{- end }}
{{- end }}

{{/* "true" when the operator watches a list of namespaces (namespaced mode), else "". */}}
{{- define "pets-training.namespaced" -}}
{{- if .Values.watch.namespaces }}true{{ end }}
{{- end }}

{{/*
The RBAC rules the operator needs inside the namespaces it watches (both modes).
Every verb and resource is named: no wildcards. Keep in step with operator/pets_operator/rbac.py
(the chart's unit test checks the grants equal it) and docs/chart.md.
*/}}
{{- define "pets-training.namespacedRules" -}}
# delete: ttlSecondsAfterFinished removes a finished PetsTraining.
- apiGroups: ["training.pets.dev"]
  resources: ["petstrainings"]
  verbs: ["get", "list", "watch", "patch", "update", "delete"]
- apiGroups: ["training.pets.dev"]
  resources: ["petstrainings/status"]
  verbs: ["get", "patch", "update"]
# Children carry ownerReferences with blockOwnerDeletion; clusters that enable the
# OwnerReferencesPermissionEnforcement admission plugin require this to set them.
- apiGroups: ["training.pets.dev"]
  resources: ["petstrainings/finalizers"]
  verbs: ["update"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["create", "get", "list", "watch", "delete", "patch"]
# The headless Service is created once per training and never changed (no patch).
- apiGroups: [""]
  resources: ["services"]
  verbs: ["create", "get", "list", "watch", "delete"]
# Pods are read: why they wait, rank 0's progress endpoint and termination messages (a crashed
# container's message is its last log lines, so logs themselves are never read). delete: only a pod of
# a training stuck terminating on a node the node controller marked lost (Ready Unknown), force-deleted.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "delete"]
# The NetworkPolicy around a training's pods (trainingNetworkPolicy): created once, owned by the
# training; deleted by the operator only when spec.networkPolicy or trainingNetworkPolicy.enabled turns
# it off. Never patched.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["create", "delete"]
# The output claim (spec.output.managedClaim, or the default output): created once before the first
# workload; get while the training waits, to say in status whether its claim is Pending. The garbage
# collector deletes it with its training (owner reference), so no delete here.
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["create", "get"]
# Events: written on the training; listed for pods that wait on a mount (FailedMount is in no status).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch", "list"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- if .Values.rbac.pytorchJobs }}
- apiGroups: ["kubeflow.org"]
  resources: ["pytorchjobs"]
  verbs: ["create", "get", "list", "watch", "delete", "patch"]
{{- end }}
{{- if .Values.rbac.kueue }}
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["list", "patch"]
{{- end }}
{{- if and .Values.peering.enabled (include "pets-training.namespaced" .) }}
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- with .Values.rbac.extraRules }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Cluster-scoped reads both modes need. Namespaced mode grants them in a ClusterRole of their own
(<release>-cluster-reads); empty when both switches are off.
rbac.nodes: get on the Node of a training's pod stuck terminating, to tell whether that node is lost.
rbac.storageClasses: list StorageClasses, once per training without spec.output, to fall back to an
emptyDir (and say so) when the cluster has no default StorageClass; without it the operator assumes
a default exists.
*/}}
{{- define "pets-training.clusterScopedRules" -}}
{{- if .Values.rbac.nodes }}
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get"]
{{- end }}
{{- if .Values.rbac.storageClasses }}
- apiGroups: ["storage.k8s.io"]
  resources: ["storageclasses"]
  verbs: ["list"]
{{- end }}
{{- end }}

{{/* Rules only cluster mode needs: kopf's cluster-wide scanning and the cluster peering. */}}
{{- define "pets-training.clusterOnlyRules" -}}
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- if .Values.peering.enabled }}
- apiGroups: ["kopf.dev"]
  resources: ["clusterkopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- end }}

{{/*
The scrape jobs the dashboard and the alerts read: the operator's (the ServiceMonitor's job is its
Service, <fullname>) and the trainers' (the PodMonitor sets it).
*/}}
{{- define "pets-training.operatorJob" -}}
{{- default (include "pets-training.fullname" .) .Values.metrics.prometheusRule.operatorJob -}}
{{- end }}

{{- define "pets-training.trainerJob" -}}
{{- printf "%s-trainers" (include "pets-training.fullname" . | trunc 54 | trimSuffix "-") -}}
{{- end }}
