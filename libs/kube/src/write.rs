//! The write helpers every service's writers share (each service's own
//! writers live in its crate, `services/<name>/src/edge.rs`).
//!
//! Every write carries the service's field manager. A field the service owns
//! (the `gpu-stack` label, `spec.unschedulable`, a DeviceClass, a GPUClass's
//! status) is written with Server-Side Apply. Server-Side Apply cannot take
//! away a field another manager owns, so changes to what others own (the
//! group label, role labels, a rollback's restore, a workload's template) are
//! read-decide-write: read the object, compute the change from what is there
//! now, write it with the read `resourceVersion` as precondition. A conflict
//! (409) — from either route — re-reads and decides again; an apply conflict
//! is forced only after the re-read shows the field still is not what the
//! effect asks for. 409, 429 and 5xx are retried with exponential backoff per
//! object; other errors are returned to the host, which issues the effect
//! again later (effects are idempotent). Effects on different objects are
//! written concurrently.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, Patch, PatchParams};
use kube::core::{Selector, SelectorExt};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use switchyard_core::ServiceName;
use switchyard_core::effects::{Effect, EffectExecutor, Outcome};
use switchyard_eventlog::trace;
use switchyard_proto::v1::TraceContext;
use tracing::Instrument;

#[derive(Debug, thiserror::Error)]
pub enum EdgeError {
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("find the Kubernetes API (in-cluster config or KUBECONFIG): {0}")]
    Config(#[from] kube::config::InferConfigError),
    #[error("{0}")]
    Invalid(String),
    /// Not written while another controller holds the object in a state
    /// it restores itself (the driver manager's paused operands).
    #[error("{0}")]
    Paused(String),
    #[error("{service} does not write {effect:?}: its owner, {}, does", effect.owner())]
    NotOwned {
        service: ServiceName,
        effect: Box<Effect>,
    },
}

impl EdgeError {
    pub fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> EdgeError {
        let what = what.into();
        move |source| EdgeError::Api { what, source }
    }

    /// Why, in a word: the API server's answer (`conflict`, `throttled`,
    /// `not_found`, `forbidden`, `invalid`, `server_error`, `refused`), or
    /// `unreachable`, `config`, `paused`, `not_owned`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            EdgeError::Api {
                source: kube::Error::Api(status),
                ..
            } => match status.code {
                409 => "conflict",
                429 => "throttled",
                404 => "not_found",
                401 | 403 => "forbidden",
                400 | 422 => "invalid",
                code if code >= 500 => "server_error",
                _ => "refused",
            },
            EdgeError::Api { .. } => "unreachable",
            EdgeError::Config(_) => "config",
            EdgeError::Invalid(_) => "invalid",
            EdgeError::Paused(_) => "paused",
            EdgeError::NotOwned { .. } => "not_owned",
        }
    }

    /// 409, 429 and 5xx: worth another try after a pause.
    pub fn retryable(&self) -> bool {
        matches!(self, EdgeError::Api { source: kube::Error::Api(status), .. }
            if status.code == 409 || status.code == 429 || status.code >= 500)
    }
}

/// The writers' common part for one service: the client, the field manager
/// `switchyard-<service>`, the retry policy and how many objects are
/// written at once.
#[derive(Clone)]
pub struct Writer {
    client: Client,
    manager: String,
    backoff: ExponentialBuilder,
    parallel: usize,
}

