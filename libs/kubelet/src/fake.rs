//! A stand-in kubelet for tests and load runs where no kubelet exists: it
//! serves the device-plugin registration socket (recording each resource
//! that registers, then following the plugin's ListAndWatch as kubelet's
//! device manager does: the healthy devices of each resource, none once the
//! plugin's stream ends) and the pod resources socket (listing the pods a
//! test says hold devices) under a kubelet root directory, as `serve`
//! expects them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tonic::{Request, Response, Status};

use crate::deviceplugin::api::device_plugin_client::DevicePluginClient;
use crate::deviceplugin::api::registration_server::{Registration, RegistrationServer};
use crate::deviceplugin::api::{Empty, RegisterRequest};
use crate::podresources::api::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use crate::podresources::api::*;

/// The fake kubelet: the resources registered so far, in order, the
/// healthy devices each plugin lists now, and the pods its pod resources API
/// lists.
#[derive(Clone, Default)]
pub struct Kubelet {
    pub registered: Arc<Mutex<Vec<String>>>,
    /// Resource name -> healthy devices, as kubelet would advertise them in
    /// the node's capacity and allocatable (0 once the plugin is gone).
    pub advertised: Arc<Mutex<BTreeMap<String, usize>>>,
    /// Woken whenever `advertised` changes.
    pub changed: Arc<tokio::sync::Notify>,
    pub pods: Arc<Mutex<Vec<PodResources>>>,
    device_plugins: Arc<Mutex<PathBuf>>,
}

/// A pod (`namespace/name`) whose one container holds `device_ids` of
/// `resource`, as kubelet's pod resources API lists it.
pub fn pod_holding(pod: &str, resource: &str, device_ids: &[&str]) -> PodResources {
    let (namespace, name) = pod.split_once('/').unwrap_or(("default", pod));
    PodResources {
        name: name.into(),
        namespace: namespace.into(),
        containers: vec![ContainerResources {
            name: "main".into(),
            devices: vec![ContainerDevices {
                resource_name: resource.into(),
                device_ids: device_ids.iter().map(|id| id.to_string()).collect(),
                topology: None,
            }],
            ..ContainerResources::default()
        }],
    }
}

impl Kubelet {
    /// Serves `<root>/device-plugins/kubelet.sock` and
    /// `<root>/pod-resources/kubelet.sock` until the runtime ends.
    pub fn serve(&self, root: &Path) -> std::io::Result<()> {
        *self.device_plugins.lock().expect("dir") = root.join("device-plugins");
        for dir in ["device-plugins", "pod-resources"] {
            std::fs::create_dir_all(root.join(dir))?;
            let listener = tokio::net::UnixListener::bind(root.join(dir).join("kubelet.sock"))?;
            let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
            let server = tonic::transport::Server::builder();
            if dir == "device-plugins" {
                tokio::spawn(
                    server
                        .clone()
                        .add_service(RegistrationServer::new(self.clone()))
                        .serve_with_incoming(incoming),
                );
            } else {
                tokio::spawn(
                    server
                        .clone()
                        .add_service(PodResourcesListerServer::new(self.clone()))
                        .serve_with_incoming(incoming),
                );
            }
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl Registration for Kubelet {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let request = request.into_inner();
        let resource = request.resource_name.clone();
        self.registered
            .lock()
            .expect("registrations")
            .push(resource.clone());
        let socket = self
            .device_plugins
            .lock()
            .expect("dir")
            .join(&request.endpoint);
        let kubelet = self.clone();
        tokio::spawn(async move {
            let set = |healthy: usize| {
                kubelet
                    .advertised
                    .lock()
                    .expect("advertised")
                    .insert(resource.clone(), healthy);
                kubelet.changed.notify_waiters();
            };
            if let Ok(channel) = crate::connect(socket).await
                && let Ok(stream) = DevicePluginClient::new(channel)
                    .list_and_watch(Empty {})
                    .await
            {
                let mut stream = stream.into_inner();
                while let Ok(Some(list)) = stream.message().await {
                    set(list
                        .devices
                        .iter()
                        .filter(|d| d.health == "Healthy")
                        .count());
                }
            }
            // The plugin is gone: kubelet stops advertising its devices.
            set(0);
        });
        Ok(Response::new(Empty {}))
    }
}

#[tonic::async_trait]
impl PodResourcesLister for Kubelet {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        Ok(Response::new(ListPodResourcesResponse {
            pod_resources: self.pods.lock().expect("pods").clone(),
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        Err(Status::unimplemented("not used"))
    }

    async fn get(
        &self,
        _: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        Err(Status::unimplemented("not used"))
    }
}
