//! The device-plugin API played by a fake kubelet: a tonic Registration
//! server on kubelet's socket records what registers, and tonic clients call
//! the plugin over its socket, for each sharing mode.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use switchyard_gpu::{Fixture, GpuSource, Machine};
use switchyard_kubelet::deviceplugin::api::device_plugin_client::DevicePluginClient;
use switchyard_kubelet::deviceplugin::api::registration_server::{
    Registration, RegistrationServer,
};
use switchyard_kubelet::deviceplugin::api::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, Empty,
    PreferredAllocationRequest, RegisterRequest,
};
use switchyard_kubelet::deviceplugin::{DevicePlugin, Sharing, resources, serve};
use tokio::sync::{mpsc, watch};
use tonic::{Request, Response, Status};

fn fixture(name: &str) -> Machine {
    Fixture::load(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../deploy/fixtures")
            .join(name),
    )
    .unwrap()
    .machine()
    .unwrap()
}

/// Kubelet's registration service: every request is recorded.
struct FakeKubelet(mpsc::UnboundedSender<RegisterRequest>);

#[tonic::async_trait]
impl Registration for FakeKubelet {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        self.0.send(request.into_inner()).unwrap();
        Ok(Response::new(Empty {}))
    }
}

struct Setup {
    dir: tempfile::TempDir,
    registrations: mpsc::UnboundedReceiver<RegisterRequest>,
}

async fn kubelet() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let (tx, registrations) = mpsc::unbounded_channel();
    let listener = tokio::net::UnixListener::bind(dir.path().join("kubelet.sock")).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(FakeKubelet(tx)))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    Setup { dir, registrations }
}

