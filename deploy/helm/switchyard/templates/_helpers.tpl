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
      - {{ include "switchyard.nodeAgentGpuSource" $root | quote }}
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
      {{- include "switchyard.natsSecurityArgs" (dict "root" $root "identity" .component "sign" true) | nindent 6 }}
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
      - --metrics-listen
      - 0.0.0.0:{{ int $root.Values.metrics.port }}
    env:
      {{- if not $nodeAgent }}
      - name: SWITCHYARD_NATS_URL
        value: {{ include "switchyard.natsUrl" $root | quote }}
      {{- end }}
      - name: RUST_LOG
        value: {{ $root.Values.logLevel | quote }}
      - name: SWITCHYARD_LOG_FORMAT
        value: {{ $root.Values.logFormat | quote }}
      {{- with $root.Values.tracing.otlpEndpoint }}
      - name: OTEL_EXPORTER_OTLP_ENDPOINT
        value: {{ . | quote }}
      {{- end }}
      {{- if lt (float64 $root.Values.tracing.sampleRatio) 1.0 }}
      - name: OTEL_TRACES_SAMPLER
        value: parentbased_traceidratio
      - name: OTEL_TRACES_SAMPLER_ARG
        value: {{ $root.Values.tracing.sampleRatio | quote }}
      {{- end }}
      {{- if and (not $nodeAgent) (gt (int $root.Values.ha.replicas) 1) }}
      - name: SWITCHYARD_LEASE_NAMESPACE
        value: {{ $root.Release.Namespace | quote }}
      - name: SWITCHYARD_LEASE_NAME
        value: {{ include "switchyard.componentName" . | quote }}
      - name: SWITCHYARD_IDENTITY
        valueFrom:
          fieldRef:
            fieldPath: metadata.name
      - name: SWITCHYARD_LEASE_DURATION
        value: {{ $root.Values.ha.leaseDuration | quote }}
      - name: SWITCHYARD_LEASE_MARGIN
        value: {{ $root.Values.ha.leaseMargin | quote }}
      {{- end }}
      {{- if has .component (list "inventory" "stack-assigner") }}
      - name: SWITCHYARD_BACKEND
        value: {{ $root.Values.backend | quote }}
      {{- end }}
      {{- if and (eq .component "stack-assigner") (eq $root.Values.backend "nvidia-operator") }}
      {{- $n := $root.Values.nvidiaOperator }}
      {{- $pools := list }}
      {{- range $pool := keys $n.pools | sortAlpha }}
      {{- $pools = append $pools (printf "%s=%s" $pool (get $n.pools $pool)) }}
      {{- end }}
      - name: SWITCHYARD_NVIDIA_DOMAIN
        value: {{ $n.domain | quote }}
      - name: SWITCHYARD_NVIDIA_PLUGIN_LABEL
        value: {{ $n.pluginLabel | quote }}
      - name: SWITCHYARD_NVIDIA_POOL_LABEL
        value: {{ $n.poolLabel | quote }}
      - name: SWITCHYARD_NVIDIA_POOLS
        value: {{ join "," $pools | quote }}
      - name: SWITCHYARD_NVIDIA_PILOT_TAINT
        value: {{ $n.pilotTaint | quote }}
      - name: SWITCHYARD_NVIDIA_DISABLE_VALIDATOR_ON_DRA
        value: {{ $n.disableValidatorOnDra | quote }}
      - name: SWITCHYARD_NVIDIA_DEVICE_PLUGIN_PODS
        value: {{ $n.devicePluginPods | quote }}
      - name: SWITCHYARD_NVIDIA_KUBELET_PLUGIN_PODS
        value: {{ $n.kubeletPluginPods | quote }}
      {{- end }}
      {{- if eq .component "alerter" }}
      {{- /* The module status's alerts age moves and claims as the chart's rules do. */}}
      {{- $t := $root.Values.prometheusRule.thresholds }}
      - name: SWITCHYARD_MOVE_STALLED_AFTER
        value: {{ $t.applicationMoveAge | quote }}
      - name: SWITCHYARD_CLAIM_PENDING_AFTER
        value: {{ $t.resourceClaimPendingAge | quote }}
      - name: SWITCHYARD_CLAIM_UNUSED_AFTER
        value: {{ $t.resourceClaimUnusedAge | quote }}
      {{- /* Its conditions fire after the rules' for:, as the alerts do. */}}
      - name: SWITCHYARD_ALERTS_FOR
        value: {{ printf "D8GpuNodeServedByNoStack=%s,D8GpuNodeDraNotReady=%s,D8GpuNodeDualAdvertisement=%s,D8GpuDevicePluginOnDraNode=%s,D8GpuUnhealthy=%s" $t.nodeServedByNoStackFor $t.nodeDraNotReadyFor $t.dualAdvertisementFor $t.devicePluginOnDraNodeFor $t.gpuUnhealthyFor | quote }}
      {{- end }}
      {{- if $nodeAgent }}
      - name: NODE_NAME
        valueFrom:
          fieldRef:
            fieldPath: spec.nodeName
      - name: POD_UID
        valueFrom:
          fieldRef:
            fieldPath: metadata.uid
      {{- end }}
    ports:
      - name: health
        containerPort: 8086
        protocol: TCP
      - name: metrics
        containerPort: {{ int $root.Values.metrics.port }}
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
      {{- if not $nodeAgent }}
      {{- include "switchyard.natsSecurityMounts" (dict "root" $root "sign" true) | nindent 6 }}
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
      {{- if $root.Values.nodeAgent.fixture }}
      - name: fixture
        mountPath: /etc/switchyard/fixture
        readOnly: true
      {{- end }}
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
  {{- if not $nodeAgent }}
  {{- include "switchyard.natsSecurityVolumes" (dict "root" $root "identity" .component "sign" true) | nindent 2 }}
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
  {{- if $root.Values.nodeAgent.fixture }}
  - name: fixture
    configMap:
      name: {{ include "switchyard.componentName" (dict "root" $root "component" "node-agent-fixture") }}
  {{- end }}
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

