//! The node's ResourceSlices on a real API server: applied, replaced by a new
//! publication (stale slices deleted), withdrawn — another node's left alone.

use std::path::Path;

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, ListParams};
use switchyard_gpu::publish::{Layout, resource_slices};
use switchyard_gpu::{Fixture, GpuSource};
use switchyard_node_agent::edge::agent::SlicePublisher;
use switchyard_node_agent::edge::slices::ApiSlices;
use switchyard_testkit::kube::ControlPlane;

async fn names(api: &Api<ResourceSlice>) -> Vec<(String, i64)> {
    let mut out: Vec<(String, i64)> = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|s| (s.metadata.name.unwrap(), s.spec.pool.generation))
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_replaces_the_last_and_a_withdrawal_removes_it() {
    let plane = ControlPlane::start().await;
    let client = plane.client();
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let machine = Fixture::load(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/fixtures/a100-8x-mig.yaml"),
    )
    .unwrap()
    .machine()
    .unwrap();
    let other = ApiSlices::new(client.clone(), "gpu-2");
    other
        .publish(resource_slices("gpu-2", &machine, Layout::Static, 1))
        .await
        .unwrap();
    let node = ApiSlices::new(client.clone(), "gpu-1");

    node.publish(resource_slices("gpu-1", &machine, Layout::Partitionable, 1))
        .await
        .unwrap();
    assert_eq!(
        names(&api).await,
        [
            ("gpu-1-gpu.deckhouse.io-0".to_string(), 1),
            ("gpu-1-gpu.deckhouse.io-1".to_string(), 1),
            ("gpu-1-gpu.deckhouse.io-counters".to_string(), 1),
            ("gpu-2-gpu.deckhouse.io-0".to_string(), 1),
        ]
    );
    // Republished static at generation 2: one slice, the others deleted.
    node.publish(resource_slices("gpu-1", &machine, Layout::Static, 2))
        .await
        .unwrap();
    assert_eq!(
        names(&api).await,
        [
            ("gpu-1-gpu.deckhouse.io-0".to_string(), 2),
            ("gpu-2-gpu.deckhouse.io-0".to_string(), 1)
        ]
    );
    let slice = api.get("gpu-1-gpu.deckhouse.io-0").await.unwrap();
    assert!(slice.spec.shared_counters.is_none());
    assert_eq!(slice.spec.devices.unwrap().len(), 20);
    // Applying the same again changes nothing.
    let before = api
        .get("gpu-1-gpu.deckhouse.io-0")
        .await
        .unwrap()
        .metadata
        .resource_version;
    node.publish(resource_slices("gpu-1", &machine, Layout::Static, 2))
        .await
        .unwrap();
    assert_eq!(
        api.get("gpu-1-gpu.deckhouse.io-0")
            .await
            .unwrap()
            .metadata
            .resource_version,
        before
    );

    node.withdraw().await.unwrap();
    node.withdraw().await.unwrap();
    assert_eq!(
        names(&api).await,
        [("gpu-2-gpu.deckhouse.io-0".to_string(), 1)]
    );
}