async fn plugin(
    setup: &mut Setup,
    socket: &str,
    resource: &str,
    sharing: Sharing,
    machine: watch::Receiver<Machine>,
) -> DevicePluginClient<tonic::transport::Channel> {
    let plugin = Arc::new(DevicePlugin::new(resource, sharing, machine));
    let (socket_path, kubelet) = (
        setup.dir.path().join(socket),
        setup.dir.path().join("kubelet.sock"),
    );
    tokio::spawn(async move {
        serve(plugin, &socket_path, &kubelet, std::future::pending())
            .await
            .unwrap()
    });
    // Kubelet hears of the plugin before it calls it.
    let registered = tokio::time::timeout(Duration::from_secs(10), setup.registrations.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(registered.version, "v1beta1");
    assert_eq!(registered.endpoint, socket);
    assert_eq!(registered.resource_name, resource);
    assert!(
        registered
            .options
            .unwrap()
            .get_preferred_allocation_available
    );
    let channel = switchyard_kubelet::connect(setup.dir.path().join(socket))
        .await
        .unwrap();
    DevicePluginClient::new(channel)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_cards_stream_their_health_and_allocate_by_uuid() {
    let mut setup = kubelet().await;
    let machine = fixture("h100-8x.yaml");
    let uuids: Vec<String> = machine.gpus.iter().map(|g| g.uuid.clone()).collect();
    let (update, watch) = watch::channel(machine.clone());
    let mut client = plugin(
        &mut setup,
        "gpu.sock",
        "nvidia.com/gpu",
        Sharing::Exclusive,
        watch,
    )
    .await;
    let options = client
        .get_device_plugin_options(Empty {})
        .await
        .unwrap()
        .into_inner();
    assert!(!options.pre_start_required);

    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(
        first
            .devices
            .iter()
            .map(|d| d.id.clone())
            .collect::<Vec<_>>(),
        uuids
    );
    assert!(first.devices.iter().all(|d| d.health == "Healthy"));
    // Card 3 turns unhealthy: kubelet hears it on the open stream.
    let mut sick = machine.clone();
    sick.gpus[3].healthy = false;
    update.send(sick).unwrap();
    let second = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let health: Vec<&str> = second.devices.iter().map(|d| d.health.as_str()).collect();
    assert_eq!(
        health,
        [
            "Healthy",
            "Healthy",
            "Healthy",
            "Unhealthy",
            "Healthy",
            "Healthy",
            "Healthy",
            "Healthy"
        ]
    );

    let answer = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec![uuids[0].clone(), uuids[1].clone()],
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let container = &answer.container_responses[0];
    assert_eq!(
        container.envs["NVIDIA_VISIBLE_DEVICES"],
        format!("{},{}", uuids[0], uuids[1])
    );
    assert_eq!(
        container.cdi_devices[0].name,
        format!("gpu.deckhouse.io/gpu={}", uuids[0])
    );
    // An unknown device is refused.
    let refused = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec!["GPU-nope".into()],
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_slicing_offers_replicas_and_packs_them() {
    let mut setup = kubelet().await;
    let machine = fixture("h100-8x.yaml");
    let u = |i: usize| machine.gpus[i].uuid.clone();
    let (_update, watch) = watch::channel(machine.clone());
    let mut client = plugin(
        &mut setup,
        "gpu.sock",
        "nvidia.com/gpu",
        Sharing::TimeSlicing { replicas: 4 },
        watch,
    )
    .await;
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let devices = stream.message().await.unwrap().unwrap().devices;
    assert_eq!(devices.len(), 8 * 4);
    assert_eq!(devices[5].id, format!("{}::1", u(1)));
    let all: Vec<String> = devices.iter().map(|d| d.id.clone()).collect();
    let preferred = client
        .get_preferred_allocation(PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: all,
                must_include_device_i_ds: vec![format!("{}::2", u(1))],
                allocation_size: 3,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        preferred.container_responses[0].device_i_ds,
        [
            format!("{}::2", u(1)),
            format!("{}::0", u(1)),
            format!("{}::1", u(1))
        ],
        "replicas of the card already chosen first"
    );
    // Nothing pre-chosen and the list unordered, as kubelet sends it: three
    // containers of two replicas each land on two cards, not six. Card 1
    // has two replicas left after the first (best fit for the second).
    let mut free: Vec<String> = devices.iter().map(|d| d.id.clone()).collect();
    free.reverse();
    free.rotate_left(7);
    let mut cards = std::collections::BTreeSet::new();
    for _ in 0..3 {
        let chosen = client
            .get_preferred_allocation(PreferredAllocationRequest {
                container_requests: vec![ContainerPreferredAllocationRequest {
                    available_device_i_ds: free.clone(),
                    must_include_device_i_ds: Vec::new(),
                    allocation_size: 2,
                }],
            })
            .await
            .unwrap()
            .into_inner()
            .container_responses[0]
            .device_i_ds
            .clone();
        assert_eq!(chosen.len(), 2);
        let of: std::collections::BTreeSet<&str> = chosen
            .iter()
            .map(|id| id.split("::").next().unwrap())
            .collect();
        assert_eq!(of.len(), 1, "one card's replicas: {chosen:?}");
        cards.extend(of.into_iter().map(str::to_string));
        free.retain(|id| !chosen.contains(id));
    }
    assert_eq!(cards.len(), 2, "packed onto two cards: {cards:?}");
    let answer = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec![format!("{}::0", u(0)), format!("{}::3", u(0))],
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        answer.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"],
        u(0),
        "two replicas, one card"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mig_profiles_are_resources_of_their_own() {
    let machine = fixture("a100-8x-mig.yaml");
    let offered = resources(&machine, Sharing::Mig);
    let counts: Vec<(&str, usize)> = offered.iter().map(|(k, v)| (k.as_str(), v.len())).collect();
    assert_eq!(
        counts,
        [
            ("nvidia.com/gpu", 4),
            ("nvidia.com/mig-1g.5gb", 9),
            ("nvidia.com/mig-2g.10gb", 4),
            ("nvidia.com/mig-3g.20gb", 3)
        ]
    );
    let mut setup = kubelet().await;
    let (_update, watch) = watch::channel(machine.clone());
    let mut client = plugin(
        &mut setup,
        "mig-3g.sock",
        "nvidia.com/mig-3g.20gb",
        Sharing::Mig,
        watch,
    )
    .await;
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let devices = stream.message().await.unwrap().unwrap().devices;
    let expected: Vec<String> = offered["nvidia.com/mig-3g.20gb"]
        .iter()
        .map(|(id, _, _)| id.clone())
        .collect();
    assert_eq!(
        devices.iter().map(|d| d.id.clone()).collect::<Vec<_>>(),
        expected
    );
    assert!(expected.iter().all(|id| id.starts_with("MIG-")));
    let answer = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec![expected[2].clone()],
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        answer.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"],
        expected[2]
    );
}
