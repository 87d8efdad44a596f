// Stands in for sigs.k8s.io/node-feature-discovery v0.15.7, which
// k8s-device-plugin v0.17.4 requires but the module proxy does not serve: the
// two packages GFD imports from it, on top of the published NodeFeature API
// module. scripts/install-nvidia-device-plugin.sh replaces the module with this
// directory only when the proxy lacks the real one.
module sigs.k8s.io/node-feature-discovery

go 1.23.0

require (
	k8s.io/apimachinery v0.31.3
	k8s.io/client-go v0.31.3
	sigs.k8s.io/node-feature-discovery/api/nfd v0.17.3
)
