{{/*
The name every object's app.kubernetes.io/name label carries, and the
DaemonSet's selector: the raw manifest's, so that the chart's DaemonSet and
deploy/kubernetes/nvml-mock-sysfs.yaml select the same pods.
*/}}
{{- define "nvml-mock-sysfs.name" -}}
{{- .Chart.Name -}}
{{- end -}}

{{/*
The objects' name: the release's when it already says nvml-mock-sysfs (helm
install nvml-mock-sysfs ... names the DaemonSet as the raw manifest does),
else <release>-nvml-mock-sysfs. 63 characters at most: a label value's limit.
*/}}
{{- define "nvml-mock-sysfs.fullname" -}}
{{- $name := include "nvml-mock-sysfs.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/*
The selector, and the pods' labels: the name alone, as in the raw manifest.
A selector never changes after the DaemonSet exists, so nothing that changes
with an upgrade belongs in it.
*/}}
{{- define "nvml-mock-sysfs.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nvml-mock-sysfs.name" . }}
{{- end -}}

{{/*
The objects' own labels: the selector's, and what Helm tools read to tell a
release's objects (kept out of the selector and the pods' labels).
*/}}
{{- define "nvml-mock-sysfs.labels" -}}
{{ include "nvml-mock-sysfs.selectorLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/*
"true" when fleet gives per-node profiles (any of nodes, labels, default),
else empty: serve then reads --fleet, not --profile.
*/}}
{{- define "nvml-mock-sysfs.fleet" -}}
{{- with .Values.fleet -}}
{{- if or .nodes .labels .default -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Where the fleet ConfigMap is mounted in the container, or, read through the
API, where serve keeps its keys (an in-memory emptyDir).
*/}}
{{- define "nvml-mock-sysfs.fleetDir" -}}
{{- if .Values.fleet.readThroughAPI -}}
/run/nvml-mock-sysfs/fleet
{{- else -}}
/etc/nvml-mock-sysfs/fleet
{{- end -}}
{{- end -}}

{{/*
"true" when serve's pods talk to the API server (label rules read the Node,
or the map is read through the API), else empty: they then run as the
chart's ServiceAccount.
*/}}
{{- define "nvml-mock-sysfs.serveAccount" -}}
{{- if and (include "nvml-mock-sysfs.fleet" .) (or .Values.fleet.labels .Values.fleet.readThroughAPI) -}}true{{- end -}}
{{- end -}}

{{/*
Where nvml-mock's DaemonSet mounts its ConfigMap, and so this one: the
profile has the same path in both containers.
*/}}
{{- define "nvml-mock-sysfs.nvmlMockDir" -}}
/etc/nvml-mock
{{- end -}}

{{/*
The fleet map, fleet.yaml: nodes, labels and default and nothing else, each
only when set. serve parses it strictly (deploy/fleet): any other key is
refused.
*/}}
{{- define "nvml-mock-sysfs.fleetMap" -}}
{{- $map := dict -}}
{{- with .Values.fleet.nodes }}{{ $_ := set $map "nodes" . }}{{ end -}}
{{- with .Values.fleet.labels }}{{ $_ := set $map "labels" . }}{{ end -}}
{{- with .Values.fleet.default }}{{ $_ := set $map "default" . }}{{ end -}}
{{- toYaml $map -}}
{{- end -}}

{{/*
Refuses values that would render a DaemonSet serving something else than
asked, each in one line naming the value.
*/}}
{{- define "nvml-mock-sysfs.validate" -}}
{{- $fleet := include "nvml-mock-sysfs.fleet" . -}}
{{- if and $fleet .Values.profile -}}
{{- fail (printf "values: profile %q and fleet (nodes, labels or default) are both set; set one: fleet gives each node its profile" .Values.profile) -}}
{{- end -}}
{{- if and (not $fleet) (or .Values.fleet.profiles .Values.fleet.nvmlMockReleases) -}}
{{- fail "values: fleet.profiles or fleet.nvmlMockReleases is set without fleet.nodes, fleet.labels or fleet.default: no map would name them" -}}
{{- end -}}
{{- if and .Values.publisher.enabled (not $fleet) -}}
{{- fail "values: publisher.enabled without fleet.nodes, fleet.labels or fleet.default: the publisher publishes the profiles the fleet map gives" -}}
{{- end -}}
{{- if hasKey .Values.fleet.profiles "fleet.yaml" -}}
{{- fail "values: fleet.profiles.fleet.yaml: the key holds the fleet map itself; name the profile otherwise" -}}
{{- end -}}
{{- if and .Values.nri.enabled (eq .Values.nri.inject "selected") (not .Values.nri.namespaces) (not .Values.nri.podSelector) -}}
{{- fail "values: nri.inject selected needs nri.namespaces, nri.podSelector, or both" -}}
{{- end -}}
{{- if ne (len .Values.fleet.nvmlMockReleases) (len (uniq .Values.fleet.nvmlMockReleases)) -}}
{{- fail (printf "values: fleet.nvmlMockReleases %v names a release twice: each is mounted at /etc/nvml-mock/<release>" .Values.fleet.nvmlMockReleases) -}}
{{- end -}}
{{- end -}}
