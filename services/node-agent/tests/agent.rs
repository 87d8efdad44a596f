//! One stack at a time, observed from a fake kubelet: every device-plugin
//! registration and every ListAndWatch message it receives is recorded with
//! what the DRA side looked like at that moment (its registration socket, the
//! node's published slices), and every slice publication with what the
//! device-plugin side looked like. Switching both ways, and the refusals while
//! the old stack is in use.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use serde_json::json;
use switchyard_gpu::publish::Layout;
use switchyard_gpu::{Fixture, GpuSource, Machine};
use switchyard_kubelet::deviceplugin::Sharing;
use switchyard_kubelet::deviceplugin::api::device_plugin_client::DevicePluginClient;
use switchyard_kubelet::deviceplugin::api::registration_server::{
    Registration, RegistrationServer,
};
use switchyard_kubelet::deviceplugin::api::{AllocateRequest, ContainerAllocateRequest};
use switchyard_kubelet::deviceplugin::api::{Empty, RegisterRequest};
use switchyard_kubelet::dra::dra_plugin_client::DraPluginClient;
use switchyard_kubelet::dra::{Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest};
use switchyard_kubelet::plugin::{Checkpoint, ClaimError, ClaimSource};
use switchyard_kubelet::podresources::{DeviceUsage, UsageError};
use switchyard_node_agent::edge::agent::{
    Agent, AgentConfig, AgentError, HandoverBlocked, SliceError, SlicePublisher, Stack,
};
use switchyard_testkit::eventually;
use tonic::{Request, Response, Status};

#[derive(Clone, Debug, PartialEq)]
enum Event {
    /// A device plugin registered / listed devices / closed its stream, and
    /// whether the DRA side was live then (registration socket or slices).
    DevicePlugin {
        what: String,
        devices: Option<usize>,
        dra_live: bool,
    },
    /// Slices published / withdrawn, and whether a device-plugin socket existed then.
    Slices {
        published: bool,
        device_plugin_live: bool,
    },
}

struct Observed {
    events: Mutex<Vec<Event>>,
    slices: Mutex<Vec<ResourceSlice>>,
    dirs: (PathBuf, PathBuf),
}

impl Observed {
    fn dra_live(&self) -> bool {
        self.dirs.0.join("gpu.deckhouse.io-reg.sock").exists()
            || !self.slices.lock().unwrap().is_empty()
    }

    fn device_plugin_live(&self) -> bool {
        std::fs::read_dir(&self.dirs.1).unwrap().any(|e| {
            e.unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("switchyard-")
        })
    }

    fn record(&self, e: Event) {
        self.events.lock().unwrap().push(e);
    }

    fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }
}

struct Publisher(Arc<Observed>);

#[async_trait::async_trait]
impl SlicePublisher for Publisher {
    async fn publish(&self, slices: Vec<ResourceSlice>) -> Result<(), SliceError> {
        self.0.record(Event::Slices {
            published: true,
            device_plugin_live: self.0.device_plugin_live(),
        });
        *self.0.slices.lock().unwrap() = slices;
        Ok(())
    }
    async fn withdraw(&self) -> Result<(), SliceError> {
        self.0.slices.lock().unwrap().clear();
        self.0.record(Event::Slices {
            published: false,
            device_plugin_live: self.0.device_plugin_live(),
        });
        Ok(())
    }
}

struct Usage(Mutex<Vec<String>>);

#[async_trait::async_trait]
impl DeviceUsage for Usage {
    async fn in_use(&self) -> Result<Vec<String>, UsageError> {
        Ok(self.0.lock().unwrap().clone())
    }
}

struct Claims;

#[async_trait::async_trait]
impl ClaimSource for Claims {
    async fn claim(&self, namespace: &str, name: &str) -> Result<ResourceClaim, ClaimError> {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": namespace, "uid": if name == "train" { "uid-1".to_string() } else { format!("uid-{name}") }},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "h100.gpu.deckhouse.io"}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.deckhouse.io", "pool": "gpu-1", "device": "gpu-2"}
            ]}}},
        }))
        .map_err(|source| ClaimError::Decode {
            namespace: namespace.into(),
            name: name.into(),
            source,
        })
    }
}

