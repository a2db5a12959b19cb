{{- define "gatehouse.labels" -}}
app.kubernetes.io/name: gatehouse
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "gatehouse.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end }}
