//! The DRA kubelet plugin played by a fake kubelet: real tonic clients over
//! the plugin's unix sockets, claims from a real API server.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use switchyard_gpu::{Fixture, GpuSource};
use switchyard_kubelet::cdi;
use switchyard_kubelet::dra::dra_plugin_client::DraPluginClient;
use switchyard_kubelet::dra::{Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest};
use switchyard_kubelet::plugin::{ApiClaims, Checkpoint, Config, DraPlugin, serve};
use switchyard_kubelet::pluginregistration::registration_client::RegistrationClient;
use switchyard_kubelet::pluginregistration::{InfoRequest, RegistrationStatus};
use switchyard_testkit::eventually;
use switchyard_testkit::kube::{ControlPlane, create_namespace};
use tonic::transport::Channel;

async fn channel(socket: PathBuf) -> Channel {
    switchyard_kubelet::connect(socket)
        .await
        .expect("connect over the unix socket")
}

struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

async fn start(dir: &Path, client: kube::Client) -> (Arc<DraPlugin>, Running) {
    start_instance(dir, client, "").await
}

/// The plugin serving on sockets named with `instance` (`dra<instance>.sock`,
/// `gpu.deckhouse.io<instance>-reg.sock`), on `dir`'s checkpoint.
async fn start_instance(
    dir: &Path,
    client: kube::Client,
    instance: &str,
) -> (Arc<DraPlugin>, Running) {
    let machine = Fixture::load(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/fixtures/a100-8x-mig.yaml"),
    )
    .unwrap()
    .machine()
    .unwrap();
    let plugin = Arc::new(
        DraPlugin::new(
            Config {
                node: "gpu-1".into(),
                machine,
                cdi_dir: dir.join("cdi"),
                checkpoint: dir.join("plugin/checkpoint.json"),
                endpoint: dir.join(format!("plugin/dra{instance}.sock")),
            },
            Arc::new(ApiClaims(client)),
        )
        .unwrap(),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let registration = dir.join(format!(
        "plugins_registry/gpu.deckhouse.io{instance}-reg.sock"
    ));
    let p = plugin.clone();
    let task = tokio::spawn(async move {
        serve(p, &registration, async {
            let _ = stopped.await;
        })
        .await
        .expect("serve");
    });
    let sockets = [
        dir.join(format!("plugin/dra{instance}.sock")),
        dir.join(format!(
            "plugins_registry/gpu.deckhouse.io{instance}-reg.sock"
        )),
    ];
    eventually("the sockets bound", Duration::from_secs(10), || {
        let ready = sockets.iter().all(|s| s.exists());
        async move { ready }
    })
    .await
    .unwrap();
    (plugin, Running { stop, task })
}

async fn allocated_claim(client: &kube::Client, name: &str, device: &str) -> String {
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "ml");
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "a100.gpu.deckhouse.io"}}]}},
    }))
    .unwrap();
    let created = claims
        .create(&PostParams::default(), &claim)
        .await
        .expect("claim");
    let status = json!({"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.deckhouse.io", "pool": "gpu-1", "device": device}
    ]}}}});
    claims
        .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .expect("allocation");
    created.metadata.uid.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_registers_prepares_and_unprepares_idempotently() {
    let plane = ControlPlane::start().await;
    let client = plane.client();
    create_namespace(&client, "ml").await;
    let dir = tempfile::tempdir().unwrap();
    let (plugin, running) = start(dir.path(), client.clone()).await;

    // Registration, as kubelet's plugin watcher does it.
    let mut registration = RegistrationClient::new(
        channel(
            dir.path()
                .join("plugins_registry/gpu.deckhouse.io-reg.sock"),
        )
        .await,
    );
    let info = registration
        .get_info(InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "gpu.deckhouse.io");
    assert_eq!(
        info.endpoint,
        dir.path().join("plugin/dra.sock").display().to_string()
    );
    assert_eq!(info.supported_versions, ["v1.DRAPlugin"]);
    registration
        .notify_registration_status(RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .unwrap();
    assert!(plugin.registration().unwrap().plugin_registered);

    // Prepare a whole card and a MIG device, twice: the same answer.
    let whole = allocated_claim(&client, "train", "gpu-4").await;
    let mig = allocated_claim(&client, "notebook", "gpu-1-mig-3g-20gb-0").await;
    let claims = vec![
        Claim {
            namespace: "ml".into(),
            uid: whole.clone(),
            name: "train".into(),
        },
        Claim {
            namespace: "ml".into(),
            uid: mig.clone(),
            name: "notebook".into(),
        },
    ];
    let mut dra = DraPluginClient::new(channel(dir.path().join("plugin/dra.sock")).await);
    let first = dra
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: claims.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let answer = &first.claims[&whole];
    assert_eq!(answer.error, "");
    assert_eq!(answer.devices.len(), 1);
    assert_eq!(answer.devices[0].device_name, "gpu-4");
    assert_eq!(answer.devices[0].pool_name, "gpu-1");
    assert_eq!(answer.devices[0].request_names, ["gpu"]);
    assert_eq!(
        answer.devices[0].cdi_device_ids,
        [format!("gpu.deckhouse.io/gpu={whole}-gpu-4")]
    );
    let second = dra
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: claims.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first, second);
    // Each claim's preparation timed, on the agent's /metrics (the other
    // test of this process prepares too: at least these four).
    let mut registry = prometheus_client::registry::Registry::with_prefix("switchyard");
    switchyard_kubelet::metrics::register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let prepared: u64 = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("switchyard_node_agent_claim_seconds_count{operation=\"prepare\"} ")
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no prepare count in\n{text}"));
    assert!(prepared >= 4, "{text}");

    // The CDI spec of each claim: the device named after the claim UID, the
    // card's (or MIG device's) UUID for the runtime.
    let spec: cdi::Spec = serde_json::from_slice(
        &std::fs::read(dir.path().join(format!("cdi/gpu.deckhouse.io-{mig}.json"))).unwrap(),
    )
    .unwrap();
    assert_eq!(spec.cdi_version, "0.6.0");
    assert_eq!(spec.kind, "gpu.deckhouse.io/gpu");
    assert_eq!(spec.devices[0].name, format!("{mig}-gpu-1-mig-3g-20gb-0"));
    assert!(spec.devices[0].container_edits.env[0].starts_with("NVIDIA_VISIBLE_DEVICES=MIG-"));
    assert_eq!(
        spec.devices[0].container_edits.device_nodes[0].path,
        "/dev/nvidia1"
    );
    // Both specs are valid CDI: the specification's JSON schema and the loader
    // container runtimes use (tools/cdi-check).
    let specs: Vec<PathBuf> = [&whole, &mig]
        .iter()
        .map(|uid| dir.path().join(format!("cdi/gpu.deckhouse.io-{uid}.json")))
        .collect();
    let checked = std::process::Command::new(
        switchyard_testkit::oracle(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."),
            "cdi-check",
        )
        .unwrap(),
    )
    .args(&specs)
    .output()
    .unwrap();
    assert!(
        checked.status.success(),
        "{}",
        String::from_utf8_lossy(&checked.stdout)
    );

    // A restart: the checkpoint answers, even with the claim gone from the API.
    running.stop.send(()).unwrap();
    running.task.await.unwrap();
    Api::<ResourceClaim>::namespaced(client.clone(), "ml")
        .delete("train", &Default::default())
        .await
        .unwrap();
    let (_plugin, running) = start(dir.path(), client.clone()).await;
    let mut dra = DraPluginClient::new(channel(dir.path().join("plugin/dra.sock")).await);
    let third = dra
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: claims.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first, third);

    // A claim that does not exist: an error for that claim only.
    let missing = Claim {
        namespace: "ml".into(),
        uid: "0000".into(),
        name: "nope".into(),
    };
    let answer = dra
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![missing],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        answer.claims["0000"]
            .error
            .contains("read ResourceClaim ml/nope"),
        "{answer:?}"
    );

    // Unprepare, twice: the specs and the checkpoint entries go.
    for _ in 0..2 {
        let answer = dra
            .node_unprepare_resources(NodeUnprepareResourcesRequest {
                claims: claims.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(
            answer.claims.values().all(|a| a.error.is_empty()),
            "{answer:?}"
        );
    }
    assert!(
        !dir.path()
            .join(format!("cdi/gpu.deckhouse.io-{whole}.json"))
            .exists()
    );
    let checkpoint: Checkpoint =
        serde_json::from_slice(&std::fs::read(dir.path().join("plugin/checkpoint.json")).unwrap())
            .unwrap();
    assert!(checkpoint.claims.is_empty());
    running.stop.send(()).unwrap();
    running.task.await.unwrap();
    assert!(
        !dir.path().join("plugin/dra.sock").exists(),
        "the sockets are removed on shutdown"
    );
}

/// The states a SIGKILL can leave between the steps of prepare (the CDI spec
/// written, the checkpoint not yet) and of unprepare (the spec removed, the
/// checkpoint entry not yet): the call kubelet repeats completes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_steps_is_completed_by_the_repeated_call() {
    let plane = ControlPlane::start().await;
    let client = plane.client();
    create_namespace(&client, "ml").await;
    let dir = tempfile::tempdir().unwrap();
    let uid = allocated_claim(&client, "train", "gpu-5").await;
    let spec = dir.path().join(format!("cdi/gpu.deckhouse.io-{uid}.json"));
    let checkpoint = dir.path().join("plugin/checkpoint.json");

    // Killed after writing the spec (here: a stale, half-written one), before the checkpoint.
    std::fs::create_dir_all(spec.parent().unwrap()).unwrap();
    std::fs::write(&spec, b"{\"cdiVersion\": \"0.6.0\", \"ki").unwrap();
    let (_plugin, running) = start(dir.path(), client.clone()).await;
    let mut dra = DraPluginClient::new(channel(dir.path().join("plugin/dra.sock")).await);
    let claim = Claim {
        namespace: "ml".into(),
        uid: uid.clone(),
        name: "train".into(),
    };
    let answer = dra
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![claim.clone()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.claims[&uid].error, "");
    let written: cdi::Spec =
        serde_json::from_slice(&std::fs::read(&spec).unwrap()).expect("a whole spec again");
    assert_eq!(written.devices[0].name, format!("{uid}-gpu-5"));
    let saved: Checkpoint = serde_json::from_slice(&std::fs::read(&checkpoint).unwrap()).unwrap();
    assert!(saved.claims.contains_key(&uid));
    running.stop.send(()).unwrap();
    running.task.await.unwrap();

    // Killed during unprepare after the spec was removed: the entry remains.
    std::fs::remove_file(&spec).unwrap();
    let (plugin, running) = start(dir.path(), client.clone()).await;
    assert_eq!(plugin.prepared().await.unwrap(), ["ml/train"]);
    let mut dra = DraPluginClient::new(channel(dir.path().join("plugin/dra.sock")).await);
    let answer = dra
        .node_unprepare_resources(NodeUnprepareResourcesRequest {
            claims: vec![claim],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.claims[&uid].error, "");
    assert!(plugin.prepared().await.unwrap().is_empty());
    let saved: Checkpoint = serde_json::from_slice(&std::fs::read(&checkpoint).unwrap()).unwrap();
    assert!(saved.claims.is_empty());
    running.stop.send(()).unwrap();
    running.task.await.unwrap();
}

/// Two instances on one node's directory, as during a DaemonSet's rolling
/// update with maxSurge: kubelet may prepare through one and unprepare
/// through the other, and calls to both at once lose no claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_the_claims_of_one_checkpoint() {
    let plane = ControlPlane::start().await;
    let client = plane.client();
    create_namespace(&client, "ml").await;
    let dir = tempfile::tempdir().unwrap();
    let (old, old_running) = start_instance(dir.path(), client.clone(), "-old").await;
    let (new, new_running) = start_instance(dir.path(), client.clone(), "-new").await;
    let mut claims = Vec::new();
    for i in 0..8 {
        let name = format!("train-{i}");
        let uid = allocated_claim(&client, &name, &format!("gpu-{i}")).await;
        claims.push(Claim {
            namespace: "ml".into(),
            uid,
            name,
        });
    }
    let via_old = DraPluginClient::new(channel(dir.path().join("plugin/dra-old.sock")).await);
    let mut via_new = DraPluginClient::new(channel(dir.path().join("plugin/dra-new.sock")).await);

    // Each claim prepared through one instance, both at once, one claim per call.
    let prepare = |client: &DraPluginClient<Channel>, claim: &Claim| {
        let (mut client, claim) = (client.clone(), claim.clone());
        async move {
            let answer = client
                .node_prepare_resources(NodePrepareResourcesRequest {
                    claims: vec![claim.clone()],
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(answer.claims[&claim.uid].error, "", "{}", claim.name);
            answer.claims[&claim.uid].devices.clone()
        }
    };
    let calls = claims.iter().enumerate().map(|(i, claim)| {
        let via = if i % 2 == 0 { &via_old } else { &via_new };
        prepare(via, claim)
    });
    let answers = futures::future::join_all(calls).await;
    let checkpoint = dir.path().join("plugin/checkpoint.json");
    let saved: Checkpoint = serde_json::from_slice(&std::fs::read(&checkpoint).unwrap()).unwrap();
    assert_eq!(
        saved.claims.keys().collect::<Vec<_>>(),
        {
            let mut uids: Vec<_> = claims.iter().map(|c| &c.uid).collect();
            uids.sort();
            uids
        },
        "every claim in the checkpoint"
    );
    assert_eq!(old.prepared().await.unwrap().len(), 8);

    // Prepared through the old one, asked again of the new one: the same
    // answer, from the checkpoint.
    assert_eq!(prepare(&via_new, &claims[0]).await, answers[0]);
    // Unprepared through the new one: its spec and entry go, and the old
    // one sees it.
    let answer = via_new
        .node_unprepare_resources(NodeUnprepareResourcesRequest {
            claims: vec![claims[0].clone()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.claims[&claims[0].uid].error, "");
    assert!(
        !dir.path()
            .join(format!("cdi/gpu.deckhouse.io-{}.json", claims[0].uid))
            .exists()
    );
    assert!(
        !old.prepared()
            .await
            .unwrap()
            .contains(&"ml/train-0".to_string())
    );
    assert_eq!(new.prepared().await.unwrap().len(), 7);

    // The old one stops (its sockets go); the new one serves on.
    old_running.stop.send(()).unwrap();
    old_running.task.await.unwrap();
    assert!(!dir.path().join("plugin/dra-old.sock").exists());
    assert!(dir.path().join("plugin/dra-new.sock").exists());
    let answer = via_new
        .node_unprepare_resources(NodeUnprepareResourcesRequest {
            claims: claims[1..].to_vec(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        answer.claims.values().all(|c| c.error.is_empty()),
        "{answer:?}"
    );
    assert!(new.prepared().await.unwrap().is_empty());
    new_running.stop.send(()).unwrap();
    new_running.task.await.unwrap();
}
