{{/* The chart's name in names and labels: nameOverride, else the chart's. */}}
{{- define "numa-device-plugin.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The objects' name: fullnameOverride; else the release name when it holds the name,
else <release>-<name>. */}}
{{- define "numa-device-plugin.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "numa-device-plugin.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* What selects the plugin's pods. */}}
{{- define "numa-device-plugin.selectorLabels" -}}
app.kubernetes.io/name: {{ include "numa-device-plugin.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The container's image: <repository>:<tag>, with image.digest <repository>:<tag>@<digest>
(the digest is what the runtime pulls; the tag stays for people reading the pod). */}}
{{- define "numa-device-plugin.image" -}}
{{- $image := .Values.image -}}
{{- $ref := printf "%s:%s" $image.repository ($image.tag | default .Chart.AppVersion) -}}
{{- if $image.digest -}}{{- $ref = printf "%s@%s" $ref $image.digest -}}{{- end -}}
{{- $ref -}}
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
{{- if not $c.debugEndpoints }}
NUMA_DEBUG_ENDPOINTS: "false"
{{- end }}
{{- end }}
{{- if and $c.reservedCpus (ne (toString $c.capacity) "cpus") }}
{{- fail (printf "config.reservedCpus %q needs config.capacity \"cpus\" (it is %v): reserved CPUs are counted only in the cpus mode" $c.reservedCpus $c.capacity) }}
{{- end }}
{{- if and $c.reservedMemory (not $c.memoryUnit) }}
{{- fail (printf "config.reservedMemory %q needs config.memoryUnit (memory devices are off without it)" $c.reservedMemory) }}
{{- end }}
NUMA_RESOURCE_PREFIX: {{ $c.resourcePrefix | quote }}
{{- if not (kindIs "invalid" $c.podResourcesInterval) }}
NUMA_POD_RESOURCES_INTERVAL: {{ $c.podResourcesInterval | toString | quote }}
{{- end }}
{{- if not (kindIs "invalid" $c.deviceInterval) }}
NUMA_DEVICE_INTERVAL: {{ $c.deviceInterval | toString | quote }}
{{- end }}
{{- if $c.reservedCpus }}
NUMA_RESERVED_CPUS: {{ $c.reservedCpus | quote }}
{{- end }}
{{- if $c.allowUnaligned }}
NUMA_ALLOW_UNALIGNED: "true"
{{- end }}
{{- if and (eq (toString $c.anyResource) "on") (ne (toString $c.capacity) "cpus") }}
{{- fail (printf "config.anyResource \"on\" needs config.capacity \"cpus\" (it is %v): a slot count cannot tell the scheduler what fits on one NUMA node" $c.capacity) }}
{{- end }}
{{- if and $c.anyResource (ne (toString $c.anyResource) "auto") }}
NUMA_ANY_RESOURCE: {{ $c.anyResource | quote }}
{{- end }}
{{- if and (eq (toString $c.socketResources) "on") (ne (toString $c.capacity) "cpus") }}
{{- fail (printf "config.socketResources \"on\" needs config.capacity \"cpus\" (it is %v): a slot count cannot tell the scheduler what fits on one NUMA node" $c.capacity) }}
{{- end }}
{{- if and $c.socketResources (ne (toString $c.socketResources) "auto") }}
NUMA_SOCKET_RESOURCES: {{ $c.socketResources | quote }}
{{- end }}
{{- if $c.memoryUnit }}
NUMA_MEMORY_UNIT: {{ $c.memoryUnit | quote }}
{{- end }}
{{- if $c.reservedMemory }}
NUMA_RESERVED_MEMORY: {{ $c.reservedMemory | quote }}
{{- end }}
{{- include "numa-device-plugin.checkNear" (list "config.near" $c.near) -}}
{{- if $c.near }}
{{- $near := list -}}
{{- range $name, $given := $c.near -}}
{{- /* a list: selectors that must all agree, the name repeated for each */ -}}
{{- range (kindIs "slice" $given | ternary $given (list $given)) -}}
{{- $near = append $near (printf "%s=%s" $name .) -}}
{{- end -}}
{{- end }}
NUMA_NEAR: {{ join " " $near | quote }}
{{- end }}
{{- if include "numa-device-plugin.perNode" . }}
NUMA_CONFIG_FILE: {{ include "numa-device-plugin.configFile" . | quote }}
{{- if not (kindIs "invalid" $c.nodeConfigInterval) }}
NUMA_NODE_CONFIG_INTERVAL: {{ $c.nodeConfigInterval | toString | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Where the pods find the named configurations (a subPath mount: a ConfigMap update
reaches a node only when the checksum rolls its pod, one node at a time). */}}
{{- define "numa-device-plugin.configFile" -}}/etc/numa-device-plugin/configs.yaml{{- end -}}

{{/* The file of named configurations, in the keys of serve's flags. Fails for a default
naming no configuration, or a configuration whose reservedCpus (its own or inherited)
come without capacity "cpus". */}}
{{- define "numa-device-plugin.nodeConfigs" -}}
{{- $c := .Values.config -}}
{{- $keys := dict "capacity" "capacity" "resourcePrefix" "resource-prefix" "podResourcesInterval" "pod-resources-interval" "reservedCpus" "reserved-cpus" "allowUnaligned" "allow-unaligned" "anyResource" "any-resource" "socketResources" "socket-resources" "memoryUnit" "memory-unit" "reservedMemory" "reserved-memory" "near" "near" -}}
{{- $configs := dict -}}
{{- range $name, $settings := $c.named -}}
{{- $s := $settings | default dict -}}
{{- $out := dict -}}
{{- range $key, $value := $s -}}
{{- $_ := set $out (get $keys $key) $value -}}
{{- end -}}
{{- $capacity := (hasKey $s "capacity") | ternary (get $s "capacity") $c.capacity -}}
{{- $reserved := (hasKey $s "reservedCpus") | ternary (get $s "reservedCpus") $c.reservedCpus -}}
{{- if and $reserved (ne (toString $capacity) "cpus") -}}
{{- fail (printf "config.named.%s: reservedCpus %q need capacity \"cpus\" (it has %v)" $name $reserved $capacity) -}}
{{- end -}}
{{- include "numa-device-plugin.checkNear" (list (printf "config.named.%s.near" $name) (get $s "near")) -}}
{{- $_ := set $configs $name $out -}}
{{- end -}}
{{- $file := dict "configs" $configs -}}
{{- with $c.default -}}
{{- if not (hasKey $c.named .) -}}
{{- fail (printf "config.default %q names no configuration in config.named (it has %s)" . (keys $c.named | sortAlpha | join ", ")) -}}
{{- end -}}
{{- $_ := set $file "default" . -}}
{{- end -}}
{{- toYaml $file -}}
{{- end -}}

{{/* True (non-empty) when per-node configuration is on. */}}
{{- define "numa-device-plugin.perNode" -}}
{{- if .Values.config.named -}}true{{- else if .Values.config.default -}}
{{- fail "config.default needs config.named" -}}
{{- end -}}
{{- end -}}

{{/* Fails, in the plugin's words, for what the schema leaves to the templates (its
'not' said only "'not' failed" at an empty location): a name of a NUMA node's, any's or
a socket's resources, a name given only scope:socket, two names that would set the same NUMA_NEAR_<NAME> variable (data-a and
data_a), and a selector with . or .. in its path (a \057 is a slash, a \056 a dot), an
escape to a control character, or a second NAME=KIND: entry after a comma. Takes (list
WHERE MAP). */}}
{{- define "numa-device-plugin.checkNear" -}}
{{- $where := index . 0 -}}
{{- $seen := dict -}}
{{- range $name, $given := (index . 1 | default dict) -}}
{{- if regexMatch `^numa-[0-9]` $name -}}
{{- fail (printf "%s: %q would collide with the NUMA-node resources numa-<id>: name it otherwise" $where $name) -}}
{{- end -}}
{{- if regexMatch `^(any|any-memory|any-hugepages-.*)$` $name -}}
{{- fail (printf "%s: %q would collide with the resource any (and its memory): name it otherwise" $where $name) -}}
{{- end -}}
{{- if regexMatch `^socket-[0-9]` $name -}}
{{- fail (printf "%s: %q would collide with the socket resources socket-<id>: name it otherwise" $where $name) -}}
{{- end -}}
{{- $devices := list -}}
{{- range (kindIs "slice" $given | ternary $given (list $given)) -}}
{{- if not (hasPrefix "scope:" (toString .)) }}{{ $devices = append $devices . }}{{ end -}}
{{- end -}}
{{- if not $devices -}}
{{- fail (printf "%s.%s: a scope names no device: give a selector too ([net:ens1f0, scope:socket])" $where $name) -}}
{{- end -}}
{{- $variable := printf "NUMA_NEAR_%s" (regexReplaceAll "[^A-Z0-9]" (upper $name) "_") -}}
{{- if hasKey $seen $variable -}}
{{- fail (printf "%s: near resources %q and %q would both set %s in their containers: rename one" $where (get $seen $variable) $name $variable) -}}
{{- end -}}
{{- $_ := set $seen $variable $name -}}
{{- range (kindIs "slice" $given | ternary $given (list $given)) -}}
{{- $selector := toString . -}}
{{- if regexMatch `^path(-below)?:(.*(/|\\057))?([.]|\\056)([.]|\\056)?((/|\\057).*)?$` $selector -}}
{{- fail (printf "%s.%s: %q: an absolute host path without . or .. (\\057 is a slash, \\056 a dot)" $where $name $selector) -}}
{{- end -}}
{{- if regexMatch `^path(-below)?:.*\\(00[0-7]|01[03-7]|0[23][0-7]|177|2[0-3][0-7]|240|255)` $selector -}}
{{- fail (printf "%s.%s: %q: an escape decodes to a control character" $where $name $selector) -}}
{{- end -}}
{{- with regexFind `,[A-Za-z0-9][-A-Za-z0-9_.]*=(block|serial|wwid|net|pci|pci-id|pci-class|path|path-below|scope):` $selector -}}
{{- fail (printf "%s.%s: %q: a second entry follows a comma (%q): give each name its own key, several selectors a list" $where $name $selector (trimPrefix "," .)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Where the first near selector (config.near, config.named.*.near) of a kind is
("config.near.NAME"), empty when none is. Takes (list ROOT PREFIX): PREFIX "path" for
path: and path-below:, "net:" for net:. */}}
{{- define "numa-device-plugin.selectorWith" -}}
{{- $root := index . 0 -}}
{{- $prefix := index . 1 -}}
{{- $found := list -}}
{{- $maps := list (list "config.near" $root.Values.config.near) -}}
{{- range $name, $settings := $root.Values.config.named -}}
{{- $maps = append $maps (list (printf "config.named.%s.near" $name) (get ($settings | default dict) "near")) -}}
{{- end -}}
{{- range $maps -}}
{{- $where := index . 0 -}}
{{- range $name, $given := (index . 1 | default dict) -}}
{{- range (kindIs "slice" $given | ternary $given (list $given)) -}}
{{- if hasPrefix $prefix (toString .) -}}
{{- $found = append $found (printf "%s.%s" $where $name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- with $found }}{{ first . }}{{ end -}}
{{- end -}}

{{/* True (non-empty) when the pods read the host's mount table: host.mountTable true, or
null and some near selector names a host path (path:, path-below:). Fails for
host.mountTable false with such a selector: the plugin would read the container's own
table and advertise none of them. */}}
{{- define "numa-device-plugin.mountTable" -}}
{{- $path := include "numa-device-plugin.selectorWith" (list . "path") -}}
{{- $set := .Values.host.mountTable -}}
{{- if kindIs "invalid" $set -}}
{{- if $path -}}true{{- end -}}
{{- else if $set -}}true
{{- else if $path -}}
{{- fail (printf "host.mountTable is false, but %s selects by host path: the plugin would read the container's own mount table and advertise nothing for it (leave host.mountTable unset or true)" $path) -}}
{{- end -}}
{{- end -}}

{{/* True (non-empty) when the pods read the host's /sys: host.sysfs true, or null and
some near selector names a network interface (net:): the container's own sysfs lists
only the pod's interfaces. Fails for host.sysfs false with such a selector. */}}
{{- define "numa-device-plugin.sysfs" -}}
{{- $net := include "numa-device-plugin.selectorWith" (list . "net:") -}}
{{- $set := .Values.host.sysfs -}}
{{- if kindIs "invalid" $set -}}
{{- if $net -}}true{{- end -}}
{{- else if $set -}}true
{{- else if $net -}}
{{- fail (printf "host.sysfs is false, but %s selects a network interface: the container's /sys lists only the pod's own interfaces, so the plugin would advertise nothing for it (leave host.sysfs unset or true)" $net) -}}
{{- end -}}
{{- end -}}
