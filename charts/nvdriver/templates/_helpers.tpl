{{- define "nvdriver.labels" -}}
app.kubernetes.io/name: nvdriver
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "nvdriver.selector" -}}
app.kubernetes.io/name: nvdriver
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "nvdriver.fullname" -}}
{{- printf "%s-controller" .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
