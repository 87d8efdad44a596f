{{/* The chart's name. */}}
{{- define "switchyard.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Prefix of every object's name: the release name, with the chart's name unless it already holds it. */}}
{{- define "switchyard.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "switchyard.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "switchyard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: switchyard
{{- end }}

{{/* Selector labels of one component: (dict "root" $ "component" "inventory"). */}}
{{- define "switchyard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "switchyard.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* All labels of one component: (dict "root" $ "component" "inventory"). */}}
{{- define "switchyard.componentLabels" -}}
{{ include "switchyard.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The name of a component's objects (Deployment, ServiceAccount, roles): (dict "root" $ "component" "inventory"). */}}
{{- define "switchyard.componentName" -}}
{{- printf "%s-%s" (include "switchyard.fullname" .root) .component }}
{{- end }}

{{/* The services that run as one-replica Deployments, with their values keys. */}}
{{- define "switchyard.deploymentServices" -}}
inventory: inventory
stack-assigner: stackAssigner
class-compiler: classCompiler
claim-allocator: claimAllocator
alerter: alerter
{{- end }}

{{/* Every component that has a ServiceAccount. */}}
{{- define "switchyard.components" -}}
{{- list "inventory" "stack-assigner" "class-compiler" "claim-allocator" "alerter" "node-agent" | toJson }}
{{- end }}

{{/* The NATS URL: nats.url, else the bundled server's, else a clear error. */}}
{{- define "switchyard.natsUrl" -}}
{{- if .Values.nats.url }}
{{- .Values.nats.url }}
{{- else if .Values.nats.bundled.enabled }}
{{- printf "nats://%s-nats.%s.svc:4222" (include "switchyard.fullname" .) .Release.Namespace }}
{{- else }}
{{- required "nats.url is required: the NATS server holding the migration log (nats://HOST:4222), or set nats.bundled.enabled=true" .Values.nats.url }}
{{- end }}
{{- end }}

{{- define "switchyard.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
The pod spec of one service: (dict "root" $ "component" "node-agent" "values" .Values.nodeAgent "identity" {...}).
The node agent also gets its node's name and the kubelet's plugin directories;
it talks to kubelet and the API server, not to the log, so it gets no NATS flags.
*/}}
{{- define "switchyard.podSpec" -}}
{{- $root := .root }}
{{- $nodeAgent := eq .component "node-agent" }}
{{- $creds := $root.Values.nats.credentialsSecret }}
{{- $user := int .identity.runAsUser -}}
serviceAccountName: {{ include "switchyard.componentName" . }}
enableServiceLinks: false
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  runAsNonRoot: {{ ne $user 0 }}
  runAsUser: {{ $user }}
  runAsGroup: {{ int .identity.runAsGroup }}
  fsGroup: {{ int .identity.runAsGroup }}
  seccompProfile:
    type: RuntimeDefault
containers:
  - name: {{ .component }}
    image: {{ include "switchyard.image" $root }}
    imagePullPolicy: {{ $root.Values.image.pullPolicy }}
    # Each service runs its own binary (one image carries them all).
    command:
      - switchyard-{{ .component }}
      {{- if $nodeAgent }}
      - serve
      - --node-name
      - $(NODE_NAME)
      - --gpu-source
      - {{ $root.Values.nodeAgent.gpuSource | quote }}
      - --layout
      - {{ $root.Values.nodeAgent.layout | quote }}
      - --sharing
      - {{ $root.Values.nodeAgent.sharing | quote }}
      {{- else }}
      - --nats-url
      - $(SWITCHYARD_NATS_URL)
      - --stream
      - {{ $root.Values.nats.stream }}
      - --stream-replicas
      - {{ $root.Values.nats.streamReplicas | quote }}
      {{- if $creds.name }}
      - --nats-creds
      - /etc/switchyard/nats/{{ $creds.key }}
      {{- end }}
      {{- if eq .component "stack-assigner" }}
      {{- $readiness := $root.Values.stackAssigner.readiness | default dict }}
      {{- $agent := include "switchyard.selectorLabels" (dict "root" $root "component" "node-agent") | fromYaml }}
      {{- $agentSelector := list }}
      {{- range $k := keys $agent | sortAlpha }}
      {{- $agentSelector = append $agentSelector (printf "%s=%s" $k (get $agent $k)) }}
      {{- end }}
      - --node-agent-selector
      - {{ default (join "," $agentSelector) $readiness.nodeAgentSelector | quote }}
      - --vendor-adapter-selector
      - {{ default "" $readiness.vendorAdapterSelector | quote }}
      {{- end }}
      {{- end }}
      - --health-listen
      - 0.0.0.0:8086
    env:
      {{- if not $nodeAgent }}
      - name: SWITCHYARD_NATS_URL
        value: {{ include "switchyard.natsUrl" $root | quote }}
      {{- end }}
      - name: SWITCHYARD_LOG_LEVEL
        value: {{ $root.Values.logLevel | quote }}
      {{- if $nodeAgent }}
      - name: NODE_NAME
        valueFrom:
          fieldRef:
            fieldPath: spec.nodeName
      {{- end }}
    ports:
      - name: health
        containerPort: 8086
        protocol: TCP
    # Health reports NOT_SERVING until the service has caught up with the log,
    # which can take a while on a long log: liveness starts only after that.
    startupProbe:
      grpc:
        port: 8086
      periodSeconds: 5
      failureThreshold: 120
    livenessProbe:
      grpc:
        port: 8086
      periodSeconds: 10
      failureThreshold: 3
    readinessProbe:
      grpc:
        port: 8086
      periodSeconds: 5
    {{- with .values.resources }}
    resources:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    securityContext:
      privileged: false
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities:
        drop: [ALL]
    volumeMounts:
      - name: tmp
        mountPath: /tmp
      {{- if and $creds.name (not $nodeAgent) }}
      - name: nats-credentials
        mountPath: /etc/switchyard/nats
        readOnly: true
      {{- end }}
      {{- if $nodeAgent }}
      - name: plugins-registry
        mountPath: /var/lib/kubelet/plugins_registry
      - name: plugin
        mountPath: /var/lib/kubelet/plugins/gpu.deckhouse.io
      - name: device-plugins
        mountPath: /var/lib/kubelet/device-plugins
      - name: cdi
        mountPath: /var/run/cdi
      - name: pod-resources
        mountPath: /var/lib/kubelet/pod-resources
        readOnly: true
      {{- end }}
volumes:
  - name: tmp
    emptyDir:
      sizeLimit: 64Mi
  {{- if and $creds.name (not $nodeAgent) }}
  - name: nats-credentials
    secret:
      secretName: {{ $creds.name }}
      # 0440: the group (fsGroup) reads it, nobody else.
      defaultMode: 288
      items:
        - key: {{ $creds.key }}
          path: {{ $creds.key }}
  {{- end }}
  {{- if $nodeAgent }}
  - name: plugins-registry
    hostPath:
      path: /var/lib/kubelet/plugins_registry
      type: DirectoryOrCreate
  - name: plugin
    hostPath:
      path: /var/lib/kubelet/plugins/gpu.deckhouse.io
      type: DirectoryOrCreate
  - name: device-plugins
    hostPath:
      path: /var/lib/kubelet/device-plugins
      type: DirectoryOrCreate
  - name: cdi
    hostPath:
      path: /var/run/cdi
      type: DirectoryOrCreate
  - name: pod-resources
    hostPath:
      path: /var/lib/kubelet/pod-resources
      type: Directory
  {{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
