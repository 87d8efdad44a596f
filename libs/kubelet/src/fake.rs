//! A stand-in kubelet for tests and load runs where no kubelet exists: it
//! serves the device-plugin registration socket (recording each resource
//! that registers) and the pod resources socket (listing the pods a test
//! says hold devices) under a kubelet root directory, as `serve` expects
//! them.

use std::path::Path;
use std::sync::{Arc, Mutex};

use tonic::{Request, Response, Status};

use crate::deviceplugin::api::registration_server::{Registration, RegistrationServer};
use crate::deviceplugin::api::{Empty, RegisterRequest};
use crate::podresources::api::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use crate::podresources::api::*;

/// The fake kubelet: the resources registered so far, in order, and the
/// pods its pod resources API lists.
#[derive(Clone, Default)]
pub struct Kubelet {
    pub registered: Arc<Mutex<Vec<String>>>,
    pub pods: Arc<Mutex<Vec<PodResources>>>,
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
        self.registered
            .lock()
            .expect("registrations")
            .push(request.into_inner().resource_name);
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
