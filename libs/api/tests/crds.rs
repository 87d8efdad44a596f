//! The CRDs: the chart's files are what the Rust types generate, and the real
//! API server stores good objects and rejects bad ones naming the field.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, ObjectMeta, PostParams};
use switchyard_api::{
    GPUClass, GPUClassSpec, Partitions, PhysicalGPU, PhysicalGPUSpec, Sharing, crds, to_yaml,
};
use switchyard_testkit::eventually;
use switchyard_testkit::kube::ControlPlane;

#[test]
fn the_chart_crds_match_the_rust_types() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/switchyard/crds");
    for (file, crd) in crds() {
        let on_disk = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
        assert!(
            on_disk == to_yaml(&crd),
            "deploy/helm/switchyard/crds/{file} differs from the Rust types: run `switchyard crdgen --out deploy/helm/switchyard/crds`"
        );
    }
}

/// Only the formats Kubernetes knows, so applying the chart warns of none.
#[test]
fn the_crds_use_only_formats_kubernetes_knows() {
    const KNOWN: [&str; 9] = [
        "int32",
        "int64",
        "float",
        "double",
        "byte",
        "date",
        "date-time",
        "password",
        "int-or-string",
    ];
    fn formats(value: &serde_json::Value, found: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(map) => {
                if let Some(serde_json::Value::String(f)) = map.get("format") {
                    found.push(f.clone());
                }
                map.values().for_each(|v| formats(v, found));
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| formats(v, found)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    for (_, crd) in crds() {
        formats(&serde_json::to_value(&crd).unwrap(), &mut found);
    }
    assert!(found.contains(&"int64".to_string()), "{found:?}");
    let unknown: Vec<&String> = found
        .iter()
        .filter(|f| !KNOWN.contains(&f.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "formats Kubernetes warns about: {unknown:?}"
    );
}

fn class(name: &str, spec: GPUClassSpec) -> GPUClass {
    GPUClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec,
        status: None,
    }
}

fn a100() -> LabelSelector {
    LabelSelector {
        match_labels: Some(
            [(
                "gpu.deckhouse.io/device".to_string(),
                "a100-sxm4-40gb".to_string(),
            )]
            .into(),
        ),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_accepts_good_objects_and_names_the_field_of_bad_ones() {
    let plane = ControlPlane::start().await;
    let client = plane.client();
    let definitions: Api<CustomResourceDefinition> = Api::all(client.clone());
    // Created as `kubectl apply` would send them: the server answers with
    // no `Warning` header (an unknown format would get one).
    for (_, crd) in crds() {
        let name = crd.metadata.name.clone().unwrap();
        let request =
            http::Request::post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
                .header("content-type", "application/json")
                .body(serde_json::to_vec(&crd).unwrap().into())
                .unwrap();
        let response = client.send(request).await.expect("create CRD");
        assert!(
            response.status().is_success(),
            "{name}: {}",
            response.status()
        );
        let warnings: Vec<_> = response.headers().get_all("warning").iter().collect();
        assert!(warnings.is_empty(), "{name}: {warnings:?}");
    }
    for (_, crd) in crds() {
        let name = crd.metadata.name.unwrap();
        let definitions = &definitions;
        eventually(
            &format!("{name} to be established"),
            Duration::from_secs(30),
            || async {
                let got = definitions.get(&name).await.unwrap();
                let conditions = got.status.and_then(|s| s.conditions).unwrap_or_default();
                conditions
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            },
        )
        .await
        .unwrap();
    }

    let classes: Api<GPUClass> = Api::all(client.clone());
    let good = GPUClassSpec {
        selector: a100(),
        partitions: Some(Partitions {
            whole: Some(true),
            mig_profiles: vec!["1g.5gb".into(), "3g.20gb".into()],
        }),
        sharing: None,
        legacy_bridge: None,
        namespaces: Vec::new(),
    };
    classes
        .create(&PostParams::default(), &class("a100", good))
        .await
        .expect("a good class");

    let bad_profile = GPUClassSpec {
        selector: a100(),
        partitions: Some(Partitions {
            whole: None,
            mig_profiles: vec!["2g.ten".into()],
        }),
        sharing: None,
        legacy_bridge: None,
        namespaces: Vec::new(),
    };
    let err = classes
        .create(&PostParams::default(), &class("bad-profile", bad_profile))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("spec.partitions.migProfiles[0]"),
        "{err}"
    );

    let bad_sharing = GPUClassSpec {
        selector: a100(),
        partitions: None,
        sharing: Some(Sharing {
            time_slicing_replicas: 1,
        }),
        legacy_bridge: None,
        namespaces: Vec::new(),
    };
    let err = classes
        .create(&PostParams::default(), &class("bad-sharing", bad_sharing))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("spec.sharing.timeSlicingReplicas"),
        "{err}"
    );

    let gpus: Api<PhysicalGPU> = Api::all(client.clone());
    let gpu = |uuid: &str| PhysicalGPU {
        metadata: ObjectMeta {
            name: Some("gpu-0-0".into()),
            ..Default::default()
        },
        spec: PhysicalGPUSpec {
            node: "gpu-0".into(),
            index: 0,
            uuid: uuid.into(),
            product: "NVIDIA A100-SXM4-40GB".into(),
        },
        status: None,
    };
    let err = gpus
        .create(&PostParams::default(), &gpu("not-a-uuid"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("spec.uuid"), "{err}");
    gpus.create(
        &PostParams::default(),
        &gpu("GPU-8a3c7e1f-0000-1111-2222-333344445555"),
    )
    .await
    .expect("a good GPU");
}