{{/*
The bundled server's authorization (auth.conf, included by nats.conf): one
NKey user per key of security.*, each allowed exactly what its role needs.
- Every user reads the log: stream info, direct and message gets, its own
  ordered consumers (create, pull, delete), acknowledgements and flow control;
  replies come to `_INBOX.<its key>.>`, which only it may read.
- A service appends records (`switchyard.log.>`), takes its own commands
  (`switchyard.cmd.<service>`) and answers them (allow_responses: only to the
  requests it received).
- An operator sends commands (`switchyard.cmd.*`) and reads the CloudEvents
  (`switchyard.events.>`, live or from the stream SWITCHYARD_EVENTS).
- The alerter publishes the CloudEvents (`switchyard.events.>`) and reads
  where their stream ends.
- log-init creates the two streams.
Nobody may update, delete or purge a stream, or create another.
*/}}
{{/* A list of subjects as the server's configuration spells it: ["a", "b"] (toJson would escape ">"). */}}
{{- define "switchyard.natsList" -}}
[{{ range $i, $s := . }}{{ if $i }}, {{ end }}{{ $s | quote }}{{ end }}]
{{- end }}

{{- define "switchyard.natsAuthorization" -}}
{{- $security := .Values.security }}
{{- $stream := .Values.nats.stream }}
{{- $events := "SWITCHYARD_EVENTS" }}
{{- $readEvents := list (printf "$JS.API.STREAM.INFO.%s" $events) (printf "$JS.API.STREAM.MSG.GET.%s" $events) (printf "$JS.API.CONSUMER.CREATE.%s" $events) (printf "$JS.API.CONSUMER.CREATE.%s.>" $events) (printf "$JS.API.CONSUMER.INFO.%s.>" $events) (printf "$JS.API.CONSUMER.DELETE.%s.>" $events) (printf "$JS.API.CONSUMER.MSG.NEXT.%s.>" $events) (printf "$JS.ACK.%s.>" $events) (printf "$JS.FC.%s.>" $events) }}
{{- $read := list (printf "$JS.API.STREAM.INFO.%s" $stream) (printf "$JS.API.DIRECT.GET.%s" $stream) (printf "$JS.API.DIRECT.GET.%s.>" $stream) (printf "$JS.API.STREAM.MSG.GET.%s" $stream) (printf "$JS.API.CONSUMER.CREATE.%s" $stream) (printf "$JS.API.CONSUMER.CREATE.%s.>" $stream) (printf "$JS.API.CONSUMER.INFO.%s.>" $stream) (printf "$JS.API.CONSUMER.DELETE.%s.>" $stream) (printf "$JS.API.CONSUMER.MSG.NEXT.%s.>" $stream) (printf "$JS.ACK.%s.>" $stream) (printf "$JS.FC.%s.>" $stream) }}
authorization {
  users = [
{{- range $service := list "inventory" "stack-assigner" "class-compiler" "claim-allocator" "alerter" }}
{{- $keys := index $security.services $service }}
{{- if not $keys }}
{{- fail (printf "security.services.%s: expected the service's public key (U...): `switchyard keys chart --out DIR` makes the seeds and prints the keys" $service) }}
{{- end }}
{{- range $key := $keys }}
    # {{ $service }}
    {{- $publish := append $read "switchyard.log.>" }}
    {{- if eq $service "alerter" }}
    {{- $publish = concat $publish (list "switchyard.events.>" (printf "$JS.API.STREAM.INFO.%s" $events) (printf "$JS.API.STREAM.MSG.GET.%s" $events)) }}
    {{- end }}
    {nkey: {{ $key | quote }}, permissions: {publish: {allow: {{ include "switchyard.natsList" $publish }}}, subscribe: {allow: {{ include "switchyard.natsList" (list (printf "_INBOX.%s.>" $key) (printf "switchyard.cmd.%s" $service)) }}}, allow_responses: true}}
{{- end }}
{{- end }}
{{- if not $security.logInit }}
{{- fail "security.logInit: expected the log-init Job's public key (U...): `switchyard keys chart --out DIR` prints it" }}
{{- end }}
{{- range $key := $security.logInit }}
    # log-init
    {nkey: {{ $key | quote }}, permissions: {publish: {allow: {{ include "switchyard.natsList" (list (printf "$JS.API.STREAM.CREATE.%s" $stream) (printf "$JS.API.STREAM.INFO.%s" $stream) (printf "$JS.API.STREAM.CREATE.%s" $events) (printf "$JS.API.STREAM.INFO.%s" $events)) }}}, subscribe: {allow: {{ include "switchyard.natsList" (list (printf "_INBOX.%s.>" $key)) }}}}}
{{- end }}
{{- range $identity, $keys := $security.operators }}
{{- range $key := $keys }}
    # operator {{ $identity }}
    {nkey: {{ $key | quote }}, permissions: {publish: {allow: {{ include "switchyard.natsList" (concat $read $readEvents (list "switchyard.cmd.*")) }}}, subscribe: {allow: {{ include "switchyard.natsList" (list (printf "_INBOX.%s.>" $key) "switchyard.events.>") }}}}}
{{- end }}
{{- end }}
  ]
}
{{- end }}

