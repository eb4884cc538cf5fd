{{- define "nam.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "nam.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "nam.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "nam.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "nam.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nam.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "nam.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "nam.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "nam.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "nam.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator's image: repository:tag, or repository@digest when a digest is pinned
(the tag is then only informative and left out). */}}
{{- define "nam.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "nam.simulatorName" -}}
{{- printf "%s-sim" (include "nam.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Manager's URL: manager.url, else the simulator's Service, else empty. The chart renders
without one (`helm template` with the defaults works, for reviews and GitOps tools); NOTES
then says what is missing, and the operator refuses to start with "settings.url: no Manager
address given". */}}
{{- define "nam.managerUrl" -}}
{{- if .Values.manager.url }}
{{- .Values.manager.url }}
{{- else if .Values.simulator.enabled }}
{{- printf "http://%s.%s.svc:%d" (include "nam.simulatorName" .) .Release.Namespace (int .Values.simulator.port) }}
{{- end }}
{{- end }}

{{- define "nam.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "nam.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "nam.operatorSelectorLabels" -}}
{{ include "nam.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}
