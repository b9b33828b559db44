{{/* The release's name for its objects, at most 63 characters. */}}
{{- define "tributary.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tributary.headless" -}}
{{- printf "%s-peers" (include "tributary.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tributary.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tributary.labels" -}}
{{ include "tributary.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tributary.caSecret" -}}
{{- .Values.tls.caSecret | default (printf "%s-ca" (include "tributary.fullname" .)) -}}
{{- end -}}

{{- define "tributary.clusterKeySecret" -}}
{{- .Values.clusterKey.existingSecret | default (printf "%s-cluster-key" (include "tributary.fullname" .)) -}}
{{- end -}}

{{/* Where the node reads the cluster key (the Secret's `cluster-key`, mounted read-only). */}}
{{- define "tributary.clusterKeyFile" -}}
/etc/tributary/cluster-key/cluster.key
{{- end -}}

{{- define "tributary.authSecret" -}}
{{- .Values.auth.existingSecret | default (printf "%s-auth" (include "tributary.fullname" .)) -}}
{{- end -}}

{{/* The client Service's DNS name inside the cluster. */}}
{{- define "tributary.clientHost" -}}
{{- printf "%s.%s.svc" (include "tributary.fullname" .) .Release.Namespace -}}
{{- end -}}

{{- define "tributary.endpoint" -}}
{{- printf "%s://%s:%d" (ternary "https" "http" .Values.tls.enabled) (include "tributary.clientHost" .) (int .Values.service.clientPort) -}}
{{- end -}}

{{/* Peer addresses of the first bootstrapExpect pods, through the headless Service. */}}
{{- define "tributary.seeds" -}}
{{- $fullname := include "tributary.fullname" . -}}
{{- $headless := include "tributary.headless" . -}}
{{- $seeds := list -}}
{{- range $i := until (int (min .Values.bootstrapExpect .Values.replicas)) -}}
{{- $seeds = append $seeds (printf "%s-%d.%s.%s.svc:7401" $fullname $i $headless $.Release.Namespace) -}}
{{- end -}}
{{- toJson $seeds -}}
{{- end -}}

{{/* The node's TOML file: settings every node shares (per-node ones come from env). */}}
{{- define "tributary.config" -}}
{{- if not (or .Values.tls.enabled .Values.clusterKey.enabled (index .Values.config "peer_insecure")) }}
{{- fail "the peer port needs tls.enabled or clusterKey.enabled: a node refuses to start with its peer port open to the network and nothing authenticating the nodes that connect (config.peer_insecure: true accepts that, on an isolated network only)" }}
{{- end -}}
# Rendered by the Tributary chart; per-node settings (node id, advertised addresses) come from the
# environment. Keys as in `tributary serve --help`, with '_' for '-'.
data_dir = "/data"
client_addr = "0.0.0.0:7400"
peer_addr = "0.0.0.0:7401"
http_addr = "0.0.0.0:7402"
{{- if .Values.amqp.plainText }}
amqp_addr = "0.0.0.0:5672"
{{- else }}
amqp_addr = "none"
{{- end }}
{{- if .Values.tls.enabled }}
amqps_addr = "0.0.0.0:5671"
{{- end }}
blob_addr = "0.0.0.0:10000"
kafka_addr = "0.0.0.0:9092"
{{- if .Values.tls.enabled }}
kafka_tls_addr = "0.0.0.0:9093"
{{- end }}
seeds = {{ include "tributary.seeds" . }}
bootstrap_expect = {{ int .Values.bootstrapExpect }}
controller_voters = {{ int .Values.controllerVoters }}
capacity_units = {{ int .Values.capacityUnits }}
auth = {{ .Values.auth.mode | quote }}
log_json = {{ .Values.logJson }}
{{- if .Values.tls.enabled }}
peer_ca = "/etc/tributary/ca/ca.pem"
{{- end }}
{{- if .Values.clusterKey.enabled }}
cluster_key_file = "{{ include "tributary.clusterKeyFile" . }}"
{{- end }}
{{- range $key, $value := .Values.config }}
{{ $key }} = {{ if kindIs "string" $value }}{{ $value | quote }}{{ else }}{{ toJson $value }}{{ end }}
{{- end }}
{{- end -}}

{{/* Environment of the CLI in the helm test: the endpoint, its CA and the root key. */}}
{{- define "tributary.testEnv" -}}
- name: TRIBUTARY_ENDPOINT
  value: {{ include "tributary.endpoint" . | quote }}
{{- if .Values.tls.enabled }}
- name: TRIBUTARY_CA_CERT
  value: /etc/tributary/ca/ca.pem
{{- end }}
{{- if eq .Values.auth.mode "sas" }}
- name: ROOT_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "tributary.authSecret" . }}
      key: root-key
- name: TRIBUTARY_CONNECTION_STRING
  value: "Endpoint=sb://{{ include "tributary.clientHost" . }}:{{ .Values.service.clientPort }}/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=$(ROOT_KEY)"
{{- end }}
{{- end -}}

{{- define "tributary.testMounts" -}}
{{- if .Values.tls.enabled -}}
- name: ca-certificate
  mountPath: /etc/tributary/ca
  readOnly: true
{{- end -}}
{{- end -}}
