//! What blocks leaving the device-plugin stack, read from a fake kubelet's
//! pod resources API over its unix socket.

use switchyard_kubelet::podresources::api::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use switchyard_kubelet::podresources::api::*;
use switchyard_kubelet::podresources::{DeviceUsage, PodResourcesUsage};
use tonic::{Request, Response, Status};

struct FakeKubelet;

#[tonic::async_trait]
impl PodResourcesLister for FakeKubelet {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        let devices = |resource: &str, ids: &[&str]| ContainerDevices {
            resource_name: resource.into(),
            device_ids: ids.iter().map(|s| s.to_string()).collect(),
            topology: None,
        };
        Ok(Response::new(ListPodResourcesResponse {
            pod_resources: vec![
                PodResources {
                    name: "train-0".into(),
                    namespace: "ml".into(),
                    containers: vec![ContainerResources {
                        name: "main".into(),
                        devices: vec![
                            devices("nvidia.com/gpu", &["GPU-a", "GPU-b"]),
                            devices("example.com/nic", &["nic-0"]),
                        ],
                        ..Default::default()
                    }],
                },
                PodResources {
                    name: "web".into(),
                    namespace: "apps".into(),
                    containers: vec![ContainerResources {
                        name: "main".into(),
                        ..Default::default()
                    }],
                },
            ],
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_devices_are_listed_by_pod_and_container() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(FakeKubelet))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let usage = PodResourcesUsage {
        socket: socket.clone(),
        prefix: "nvidia.com/".into(),
    };
    assert_eq!(
        usage.in_use().await.unwrap(),
        [
            "nvidia.com/gpu GPU-a (ml/train-0, container main)",
            "nvidia.com/gpu GPU-b (ml/train-0, container main)",
        ]
    );
    let missing = PodResourcesUsage {
        socket: dir.path().join("absent.sock"),
        prefix: "nvidia.com/".into(),
    };
    let err = missing.in_use().await.unwrap_err().to_string();
    assert!(
        err.starts_with("connect to kubelet's pod resources API at"),
        "{err}"
    );
}
