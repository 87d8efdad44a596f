//! The DRA admin-access policy (`draAdminAccess.admissionPolicy`) on a real
//! API server: ResourceClaims and ResourceClaimTemplates asking for
//! adminAccess are refused outside the namespaces it allows, the rest pass.
//!
//! Kubernetes 1.36 refuses adminAccess outside labelled namespaces itself,
//! before admission, so the policy's own refusals are shown where it is
//! stricter: with `namespaces` set, a labelled namespace not in the list.

use std::cell::RefCell;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use switchyard_testkit::eventually;
use switchyard_testkit::kube::ControlPlane;

use crate::support::{NATS_URL, apply, kind, name, prepare_cluster, render, template};

const POLICY: &str = "switchyard-admin-access";

/// The admin-access policy and its binding in a rendering.
fn policy(docs: &[Value]) -> Vec<Value> {
    docs.iter()
        .filter(|doc| {
            name(doc) == POLICY
                && matches!(
                    kind(doc),
                    "ValidatingAdmissionPolicy" | "ValidatingAdmissionPolicyBinding"
                )
        })
        .cloned()
        .collect()
}

fn claim(ns: &str, admin: bool) -> ResourceClaim {
    serde_json::from_value(json!({"metadata": {"name": "monitor", "namespace": ns},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "a100.gpu.deckhouse.io"}},
            {"name": "all", "exactly": {"deviceClassName": "a100.gpu.deckhouse.io", "allocationMode": "All", "adminAccess": admin}}]}}}))
    .unwrap()
}

fn claim_template(ns: &str) -> ResourceClaimTemplate {
    serde_json::from_value(json!({"metadata": {"name": "monitor", "namespace": ns},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "monitor", "exactly": {"deviceClassName": "a100.gpu.deckhouse.io", "adminAccess": true}}]}}}}))
    .unwrap()
}

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..Default::default()
    }
}

/// The server's message when it refuses, `None` when it accepts.
async fn create_claim(client: &kube::Client, ns: &str, admin: bool) -> Option<String> {
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), ns);
    match claims.create(&dry_run(), &claim(ns, admin)).await {
        Ok(_) => None,
        Err(kube::Error::Api(status)) => Some(status.message),
        Err(err) => panic!("create a claim in {ns}: {err}"),
    }
}

async fn create_template(client: &kube::Client, ns: &str) -> Option<String> {
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), ns);
    match templates.create(&dry_run(), &claim_template(ns)).await {
        Ok(_) => None,
        Err(kube::Error::Api(status)) => Some(status.message),
        Err(err) => panic!("create a template in {ns}: {err}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_access_only_in_the_namespaces_the_policy_allows() {
    // Off by values; namespaces must be namespace names.
    let off = render(&[NATS_URL, "draAdminAccess.admissionPolicy.enabled=false"]);
    assert!(policy(&off).is_empty());
    let typo = template(&[
        NATS_URL,
        "draAdminAccess.admissionPolicy.namespaces={Admins}",
    ]);
    assert!(!typo.ok, "a namespace that is no name rendered");
    let label_only = policy(&render(&[NATS_URL]));
    assert_eq!(label_only.len(), 2, "on by default, with its binding");
    let pinned = policy(&render(&[
        NATS_URL,
        "draAdminAccess.admissionPolicy.namespaces={admins}",
    ]));

    let plane = ControlPlane::start().await;
    let client = plane.client();
    let discovery = prepare_cluster(&client, &pinned).await;
    for doc in &pinned {
        apply(&client, &discovery, doc, false)
            .await
            .unwrap_or_else(|err| panic!("apply {err}"));
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for (ns, labelled) in [("admins", true), ("rogue", true), ("apps", false)] {
        let labels = if labelled {
            json!({"resource.kubernetes.io/admin-access": "true"})
        } else {
            json!({})
        };
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ns, "labels": labels}}))
                    .unwrap(),
            )
            .await
            .unwrap_or_else(|err| panic!("create namespace {ns}: {err}"));
    }

    // Kubernetes lets a labelled namespace have admin access; the policy,
    // listing only `admins`, refuses `rogue` once it is active.
    let last = RefCell::new(None);
    let active = eventually(
        "the admin-access policy to refuse a claim in rogue",
        Duration::from_secs(20),
        || async {
            let answer = create_claim(&client, "rogue", true).await;
            let refused = answer.as_deref().is_some_and(|m| m.contains(POLICY));
            *last.borrow_mut() = answer;
            refused
        },
    )
    .await;
    if let Err(timeout) = active {
        panic!("{timeout}; last answer: {:?}", last.borrow());
    }
    let message = last.borrow().clone().unwrap();
    assert!(
        message.contains(
            "adminAccess (request all) is allowed only in namespaces this release lists (admins); namespace rogue is not one"
        ),
        "{message}"
    );
    let message = create_template(&client, "rogue").await;
    assert!(
        message
            .as_deref()
            .is_some_and(|m| m.contains(POLICY) && m.contains("(request monitor)")),
        "{message:?}"
    );
    // Claims without admin access pass anywhere; admin access passes in `admins`.
    assert_eq!(create_claim(&client, "rogue", false).await, None);
    assert_eq!(create_claim(&client, "apps", false).await, None);
    assert_eq!(create_claim(&client, "admins", true).await, None);
    assert_eq!(create_template(&client, "admins").await, None);
    // An unlabelled namespace is refused (by the server before the policy).
    let message = create_claim(&client, "apps", true).await;
    assert!(
        message
            .as_deref()
            .is_some_and(|m| m.contains("admin-access")),
        "{message:?}"
    );

    // The default, label-only policy: every labelled namespace may.
    for doc in &label_only {
        apply(&client, &discovery, doc, false)
            .await
            .unwrap_or_else(|err| panic!("apply {err}"));
    }
    let last = RefCell::new(None);
    let relaxed = eventually(
        "the label-only policy to let rogue have admin access",
        Duration::from_secs(20),
        || async {
            let answer = create_claim(&client, "rogue", true).await;
            let allowed = answer.is_none();
            *last.borrow_mut() = answer;
            allowed
        },
    )
    .await;
    if let Err(timeout) = relaxed {
        panic!("{timeout}; last answer: {:?}", last.borrow());
    }
    assert_eq!(create_template(&client, "rogue").await, None);
    assert!(create_claim(&client, "apps", true).await.is_some());
}