/// Kubelet's device-plugin side: it records each registration, then opens
/// ListAndWatch and records every list and the stream's end.
struct FakeKubelet(Arc<Observed>);

#[tonic::async_trait]
impl Registration for FakeKubelet {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let r = request.into_inner();
        let observed = self.0.clone();
        observed.record(Event::DevicePlugin {
            what: format!("registered {}", r.resource_name),
            devices: None,
            dra_live: observed.dra_live(),
        });
        let socket = observed.dirs.1.join(&r.endpoint);
        tokio::spawn(async move {
            let channel = switchyard_kubelet::connect(socket).await.unwrap();
            let mut stream = DevicePluginClient::new(channel)
                .list_and_watch(Empty {})
                .await
                .unwrap()
                .into_inner();
            while let Ok(Some(list)) = stream.message().await {
                observed.record(Event::DevicePlugin {
                    what: "list".into(),
                    devices: Some(list.devices.len()),
                    dra_live: observed.dra_live(),
                });
            }
            observed.record(Event::DevicePlugin {
                what: "closed".into(),
                devices: None,
                dra_live: observed.dra_live(),
            });
        });
        Ok(Response::new(Empty {}))
    }
}

fn machine() -> Machine {
    Fixture::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/fixtures/h100-8x.yaml"))
        .unwrap()
        .machine()
        .unwrap()
}

/// A kubelet directory with the fake kubelet on its device-plugin socket,
/// and an agent for the H100 fixture publishing through the observer.
struct Setup {
    dir: tempfile::TempDir,
    registry: PathBuf,
    device_plugins: PathBuf,
    observed: Arc<Observed>,
    agent: Agent,
}

fn setup(usage: Arc<Usage>) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let (registry, device_plugins) = (
        dir.path().join("plugins_registry"),
        dir.path().join("device-plugins"),
    );
    std::fs::create_dir_all(&registry).unwrap();
    std::fs::create_dir_all(&device_plugins).unwrap();
    let observed = Arc::new(Observed {
        events: Mutex::default(),
        slices: Mutex::default(),
        dirs: (registry.clone(), device_plugins.clone()),
    });
    let listener = tokio::net::UnixListener::bind(device_plugins.join("kubelet.sock")).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(FakeKubelet(observed.clone())))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let agent = Agent::new(
        AgentConfig {
            node: "gpu-1".into(),
            plugins_registry: registry.clone(),
            plugin_dir: dir.path().join("plugin"),
            device_plugins: device_plugins.clone(),
            cdi_dir: dir.path().join("cdi"),
            layout: Layout::Static,
            sharing: Sharing::Exclusive,
            instance: None,
        },
        machine(),
        Arc::new(Claims),
        Arc::new(Publisher(observed.clone())),
        usage,
    );
    Setup {
        dir,
        registry,
        device_plugins,
        observed,
        agent,
    }
}

/// Waits until kubelet has the device plugin; its socket.
async fn registered_device_plugin(observed: &Observed, device_plugins: &Path) -> PathBuf {
    eventually(
        "kubelet has the device plugin",
        Duration::from_secs(10),
        || {
            let registered = observed.events().iter().any(
                |e| matches!(e, Event::DevicePlugin { what, .. } if what.starts_with("registered")),
            );
            async move { registered }
        },
    )
    .await
    .unwrap();
    std::fs::read_dir(device_plugins)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("switchyard-")
        })
        .unwrap()
}