impl Writer {
    /// Writers acting as `service`. The client is built from `config` without
    /// kube's own retry of 429 and 503: an eviction refused by a
    /// PodDisruptionBudget is a 429 that must be reported at once, not retried
    /// for minutes; the writer backs off itself.
    pub fn new(config: kube::Config, service: ServiceName) -> Result<Writer, EdgeError> {
        let mut config = crate::watch::client_config(config);
        config.default_retry = false;
        let client = Client::try_from(config)
            .map_err(|e| EdgeError::Invalid(format!("build the Kubernetes client: {e}")))?;
        Ok(Writer {
            client,
            manager: format!("switchyard-{service}"),
            backoff: ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(50))
                .with_max_delay(Duration::from_secs(5))
                .with_max_times(8)
                .with_jitter(),
            parallel: 16,
        })
    }

    /// Writers acting as `service` on the cluster this process finds
    /// (in-cluster config or `KUBECONFIG`).
    pub async fn infer(service: ServiceName) -> Result<Writer, EdgeError> {
        Writer::new(kube::Config::infer().await?, service)
    }

    /// At most `parallel` objects written at once (at least one).
    pub fn with_parallel(mut self, parallel: usize) -> Writer {
        self.parallel = parallel.max(1);
        self
    }

    pub fn client(&self) -> Client {
        self.client.clone()
    }

    pub fn field_manager(&self) -> &str {
        &self.manager
    }

    /// `once`, retried on conflicts, throttling and server errors.
    pub async fn retrying<F, Fut>(&self, once: F) -> Result<Outcome, EdgeError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Outcome, EdgeError>>,
    {
        once.retry(self.backoff)
            .when(EdgeError::retryable)
            .notify(|err, pause| tracing::debug!(%err, ?pause, "retrying"))
            .await
    }

    /// Executes `effects` with `execute` (each retried): objects concurrently,
    /// up to `parallel` at once, the effects on one object one after the
    /// other in order. The results come back in `effects`' order.
    pub async fn execute_by_object<'a, F, Fut>(
        &'a self,
        effects: &'a [Effect],
        execute: F,
    ) -> Vec<Result<Outcome, EdgeError>>
    where
        F: Fn(usize, &'a Effect) -> Fut + Copy + 'a,
        Fut: Future<Output = Result<Outcome, EdgeError>> + 'a,
    {
        let mut by_object: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, effect) in effects.iter().enumerate() {
            by_object.entry(effect.object()).or_default().push(i);
        }
        let mut results: Vec<Option<Result<Outcome, EdgeError>>> =
            effects.iter().map(|_| None).collect();
        let done: Vec<(usize, Result<Outcome, EdgeError>)> =
            futures::stream::iter(by_object.into_values().map(|indices| async move {
                let mut done = Vec::with_capacity(indices.len());
                for i in indices {
                    done.push((i, self.retrying(|| execute(i, &effects[i])).await));
                }
                done
            }))
            .buffer_unordered(self.parallel)
            .flat_map(futures::stream::iter)
            .collect()
            .await;
        for (i, result) in done {
            results[i] = Some(result);
        }
        results
            .into_iter()
            .map(|r| r.expect("every effect was executed"))
            .collect()
    }

    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    pub async fn read_node(&self, node: &str) -> Result<Node, EdgeError> {
        self.nodes()
            .get(node)
            .await
            .map_err(EdgeError::api(format!("read node {node}")))
    }

    /// Server-Side Apply of the node fields this service owns. An apply
    /// states everything its manager owns — a field left out is given up — so
    /// the apply carries the fields the service owns now (read from the
    /// node's managedFields) with `edit` made to them. On a conflict with
    /// another manager: re-read, and take the field over only if it still is
    /// not what the effect asks for.
    pub async fn apply_node(
        &self,
        node: &str,
        edit: impl Fn(&mut Owned),
        holds: impl Fn(&Node) -> bool,
    ) -> Result<Outcome, EdgeError> {
        let nodes = self.nodes();
        let current = self.read_node(node).await?;
        if holds(&current) {
            return Ok(Outcome::default());
        }
        let mut owned = Owned::of(&current, &self.manager);
        edit(&mut owned);
        let patch = owned.apply_config(node);
        let params = PatchParams::apply(&self.manager);
        match nodes.patch(node, &params, &Patch::Apply(&patch)).await {
            Ok(_) => Ok(Outcome::default()),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                let current = self.read_node(node).await?;
                if holds(&current) {
                    return Ok(Outcome::default());
                }
                tracing::info!(node, conflict = %status.message, "taking the field over after a re-read");
                let mut owned = Owned::of(&current, &self.manager);
                edit(&mut owned);
                nodes
                    .patch(
                        node,
                        &params.force(),
                        &Patch::Apply(&owned.apply_config(node)),
                    )
                    .await
                    .map_err(EdgeError::api(format!("apply node {node}")))?;
                Ok(Outcome::default())
            }
            Err(err) => Err(EdgeError::api(format!("apply node {node}"))(err)),
        }
    }

    /// Read-decide-write of a node's labels: `edit` gets the labels as they
    /// are, and may refuse to write; the difference is written as a merge
    /// patch guarded by the read resourceVersion. Nothing is written when
    /// nothing changes.
    pub async fn edit_node_labels(
        &self,
        node: &str,
        edit: impl FnOnce(&mut BTreeMap<String, String>) -> Result<(), EdgeError>,
    ) -> Result<Outcome, EdgeError> {
        let nodes = self.nodes();
        let current = self.read_node(node).await?;
        let before = current.labels().clone();
        let mut after = before.clone();
        edit(&mut after)?;
        if after == before {
            return Ok(Outcome::default());
        }
        let patch = json!({"metadata": {
            "resourceVersion": current.resource_version(),
            "labels": label_diff(&before, &after),
        }});
        self.merge_patch(&nodes, node, &patch, format!("label node {node}"))
            .await
    }

    /// A merge patch as this service (guarded when it carries a resourceVersion).
    pub async fn merge_patch<K>(
        &self,
        api: &Api<K>,
        name: &str,
        patch: &serde_json::Value,
        what: String,
    ) -> Result<Outcome, EdgeError>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        api.patch(name, &self.merge_params(), &Patch::Merge(patch))
            .await
            .map_err(EdgeError::api(what))?;
        Ok(Outcome::default())
    }

    pub fn merge_params(&self) -> PatchParams {
        PatchParams {
            field_manager: Some(self.manager.clone()),
            ..PatchParams::default()
        }
    }
}

