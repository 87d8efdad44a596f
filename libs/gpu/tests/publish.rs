//! What a node publishes, against the real API server and the allocator:
//! every shipped fixture in every layout gives ResourceSlices the API
//! server's validation accepts (names, attribute and device limits, counters,
//! taints) and PhysicalGPU reports its CRD accepts; the allocator then finds
//! in them what a class would ask for.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use switchyard_api::PhysicalGPU;
use switchyard_dra::alloc::Objects;
use switchyard_dra::cel::Compiler;
use switchyard_gpu::publish::{self, Layout};
use switchyard_gpu::{Fixture, GpuSource, Machine};
use switchyard_testkit::kube::ControlPlane;

fn fixture(name: &str) -> Machine {
    let path: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/fixtures")
        .join(name);
    Fixture::load(&path)
        .unwrap_or_else(|e| panic!("{e}"))
        .machine()
        .unwrap()
}

const FIXTURES: [&str; 3] = ["a100-8x-mig.yaml", "h100-8x.yaml", "mixed.yaml"];
const LAYOUTS: [Layout; 3] = [
    Layout::Static,
    Layout::Partitionable,
    Layout::Shared { replicas: 4 },
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fixture_and_layout_is_accepted_by_the_api_server() {
    let plane = ControlPlane::start().await;
    let client = plane.client();
    switchyard_testkit::kube::install_crds(
        &client,
        switchyard_api::crds().into_iter().map(|(_, c)| c).collect(),
    )
    .await;
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let reports: Api<PhysicalGPU> = Api::all(client.clone());
    for name in FIXTURES {
        let machine = fixture(name);
        for layout in LAYOUTS {
            let made = publish::resource_slices("node-1", &machine, layout, 1);
            for s in &made {
                slices
                    .create(&PostParams::default(), s)
                    .await
                    .unwrap_or_else(|e| {
                        panic!(
                            "{name} {layout:?}: {}: {e}",
                            s.metadata.name.as_deref().unwrap()
                        )
                    });
                let devices = s.spec.devices.as_deref().unwrap_or_default();
                let limited = s.spec.shared_counters.is_some()
                    || devices
                        .iter()
                        .any(|d| d.consumes_counters.is_some() || d.taints.is_some());
                assert!(devices.len() <= if limited { 64 } else { 128 });
            }
            // The pool's slices say how many there are.
            assert!(
                made.iter()
                    .all(|s| s.spec.pool.resource_slice_count == made.len() as i64)
            );
            slices
                .delete_collection(&DeleteParams::default(), &ListParams::default())
                .await
                .unwrap();
        }
        for report in publish::physical_gpus("node-1", &machine) {
            let created = reports
                .create(&PostParams::default(), &report)
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(created.spec, report.spec);
        }
        reports
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
            .unwrap();
    }
}

/// The objects a node publishes plus classes and claims, as `dra allocate` reads them.
fn objects(machine: &Machine, layout: Layout, extra: serde_json::Value) -> Objects {
    let mut values: Vec<serde_json::Value> = publish::resource_slices("node-1", machine, layout, 1)
        .into_iter()
        .map(|s| {
            let mut v = serde_json::to_value(s).unwrap();
            v["kind"] = "ResourceSlice".into();
            v
        })
        .collect();
    values.extend(extra.as_array().unwrap().iter().cloned());
    Objects::from_values(values).unwrap()
}

fn class(name: &str, expression: &str) -> serde_json::Value {
    serde_json::json!({"kind": "DeviceClass", "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expression}}]}})
}

fn claim(name: &str, class: &str, count: u32) -> serde_json::Value {
    serde_json::json!({"kind": "ResourceClaim", "metadata": {"name": name, "namespace": "ml", "uid": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": class, "count": count}}]}}})
}

fn devices(objects: &Objects) -> Vec<String> {
    let outcome = objects.allocate("node-1", Arc::new(Compiler::default()));
    assert_eq!(outcome.result, "allocated", "{outcome:?}");
    outcome
        .allocations
        .iter()
        .flat_map(|a| {
            a.allocation
                .devices
                .as_ref()
                .unwrap()
                .results
                .clone()
                .unwrap()
        })
        .map(|r| r.device)
        .collect()
}

#[test]
fn the_usual_class_selectors_find_what_the_node_publishes() {
    let a100 = fixture("a100-8x-mig.yaml");
    let by_device = "device.driver == 'gpu.deckhouse.io' && device.attributes['gpu.deckhouse.io'].device == 'a100-sxm4-40gb'";
    // Static: MIG-mode cards offer their MIG devices, the others whole cards.
    let static_ = objects(
        &a100,
        Layout::Static,
        serde_json::json!([
            class(
                "a100",
                &format!("{by_device} && device.attributes['gpu.deckhouse.io'].type == 'gpu'")
            ),
            class(
                "a100-3g",
                &format!(
                    "{by_device} && device.attributes['gpu.deckhouse.io'].type == 'mig' && device.attributes['gpu.deckhouse.io'].profile == '3g.20gb'"
                )
            ),
            claim("whole", "a100", 4),
            claim("mig", "a100-3g", 3),
        ]),
    );
    assert_eq!(
        devices(&static_),
        [
            "gpu-4",
            "gpu-5",
            "gpu-6",
            "gpu-7",
            "gpu-1-mig-3g-20gb-0",
            "gpu-1-mig-3g-20gb-1",
            "gpu-3-mig-3g-20gb-0"
        ]
    );
    // Partitionable: the scheduler partitions; a whole card and a 3g slice
    // cannot come from one card.
    let partitionable = objects(
        &a100,
        Layout::Partitionable,
        serde_json::json!([
            class(
                "a100",
                &format!("{by_device} && device.attributes['gpu.deckhouse.io'].type == 'gpu'")
            ),
            class(
                "a100-3g",
                &format!(
                    "{by_device} && device.attributes['gpu.deckhouse.io'].type == 'mig' && device.attributes['gpu.deckhouse.io'].profile == '3g.20gb'"
                )
            ),
            claim("whole", "a100", 1),
            claim("mig", "a100-3g", 3),
        ]),
    );
    assert_eq!(
        devices(&partitionable),
        [
            "gpu-0",
            "gpu-1-mig-3g-20gb-0",
            "gpu-1-mig-3g-20gb-1",
            "gpu-2-mig-3g-20gb-0"
        ]
    );
    // Shared by 4: four claims fit on one card, each taking a quarter of its memory.
    let h100 = fixture("h100-8x.yaml");
    let shared = objects(
        &h100,
        Layout::Shared { replicas: 4 },
        serde_json::json!([
            class(
                "h100-shared",
                "device.attributes['gpu.deckhouse.io'].device == 'h100-80gb-hbm3' && device.allowMultipleAllocations"
            ),
            claim("s1", "h100-shared", 1),
            claim("s2", "h100-shared", 1),
            claim("s3", "h100-shared", 1),
            claim("s4", "h100-shared", 1),
            claim("s5", "h100-shared", 1),
        ]),
    );
    let outcome = shared.allocate("node-1", Arc::new(Compiler::default()));
    assert_eq!(outcome.result, "allocated", "{outcome:?}");
    let results: Vec<_> = outcome
        .allocations
        .iter()
        .map(|a| {
            a.allocation
                .devices
                .as_ref()
                .unwrap()
                .results
                .clone()
                .unwrap()[0]
                .clone()
        })
        .collect();
    let cards: Vec<&str> = results.iter().map(|r| r.device.as_str()).collect();
    assert_eq!(cards, ["gpu-0", "gpu-0", "gpu-0", "gpu-0", "gpu-1"]);
    for r in &results {
        assert_eq!(
            r.consumed_capacity.as_ref().unwrap()["memory"].0,
            "20389Mi",
            "a quarter of 81559Mi, rounded down"
        );
        assert!(r.share_id.is_some());
    }
    // An unhealthy card is tainted: the L4 class finds only the healthy one.
    let mixed = fixture("mixed.yaml");
    let phases: Vec<_> = publish::physical_gpus("node-1", &mixed)
        .into_iter()
        .map(|r| r.status.unwrap().phase.unwrap())
        .collect();
    use switchyard_api::GpuPhase::{Failed, Ready};
    assert_eq!(
        phases,
        [Ready, Ready, Ready, Failed],
        "its PhysicalGPU is Failed"
    );
    let l4 = objects(
        &mixed,
        Layout::Static,
        serde_json::json!([
            class("l4", "device.attributes['gpu.deckhouse.io'].device == 'l4'"),
            claim("one", "l4", 1),
        ]),
    );
    assert_eq!(devices(&l4), ["gpu-2"]);
    let two = objects(
        &mixed,
        Layout::Static,
        serde_json::json!([
            class("l4", "device.attributes['gpu.deckhouse.io'].device == 'l4'"),
            claim("two", "l4", 2),
        ]),
    );
    assert_eq!(
        two.allocate("node-1", Arc::new(Compiler::default())).result,
        "unschedulable"
    );
}

#[test]
fn a_bad_fixture_is_named_by_field() {
    let dir = std::env::temp_dir().join(format!("switchyard-gpu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.yaml");
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/fixtures/mixed.yaml"),
    )
    .unwrap()
    .replacen("profile: 7g.40gb", "profile: seven", 1);
    std::fs::write(&path, text).unwrap();
    let err = Fixture::load(&path).unwrap_err().to_string();
    assert!(
        err.ends_with(
            "gpus[0].migDevices[0].profile: \"seven\" is not a MIG profile such as 1g.5gb"
        ),
        "{err}"
    );
    std::fs::write(
        &path,
        "driverVersion: 1\ncudaDriverVersion: '12'\ngpus: []\nextra: 1\n",
    )
    .unwrap();
    let err = Fixture::load(&path).unwrap_err().to_string();
    assert!(err.contains("unknown field `extra`"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