{{/* The keyring: every service's and operator's public keys, newest first. */}}
{{- define "switchyard.keyring" -}}
{{- $identities := merge (dict) .Values.security.services .Values.security.operators }}
{{- range $identity := keys $identities | sortAlpha }}
{{ $identity | quote }}: {{ index $identities $identity | toJson }}
{{- end }}
{{- end }}

{{/* The Secret holding the bundled server's CA, certificate and key. */}}
{{- define "switchyard.natsTlsSecret" -}}
{{- default (printf "%s-nats-tls" (include "switchyard.fullname" .)) .Values.security.tls.secretName }}
{{- end }}

{{/*
A client's NATS security flags, volume mounts and volumes: (dict "root" $ "identity" "inventory" "sign" true).
*/}}
{{- define "switchyard.natsSecurityArgs" -}}
{{- $security := .root.Values.security }}
{{- if $security.enabled }}
- --nats-nkey
- /etc/switchyard/keys/seed
{{- if .sign }}
- --signing-key
- /etc/switchyard/keys/seed
- --keyring
- /etc/switchyard/keyring/keyring.yaml
{{- end }}
{{- end }}
{{- if $security.tls.enabled }}
- --nats-tls-ca
- /etc/switchyard/tls/ca.crt
{{- end }}
{{- end }}

{{- define "switchyard.natsSecurityMounts" -}}
{{- $security := .root.Values.security }}
{{- if $security.enabled }}
- name: nats-key
  mountPath: /etc/switchyard/keys
  readOnly: true
{{- if .sign }}
- name: keyring
  mountPath: /etc/switchyard/keyring
  readOnly: true
{{- end }}
{{- end }}
{{- if $security.tls.enabled }}
- name: nats-ca
  mountPath: /etc/switchyard/tls
  readOnly: true
{{- end }}
{{- end }}

{{- define "switchyard.natsSecurityVolumes" -}}
{{- $security := .root.Values.security }}
{{- if $security.enabled }}
- name: nats-key
  secret:
    secretName: {{ required "security.seedsSecret: expected the Secret holding each identity's NKey seed (`switchyard keys chart --out DIR`, then `kubectl create secret generic NAME --from-file=DIR`)" $security.seedsSecret }}
    # 0440: the group (fsGroup) reads it, nobody else.
    defaultMode: 288
    items:
      - key: {{ .identity }}
        path: seed
{{- if .sign }}
- name: keyring
  configMap:
    name: {{ include "switchyard.fullname" .root }}-keyring
{{- end }}
{{- end }}
{{- if $security.tls.enabled }}
- name: nats-ca
  secret:
    secretName: {{ include "switchyard.natsTlsSecret" .root }}
    items:
      - key: ca.crt
        path: ca.crt
{{- end }}
{{- end }}

{{- /*
The node agent's --gpu-source: `nvml`, `fixture:FILE` as given, or
`fixture` for the machine in nodeAgent.fixture (mounted from a ConfigMap),
each node's cards with UUIDs of their own.
*/ -}}
{{- define "switchyard.nodeAgentGpuSource" -}}
{{- $values := .Values.nodeAgent }}
{{- if eq $values.gpuSource "fixture" }}
{{- if not $values.fixture }}
{{- fail "nodeAgent.gpuSource=fixture needs the machine in nodeAgent.fixture (--set-file nodeAgent.fixture=FILE, a fixture YAML)" }}
{{- end }}
{{- /* One machine for every node: each agent makes its cards' UUIDs its node's own. */ -}}
{{- print "fixture-per-node:/etc/switchyard/fixture/machine.yaml" }}
{{- else }}
{{- $values.gpuSource }}
{{- end }}
{{- end }}
