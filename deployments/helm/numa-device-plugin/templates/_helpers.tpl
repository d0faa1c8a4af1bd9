{{/* The objects' name: the release name when it names the chart, else <release>-<chart>. */}}
{{- define "numa-device-plugin.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* What selects the plugin's pods. */}}
{{- define "numa-device-plugin.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Every object's labels. */}}
{{- define "numa-device-plugin.labels" -}}
{{ include "numa-device-plugin.selectorLabels" . }}
app.kubernetes.io/part-of: {{ .Chart.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The kubelet's root folder for the flavour: device-plugins/ and pod-resources/ are in it. */}}
{{- define "numa-device-plugin.kubeletRoot" -}}
{{- $flavour := .Values.kubelet.flavour -}}
{{- if eq $flavour "standard" -}}/var/lib/kubelet
{{- else if eq $flavour "k0s" -}}/var/lib/k0s/kubelet
{{- else if eq $flavour "microk8s" -}}/var/snap/microk8s/common/var/lib/kubelet
{{- else if eq $flavour "custom" -}}{{ required "kubelet.root is required with flavour custom" .Values.kubelet.root }}
{{- else -}}{{ fail (printf "unknown kubelet.flavour %q" $flavour) }}
{{- end -}}
{{- end -}}

{{/* The ConfigMap's data: the settings as serve's NUMA_* variables (never an empty one). */}}
{{- define "numa-device-plugin.settings" -}}
{{- $c := .Values.config -}}
NUMA_CAPACITY: {{ $c.capacity | toString | quote }}
NUMA_LOG_FORMAT: {{ $c.logFormat | quote }}
NUMA_LOG_LEVEL: {{ $c.logLevel | quote }}
{{- if $c.metricsPort }}
NUMA_METRICS_ADDRESS: {{ printf ":%d" (int $c.metricsPort) | quote }}
{{- end }}
NUMA_RESOURCE_PREFIX: {{ $c.resourcePrefix | quote }}
{{- if not (kindIs "invalid" $c.podResourcesInterval) }}
NUMA_POD_RESOURCES_INTERVAL: {{ $c.podResourcesInterval | toString | quote }}
{{- end }}
{{- if $c.reservedCpus }}
NUMA_RESERVED_CPUS: {{ $c.reservedCpus | quote }}
{{- end }}
{{- if $c.allowUnaligned }}
NUMA_ALLOW_UNALIGNED: "true"
{{- end }}
{{- end -}}