/// One service's writers: how it carries out each effect its core wants.
pub trait Writes: Clone + Send + Sync + 'static {
    /// The service whose writers these are (its field manager).
    const SERVICE: ServiceName;
    /// Writers over `writer`.
    fn new(writer: Writer) -> Self;
    fn writer(&self) -> &Writer;
    /// One attempt at `effect`; [`Edge`] retries it. An effect of another
    /// service's is [`EdgeError::NotOwned`].
    fn write(&self, effect: &Effect) -> impl Future<Output = Result<Outcome, EdgeError>> + Send;
}

/// A service's writers as the runtime's [`EffectExecutor`]: each effect
/// retried, objects written concurrently.
#[derive(Clone)]
pub struct Edge<W> {
    writes: W,
}

impl<W: Writes> Edge<W> {
    pub fn new(writer: Writer) -> Self {
        Edge {
            writes: W::new(writer),
        }
    }

    /// The writers on the cluster this process finds (in-cluster config or
    /// `KUBECONFIG`), writing at most `parallel` objects at once.
    pub async fn infer(parallel: usize) -> Result<Self, EdgeError> {
        Ok(Edge::new(
            Writer::infer(W::SERVICE).await?.with_parallel(parallel),
        ))
    }

    pub fn field_manager(&self) -> &str {
        self.writes.writer().field_manager()
    }

    /// Executes one effect, retrying conflicts, throttling and server errors.
    pub async fn execute_one(&self, effect: &Effect) -> Result<Outcome, EdgeError> {
        self.writes
            .writer()
            .retrying(|| self.writes.write(effect))
            .await
    }
}

impl<W: Writes> EffectExecutor for Edge<W> {
    type Error = EdgeError;
    fn execute(
        &mut self,
        effects: Vec<Effect>,
    ) -> impl Future<Output = Vec<Result<Outcome, EdgeError>>> + Send {
        let writes = self.writes.clone();
        async move {
            writes
                .writer()
                .execute_by_object(&effects, |_, effect| writes.write(effect))
                .await
        }
    }

    fn execute_in_spans(
        &mut self,
        effects: Vec<(Effect, tracing::Span, Option<TraceContext>)>,
    ) -> impl Future<Output = Vec<Result<Outcome, EdgeError>>> + Send {
        let writes = self.writes.clone();
        async move {
            let (effects, traces): (Vec<Effect>, Vec<_>) = effects
                .into_iter()
                .map(|(effect, span, carried)| (effect, (span, carried)))
                .unzip();
            let traces = &traces;
            writes
                .writer()
                .execute_by_object(&effects, |i, effect| {
                    let (span, carried) = &traces[i];
                    trace::carrying(
                        carried.clone(),
                        writes.write(effect).instrument(span.clone()),
                    )
                })
                .await
        }
    }

    fn metric_label(error: &EdgeError) -> &'static str {
        error.metric_label()
    }
}

