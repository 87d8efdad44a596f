//! The node agent's kubelet-facing side: the protocols it speaks to kubelet,
//! reusable on their own (the node agent's process, which runs them and
//! switches between them, is `services/node-agent/src/edge/`).
//!
//! - [`pluginregistration`] and [`dra`]: the kubelet's gRPC APIs, generated
//!   from `proto/kubelet/` (package names and field numbers as kubelet speaks
//!   them).
//! - [`authority`]: the plugin sockets' connections, their `:authority`
//!   made one h2 accepts (kubelet dials registration sockets by path).
//! - [`cdi`]: Container Device Interface specs, written atomically.
//! - [`deviceplugin`]: the device-plugin API (`deviceplugin.v1beta1`) for the
//!   NodeGroup sharing modes: exclusive cards, time-slicing replicas, MIG
//!   profiles as resources.
//! - [`podresources`]: the devices containers hold, from kubelet's pod
//!   resources API.
//! - [`stack`]: the stack a node is assigned, as its label names it.
//! - [`metrics`]: the node agent's metrics.
//! - [`fake`]: a stand-in kubelet for tests and load runs.
//! - [`plugin`]: the DRA kubelet plugin — registration, NodePrepareResources
//!   and NodeUnprepareResources over unix sockets, a CDI spec per prepared
//!   claim, and a checkpoint of prepared claims so that prepare and unprepare
//!   are idempotent and survive a crash between steps.

pub mod authority;
pub mod cdi;
pub mod deviceplugin;
pub mod fake;
pub mod metrics;
pub mod plugin;
pub mod podresources;
pub mod stack;

/// `pluginregistration` (k8s.io/kubelet/pkg/apis/pluginregistration/v1).
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");
}

/// `k8s.io.kubelet.pkg.apis.dra.v1` (k8s.io/kubelet/pkg/apis/dra/v1).
pub mod dra {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// `v1alpha1` (k8s.io/kubelet/pkg/apis/dra-health/v1alpha1): device health
/// streamed to kubelet, which shows it in the pods' `allocatedResourcesStatus`.
pub mod dra_health {
    tonic::include_proto!("v1alpha1");
}

/// A gRPC channel to a unix socket (kubelet's or a plugin's). The URI is a
/// placeholder: the connection goes to `socket`.
pub async fn connect(
    socket: impl Into<std::path::PathBuf>,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    tonic::transport::Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(deviceplugin::tower_service(socket.into()))
        .await
}