/// Serves `stack` once the old one is unused, trying again on each refusal
/// (kubelet's calls keep coming); how many times it was refused.
async fn serve_when_unused(agent: &mut Agent, stack: Stack) -> usize {
    let mut refusals = 0;
    while let Err(e) = agent.serve(Some(stack)).await {
        assert!(
            matches!(e, AgentError::Blocked(HandoverBlocked { .. })),
            "{e}"
        );
        refusals += 1;
        tokio::task::yield_now().await;
    }
    refusals
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_serves_one_stack_and_switches_only_when_it_is_unused() {
    let usage = Arc::new(Usage(Mutex::default()));
    let Setup {
        dir,
        registry,
        observed,
        mut agent,
        ..
    } = setup(usage.clone());
    let lists = |observed: &Observed| -> Vec<usize> {
        observed
            .events()
            .iter()
            .filter_map(|e| match e {
                Event::DevicePlugin {
                    devices: Some(n), ..
                } => Some(*n),
                _ => None,
            })
            .collect()
    };

    // The device plugin: kubelet sees the 8 cards.
    agent.serve(Some(Stack::DevicePlugin)).await.unwrap();
    eventually("kubelet lists the cards", Duration::from_secs(10), || {
        let l = lists(&observed);
        async move { l == [8] }
    })
    .await
    .unwrap();

    // A container holds a card: the switch is refused, the device plugin stays.
    *usage.0.lock().unwrap() = vec!["GPU-held".into()];
    let refused = agent.serve(Some(Stack::Dra)).await.unwrap_err();
    let AgentError::Blocked(refused) = refused else {
        panic!("HandoverBlocked, got {refused}")
    };
    assert_eq!(
        (refused.from, refused.in_use.clone()),
        (Stack::DevicePlugin, vec!["GPU-held".to_string()])
    );
    assert_eq!(agent.serving(), Some(Stack::DevicePlugin));
    assert!(!observed.dra_live());

    // Released: kubelet hears zero devices, the stream ends, then DRA starts.
    usage.0.lock().unwrap().clear();
    agent.serve(Some(Stack::Dra)).await.unwrap();
    assert_eq!(agent.serving(), Some(Stack::Dra));
    eventually(
        "the device plugin's stream ends",
        Duration::from_secs(10),
        || {
            let closed = observed
                .events()
                .iter()
                .any(|e| matches!(e, Event::DevicePlugin { what, .. } if what == "closed"));
            async move { closed }
        },
    )
    .await
    .unwrap();
    assert_eq!(lists(&observed), [8, 0]);
    assert!(registry.join("gpu.deckhouse.io-reg.sock").exists());
    assert_eq!(
        observed.slices.lock().unwrap()[0]
            .spec
            .devices
            .as_ref()
            .unwrap()
            .len(),
        8
    );
    assert!(
        !observed.device_plugin_live(),
        "the device plugin's socket is gone"
    );

    // A prepared claim blocks the way back.
    let claim = Claim {
        namespace: "ml".into(),
        uid: "uid-1".into(),
        name: "train".into(),
    };
    let channel = switchyard_kubelet::connect(dir.path().join("plugin/dra.sock"))
        .await
        .unwrap();
    let mut dra = DraPluginClient::new(channel);
    let prepared = dra
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![claim.clone()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(prepared.claims["uid-1"].error, "");
    let refused = agent.serve(Some(Stack::DevicePlugin)).await.unwrap_err();
    let AgentError::Blocked(refused) = refused else {
        panic!("HandoverBlocked, got {refused}")
    };
    assert_eq!(
        (refused.from, refused.in_use.clone()),
        (Stack::Dra, vec!["ml/train".to_string()])
    );
    assert!(
        registry.join("gpu.deckhouse.io-reg.sock").exists(),
        "DRA still served"
    );

    // Unprepared: the slices are withdrawn and the sockets gone before the
    // device plugin registers again.
    dra.node_unprepare_resources(NodeUnprepareResourcesRequest {
        claims: vec![claim],
    })
    .await
    .unwrap();
    agent.serve(Some(Stack::DevicePlugin)).await.unwrap();
    eventually(
        "kubelet lists the cards again",
        Duration::from_secs(10),
        || {
            let l = lists(&observed);
            async move { l == [8, 0, 8] }
        },
    )
    .await
    .unwrap();
    assert!(!registry.join("gpu.deckhouse.io-reg.sock").exists());
    assert!(!dir.path().join("plugin/dra.sock").exists());
    assert!(observed.slices.lock().unwrap().is_empty());

    // At no instant both: every device-plugin event saw no DRA, and every
    // slice publication saw no device plugin.
    for event in observed.events() {
        match event {
            Event::DevicePlugin {
                dra_live,
                devices,
                what,
            } => {
                assert!(
                    !dra_live || devices == Some(0) || what == "closed",
                    "{what} {devices:?} while DRA was live"
                );
            }
            Event::Slices {
                published: true,
                device_plugin_live,
            } => assert!(
                !device_plugin_live,
                "slices published while a device plugin served"
            ),
            Event::Slices { .. } => {}
        }
    }
    agent.serve(None).await.unwrap();
    assert!(!observed.device_plugin_live());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_card_turning_unhealthy_is_republished_tainted() {
    let Setup {
        dir: _dir,
        observed,
        mut agent,
        ..
    } = setup(Arc::new(Usage(Mutex::default())));
    let mut machine = machine();
    agent.serve(Some(Stack::Dra)).await.unwrap();
    let generation = |o: &Observed| o.slices.lock().unwrap()[0].spec.pool.generation;
    assert_eq!(generation(&observed), 1);
    // NVML reports a critical XID on card 5 (through one of its handles).
    let change = switchyard_gpu::HealthChange {
        uuid: machine.gpus[5].uuid.clone(),
        healthy: false,
        reason: "XID 79".into(),
    };
    assert!(machine.apply(&change));
    agent.update(machine.clone()).await.unwrap();
    assert_eq!(generation(&observed), 2, "a new generation of the pool");
    let slices = observed.slices.lock().unwrap().clone();
    let devices = slices[0].spec.devices.clone().unwrap();
    let tainted: Vec<&str> = devices
        .iter()
        .filter(|d| d.taints.is_some())
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(tainted, ["gpu-5"]);
    assert_eq!(
        devices[5].taints.as_ref().unwrap()[0].key,
        "gpu.deckhouse.io/unhealthy"
    );
    assert_eq!(devices[5].taints.as_ref().unwrap()[0].effect, "NoSchedule");
    agent.serve(None).await.unwrap();
}

/// Switching both ways while kubelet keeps calling: prepares and unprepares
/// on the DRA side, Allocate on the device-plugin side. A switch waits for a
/// moment with nothing in use; once it starts, nothing new is handed out, so
/// nothing is left prepared or allocated on the stack it leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_under_load_leaves_nothing_behind() {
    let Setup {
        dir,
        device_plugins,
        observed,
        mut agent,
        ..
    } = setup(Arc::new(Usage(Mutex::default())));
    let machine = machine();

    // DRA under a stream of prepare/unprepare pairs.
    agent.serve(Some(Stack::Dra)).await.unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let progress = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let socket = dir.path().join("plugin/dra.sock");
    let load = {
        let (stop, socket, progress) = (stop.clone(), socket.clone(), progress.clone());
        tokio::spawn(async move {
            let channel = switchyard_kubelet::connect(socket).await.unwrap();
            let mut dra = DraPluginClient::new(channel);
            let (mut prepared, mut refused) = (0, 0);
            for i in 0.. {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let claim = Claim {
                    namespace: "ml".into(),
                    uid: format!("uid-c{i}"),
                    name: format!("c{i}"),
                };
                let Ok(answer) = dra
                    .node_prepare_resources(NodePrepareResourcesRequest {
                        claims: vec![claim.clone()],
                    })
                    .await
                else {
                    break;
                };
                if answer.into_inner().claims[&claim.uid].error.is_empty() {
                    prepared += 1;
                    progress.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                } else {
                    refused += 1;
                }
                if dra
                    .node_unprepare_resources(NodeUnprepareResourcesRequest {
                        claims: vec![claim],
                    })
                    .await
                    .is_err()
                {
                    break;
                }
            }
            (prepared, refused)
        })
    };
    eventually(
        "kubelet's calls are coming",
        Duration::from_secs(10),
        || {
            let n = progress.load(std::sync::atomic::Ordering::SeqCst);
            async move { n > 0 }
        },
    )
    .await
    .unwrap();
    let refusals = serve_when_unused(&mut agent, Stack::DevicePlugin).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (prepared, _refused) = load.await.unwrap();
    assert!(prepared > 0, "the load ran ({refusals} refusals)");
    let checkpoint: Checkpoint =
        serde_json::from_slice(&std::fs::read(dir.path().join("plugin/checkpoint.json")).unwrap())
            .unwrap();
    assert!(
        checkpoint.claims.is_empty(),
        "nothing left prepared: {checkpoint:?}"
    );
    // No claim's spec left; the device plugins' own spec is written.
    let specs: Vec<String> = std::fs::read_dir(dir.path().join("cdi"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        specs,
        [switchyard_kubelet::cdi::DEVICE_PLUGIN_SPEC],
        "no claim's CDI spec left"
    );

    // The device plugin under a stream of Allocate calls; DRA is served next.
    let plugin_socket = registered_device_plugin(&observed, &device_plugins).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let allocated_while_dra = Arc::new(Mutex::new(0));
    let progress = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let load = {
        let (stop, observed, allocated_while_dra, progress) = (
            stop.clone(),
            observed.clone(),
            allocated_while_dra.clone(),
            progress.clone(),
        );
        let uuid = machine.gpus[0].uuid.clone();
        tokio::spawn(async move {
            let channel = switchyard_kubelet::connect(plugin_socket).await.unwrap();
            let mut client = switchyard_kubelet::deviceplugin::api::device_plugin_client::DevicePluginClient::new(channel);
            let mut allocated = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let request = AllocateRequest {
                    container_requests: vec![ContainerAllocateRequest {
                        devices_ids: vec![uuid.clone()],
                    }],
                };
                // Sent after DRA went live, it must be refused (an answer in
                // flight from before may still arrive: not counted).
                let live_before = observed.dra_live();
                match client.allocate(request).await {
                    Ok(_) => {
                        allocated += 1;
                        progress.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        if live_before {
                            *allocated_while_dra.lock().unwrap() += 1;
                        }
                    }
                    Err(_) => break,
                }
            }
            allocated
        })
    };
    eventually(
        "kubelet's Allocate calls are coming",
        Duration::from_secs(10),
        || {
            let n = progress.load(std::sync::atomic::Ordering::SeqCst);
            async move { n > 0 }
        },
    )
    .await
    .unwrap();
    // Kubelet lists nothing held: the switch goes through at once, and
    // Allocate calls in flight are answered before kubelet is asked.
    assert_eq!(serve_when_unused(&mut agent, Stack::Dra).await, 0);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let allocated = load.await.unwrap();
    assert!(allocated > 0, "the load ran");
    assert_eq!(
        *allocated_while_dra.lock().unwrap(),
        0,
        "no device handed out once DRA was live"
    );
    agent.serve(None).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_what_kubelet_lists_holds_the_switch() {
    let usage = Arc::new(Usage(Mutex::default()));
    let Setup {
        dir,
        device_plugins,
        observed,
        mut agent,
        ..
    } = setup(usage.clone());
    agent.serve(Some(Stack::DevicePlugin)).await.unwrap();
    let spec = dir
        .path()
        .join("cdi")
        .join(switchyard_kubelet::cdi::DEVICE_PLUGIN_SPEC);
    assert!(spec.exists(), "the device plugins' CDI spec is written");
    let socket = registered_device_plugin(&observed, &device_plugins).await;
    let channel = switchyard_kubelet::connect(socket).await.unwrap();
    let mut kubelet = DevicePluginClient::new(channel);
    let uuid = machine().gpus[0].uuid.clone();
    let allocate = |kubelet: &mut DevicePluginClient<_>| {
        let request = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec![uuid.clone()],
            }],
        };
        let mut kubelet = kubelet.clone();
        async move { kubelet.allocate(request).await.map(|_| ()) }
    };
    let in_use = |result: Result<(), AgentError>| match result.unwrap_err() {
        AgentError::Blocked(blocked) => blocked.in_use,
        e => panic!("HandoverBlocked, got {e}"),
    };

    // Kubelet lists the device: its entry holds the node, alone.
    let held = format!("nvidia.com/gpu {uuid} (ml/train-0, container main)");
    *usage.0.lock().unwrap() = vec![held.clone()];
    allocate(&mut kubelet).await.unwrap();
    assert_eq!(in_use(agent.serve(Some(Stack::Dra)).await), [held]);
    assert_eq!(agent.serving(), Some(Stack::DevicePlugin));
    assert!(spec.exists(), "kept while a container holds a device");

    // Answered but not listed (the pod is gone, or never started): nothing
    // the agent remembers holds the node.
    usage.0.lock().unwrap().clear();
    allocate(&mut kubelet).await.unwrap();
    agent.serve(Some(Stack::Dra)).await.unwrap();
    assert_eq!(agent.serving(), Some(Stack::Dra));
    assert!(!spec.exists(), "the device plugins' spec goes with them");
    // Closed: the device plugin hands out nothing more.
    assert!(allocate(&mut kubelet).await.is_err());
    agent.serve(None).await.unwrap();
}