/// The effect a service's writers were given but do not own.
pub fn not_owned<W: Writes>(effect: &Effect) -> Result<Outcome, EdgeError> {
    Err(EdgeError::NotOwned {
        service: W::SERVICE,
        effect: Box::new(effect.clone()),
    })
}

/// The node fields a manager owns through Server-Side Apply, with their
/// current values: the labels and `spec.unschedulable`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Owned {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub unschedulable: Option<bool>,
}

impl Owned {
    /// What `manager` owns of `node` by its applies (managedFields, operation Apply).
    pub fn of(node: &Node, manager: &str) -> Owned {
        let mut owned = Owned::default();
        let entries = node.metadata.managed_fields.iter().flatten();
        for entry in entries.filter(|e| {
            e.manager.as_deref() == Some(manager) && e.operation.as_deref() == Some("Apply")
        }) {
            let Some(fields) = entry.fields_v1.as_ref().map(|f| &f.0) else {
                continue;
            };
            for (field, values, into) in [
                ("f:labels", node.labels(), &mut owned.labels),
                ("f:annotations", node.annotations(), &mut owned.annotations),
            ] {
                let Some(keys) = fields
                    .get("f:metadata")
                    .and_then(|m| m.get(field))
                    .and_then(Value::as_object)
                else {
                    continue;
                };
                for key in keys.keys().filter_map(|k| k.strip_prefix("f:")) {
                    if let Some(value) = values.get(key) {
                        into.insert(key.to_string(), value.clone());
                    }
                }
            }
            if fields
                .get("f:spec")
                .and_then(|s| s.get("f:unschedulable"))
                .is_some()
            {
                owned.unschedulable = Some(
                    node.spec
                        .as_ref()
                        .and_then(|s| s.unschedulable)
                        .unwrap_or(false),
                );
            }
        }
        owned
    }

    pub fn apply_config(&self, node: &str) -> Value {
        let mut config = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node, "labels": self.labels},
        });
        if !self.annotations.is_empty() {
            config["metadata"]["annotations"] = json!(self.annotations);
        }
        if let Some(on) = self.unschedulable {
            config["spec"] = json!({"unschedulable": on});
        }
        config
    }
}

/// A merge-patch `labels` object turning `before` into `after`.
pub fn label_diff(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> Value {
    let mut diff = serde_json::Map::new();
    for key in before.keys().filter(|k| !after.contains_key(*k)) {
        diff.insert(key.clone(), Value::Null);
    }
    for (key, value) in after.iter().filter(|(k, v)| before.get(*k) != Some(v)) {
        diff.insert(key.clone(), json!(value));
    }
    Value::Object(diff)
}

/// Whether a label selector selects `labels` (matchLabels and
/// matchExpressions, as kube's `Selector` reads them); a selector with an
/// unknown operator selects nothing.
pub fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    Selector::try_from(selector.clone()).is_ok_and(|s| s.matches(labels))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    #[test]
    fn a_label_diff_nulls_what_goes_and_sets_what_changes() {
        let before = BTreeMap::from([
            ("a".to_string(), "1".to_string()),
            ("b".to_string(), "2".to_string()),
        ]);
        let after = BTreeMap::from([
            ("b".to_string(), "3".to_string()),
            ("c".to_string(), "4".to_string()),
        ]);
        assert_eq!(
            label_diff(&before, &after),
            json!({"a": null, "b": "3", "c": "4"})
        );
        assert_eq!(label_diff(&before, &before), json!({}));
    }

    #[test]
    fn selectors_match_labels_and_expressions() {
        let labels = BTreeMap::from([("app".to_string(), "train".to_string())]);
        let mut selector = LabelSelector {
            match_labels: Some(labels.clone()),
            ..LabelSelector::default()
        };
        assert!(selects(&selector, &labels));
        selector.match_expressions = Some(vec![LabelSelectorRequirement {
            key: "tier".into(),
            operator: "Exists".into(),
            values: None,
        }]);
        assert!(!selects(&selector, &labels));
        assert!(!selects(
            &LabelSelector {
                match_labels: Some(BTreeMap::from([("app".to_string(), "x".to_string())])),
                ..LabelSelector::default()
            },
            &labels
        ));
    }
}
