//! Which device-plugin devices containers hold, from kubelet's pod resources
//! API (`/var/lib/kubelet/pod-resources/kubelet.sock`): what blocks a switch
//! away from the device-plugin stack.

use std::path::PathBuf;

/// `v1`, generated from `proto/kubelet/podresources/v1`.
pub mod api {
    tonic::include_proto!("v1");
}

/// Which device-plugin devices containers hold (kubelet's pod-resources API
/// in production).
#[async_trait::async_trait]
pub trait DeviceUsage: Send + Sync {
    async fn in_use(&self) -> Result<Vec<String>, UsageError>;
}

/// Why the devices containers hold could not be read.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    #[error("connect to kubelet's pod resources API at {}: {source}", socket.display())]
    Connect {
        socket: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("list pod resources: {source}")]
    List {
        #[source]
        source: tonic::Status,
    },
}

/// Devices of resources starting with `prefix` (`nvidia.com/`) held by
/// containers, as kubelet lists them.
pub struct PodResourcesUsage {
    pub socket: PathBuf,
    pub prefix: String,
}

#[async_trait::async_trait]
impl DeviceUsage for PodResourcesUsage {
    async fn in_use(&self) -> Result<Vec<String>, UsageError> {
        let channel = crate::connect(self.socket.clone())
            .await
            .map_err(|source| UsageError::Connect {
                socket: self.socket.clone(),
                source,
            })?;
        let list = api::pod_resources_lister_client::PodResourcesListerClient::new(channel)
            .list(api::ListPodResourcesRequest {})
            .await
            .map_err(|source| UsageError::List { source })?
            .into_inner();
        let mut held = Vec::new();
        for pod in list.pod_resources {
            for container in &pod.containers {
                for devices in container
                    .devices
                    .iter()
                    .filter(|d| d.resource_name.starts_with(&self.prefix))
                {
                    for id in &devices.device_ids {
                        held.push(format!(
                            "{} {id} ({}/{}, container {})",
                            devices.resource_name, pod.namespace, pod.name, container.name
                        ));
                    }
                }
            }
        }
        Ok(held)
    }
}
