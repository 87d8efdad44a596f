//! inventory's edge: its watchers, which append what changed as fact events.
//!
//! One kube-runtime watcher per kind, merged into one ordered stream. Each
//! object becomes its fact ([`switchyard_kube::facts`]); the [`Observer`] drops
//! a fact that repeats the last report of its object, so a watch restart or a
//! re-list appends nothing for objects that did not change. After a re-list
//! (`InitDone`), objects reported before but absent from the list are reported
//! removed — a deletion missed while the watch was down is not lost. On start
//! the observer and the set of live objects are rebuilt from inventory's own
//! records in the log, so a restarted inventory does not report the cluster
//! again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::{FutureExt, Stream, StreamExt, stream::BoxStream};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{Node, Pod, ResourceQuota};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use switchyard_api::{GPUClass, ModuleConfig, NodeGroup, PhysicalGPU};
use switchyard_core::ServiceName;
use switchyard_core::inventory::Observer;
use switchyard_core::subjects::subject_of;
use switchyard_eventlog::{EventLog, LogError, append_facts, now_nanos};
use switchyard_kube::facts;
use switchyard_kube::platform::Platform;
use switchyard_proto::v1::{
    DeviceClassRemoved, DomainEvent, GpuClassRemoved, NodeGroupRemoved, NodeRemoved,
    PhysicalGpuRemoved, PodRemoved, ResourceClaimRemoved, ResourceSliceRemoved, WorkloadObserved,
    WorkloadRemoved, domain_event::Kind,
};

const INVENTORY: ServiceName = ServiceName::Inventory;

/// What one watcher saw, already as facts.
#[derive(Debug)]
enum Seen {
    /// A re-list of `kind` starts.
    Init(&'static str),
    /// An object as it is now (from a list or a watch event).
    Object(&'static str, DomainEvent),
    /// The object is gone.
    Gone(DomainEvent),
    /// The re-list of `kind` is complete.
    InitDone(&'static str),
}

/// How inventory runs.
#[derive(Clone, Debug)]
pub struct InventoryOptions {
    /// The running module version, reported with the module settings.
    pub module_version: String,
    /// No gpu ModuleConfig is expected (the nvidia-operator backend): the
    /// platform's facts are recorded as module settings at start and when
    /// they change, as long as none appears.
    pub without_module_config: bool,
}

impl Default for InventoryOptions {
    fn default() -> Self {
        InventoryOptions {
            module_version: env!("CARGO_PKG_VERSION").to_string(),
            without_module_config: false,
        }
    }
}

/// The removal fact of an observed object, for the kinds that have one.
fn removal_of(fact: &DomainEvent) -> Option<DomainEvent> {
    let kind = match fact.kind.as_ref()? {
        Kind::NodeObserved(f) => Kind::NodeRemoved(NodeRemoved {
            node: f.node.clone(),
        }),
        Kind::NodeGroupObserved(f) => Kind::NodeGroupRemoved(NodeGroupRemoved {
            group: f.group.clone(),
        }),
        Kind::PhysicalGpuObserved(f) => Kind::PhysicalGpuRemoved(PhysicalGpuRemoved {
            name: f.name.clone(),
            node: f.node.clone(),
        }),
        Kind::PodObserved(f) => Kind::PodRemoved(PodRemoved {
            namespace: f.namespace.clone(),
            name: f.name.clone(),
        }),
        Kind::ResourceSliceObserved(f) => Kind::ResourceSliceRemoved(ResourceSliceRemoved {
            name: f.name.clone(),
            node: f.node.clone(),
        }),
        Kind::DeviceClassObserved(f) => Kind::DeviceClassRemoved(DeviceClassRemoved {
            name: f.name.clone(),
        }),
        Kind::GpuClassObserved(f) => Kind::GpuClassRemoved(GpuClassRemoved {
            name: f.name.clone(),
        }),
        Kind::ResourceClaimObserved(f) => Kind::ResourceClaimRemoved(ResourceClaimRemoved {
            namespace: f.namespace.clone(),
            name: f.name.clone(),
        }),
        Kind::WorkloadObserved(f) => Kind::WorkloadRemoved(WorkloadRemoved {
            workload: f.workload.clone(),
        }),
        _ => return None,
    };
    Some(DomainEvent { kind: Some(kind) })
}

/// Which watcher reports a fact (the key of the live-object sets).
fn watch_kind(fact: &DomainEvent) -> Option<&'static str> {
    Some(match fact.kind.as_ref()? {
        Kind::NodeObserved(_) | Kind::NodeRemoved(_) => "Node",
        Kind::NodeGroupObserved(_) | Kind::NodeGroupRemoved(_) => "NodeGroup",
        Kind::PhysicalGpuObserved(_) | Kind::PhysicalGpuRemoved(_) => "PhysicalGPU",
        Kind::PodObserved(_) | Kind::PodRemoved(_) => "Pod",
        Kind::ResourceSliceObserved(_) | Kind::ResourceSliceRemoved(_) => "ResourceSlice",
        Kind::DeviceClassObserved(_) | Kind::DeviceClassRemoved(_) => "DeviceClass",
        Kind::GpuClassObserved(_) | Kind::GpuClassRemoved(_) => "GPUClass",
        Kind::ResourceClaimObserved(_) | Kind::ResourceClaimRemoved(_) => "ResourceClaim",
        Kind::WorkloadObserved(WorkloadObserved { workload, .. })
        | Kind::WorkloadRemoved(WorkloadRemoved { workload }) => {
            match workload.as_ref()?.kind.as_str() {
                "Deployment" => "Deployment",
                "StatefulSet" => "StatefulSet",
                "DaemonSet" => "DaemonSet",
                "Job" => "Job",
                "CronJob" => "CronJob",
                _ => return None,
            }
        }
        _ => return None,
    })
}

/// What inventory has reported: the observer's memory and, per kind, the
/// live objects (subject -> removal fact).
#[derive(Default)]
pub struct Reported {
    observer: Observer,
    live: BTreeMap<&'static str, BTreeMap<String, DomainEvent>>,
    /// Subjects seen in the re-list in progress, per kind.
    relisting: BTreeMap<&'static str, BTreeSet<String>>,
    /// The module settings wait for the first complete list of NodeGroups:
    /// the upgrade hold applies to the groups with spec.gpu at the first
    /// observation of the settings, so they must be in the log before it.
    groups_listed: bool,
    deferred: Vec<Seen>,
}

impl Reported {
    /// Folds one of inventory's own records (rebuild) or a fact about to be
    /// appended; returns the fact if it is news.
    pub fn observe(&mut self, fact: DomainEvent) -> Option<DomainEvent> {
        let news = self.observer.observe(fact)?;
        if let Some(kind) = watch_kind(&news) {
            let live = self.live.entry(kind).or_default();
            let subject = subject_of(&news);
            match removal_of(&news) {
                Some(removal) => {
                    live.insert(subject, removal);
                }
                None => {
                    live.remove(&subject);
                }
            }
        }
        Some(news)
    }

    fn handle(&mut self, seen: Seen) -> Vec<DomainEvent> {
        if !self.groups_listed {
            match &seen {
                Seen::Object("ModuleConfig", _) => {
                    self.deferred.push(seen);
                    return Vec::new();
                }
                Seen::InitDone("NodeGroup") => {
                    self.groups_listed = true;
                    let mut out = self.handle(seen);
                    for later in std::mem::take(&mut self.deferred) {
                        out.extend(self.handle(later));
                    }
                    return out;
                }
                _ => {}
            }
        }
        match seen {
            Seen::Init(kind) => {
                self.relisting.insert(kind, BTreeSet::new());
                Vec::new()
            }
            Seen::Object(kind, fact) => {
                if let Some(listed) = self.relisting.get_mut(kind) {
                    listed.insert(subject_of(&fact));
                }
                self.observe(fact).into_iter().collect()
            }
            Seen::Gone(fact) => self.observe(fact).into_iter().collect(),
            Seen::InitDone(kind) => {
                let listed = self.relisting.remove(kind).unwrap_or_default();
                let missed: Vec<DomainEvent> = self
                    .live
                    .get(kind)
                    .into_iter()
                    .flatten()
                    .filter(|(subject, _)| !listed.contains(*subject))
                    .map(|(_, removal)| removal.clone())
                    .collect();
                missed
                    .into_iter()
                    .filter_map(|removal| self.observe(removal))
                    .collect()
            }
        }
    }
}

/// One watcher's stream, as facts.
fn watch<K>(
    api: Api<K>,
    kind: &'static str,
    fact: impl Fn(&K) -> Option<DomainEvent> + Send + 'static,
    gone: impl Fn(&K) -> Option<DomainEvent> + Send + 'static,
) -> BoxStream<'static, Seen>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let events = watcher(api, switchyard_kube::watch::config()).filter_map(move |event| {
        let seen = match event {
            Ok(watcher::Event::Init) => Some(Ok(Seen::Init(kind))),
            Ok(watcher::Event::InitDone) => Some(Ok(Seen::InitDone(kind))),
            Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                fact(&o).map(|f| Ok(Seen::Object(kind, f)))
            }
            Ok(watcher::Event::Delete(o)) => gone(&o).map(|g| Ok(Seen::Gone(g))),
            Err(err) => Some(Err(err)),
        };
        futures::future::ready(seen)
    });
    switchyard_kube::watch::resilient(events, kind.to_string()).boxed()
}

/// How often inventory reads the platform again: a gate turned off and the
/// API server restarted shows within this.
const PLATFORM_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// The gpu ModuleConfig's settings as facts, with the platform read at
/// start and again every `every`: a change of either is a new fact.
fn module_settings(
    client: Client,
    version: String,
    platform: Platform,
    every: std::time::Duration,
    without_module_config: bool,
) -> BoxStream<'static, Seen> {
    // Without a ModuleConfig: the platform alone, until one appears.
    let alone = move |config: Option<&ModuleConfig>, version: &str, platform: &Platform| {
        (without_module_config && config.is_none())
            .then(|| facts::platform_settings(version, platform))
    };
    let first = alone(None, &version, &platform).map(|fact| Seen::Object("ModuleConfig", fact));
    // The gpu ModuleConfig last seen, and the platform last read.
    let latest = Arc::new(std::sync::Mutex::new((None::<ModuleConfig>, platform)));
    let configs = {
        let (latest, version) = (latest.clone(), version.clone());
        watch(
            Api::<ModuleConfig>::all(client.clone()),
            "ModuleConfig",
            move |config| {
                let mut latest = latest.lock().unwrap_or_else(|e| e.into_inner());
                let fact = facts::module_settings(config, &version, &latest.1)?;
                latest.0 = Some(config.clone());
                Some(fact)
            },
            |_| None,
        )
    };
    let rereads = futures::stream::unfold(
        (client, latest, version),
        move |(client, latest, version)| async move {
            tokio::time::sleep(every).await;
            let fresh = Platform::read(&client).await;
            let fact = {
                let mut latest = latest.lock().unwrap_or_else(|e| e.into_inner());
                let platform = latest.1.updated_with(fresh);
                if latest.1 == platform {
                    None
                } else {
                    tracing::info!(
                        dra_api = platform.dra_api_served,
                        kubernetes = platform.kubernetes_version,
                        gates = ?platform.feature_gates,
                        "the platform changed"
                    );
                    latest.1 = platform;
                    let (config, platform) = &*latest;
                    config
                        .as_ref()
                        .and_then(|c| facts::module_settings(c, &version, platform))
                        .or_else(|| alone(config.as_ref(), &version, platform))
                }
            };
            Some((fact, (client, latest, version)))
        },
    )
    .filter_map(|fact| futures::future::ready(fact.map(|f| Seen::Object("ModuleConfig", f))));
    futures::stream::iter(first)
        .chain(futures::stream::select(configs, rereads))
        .boxed()
}

/// Every watcher of inventory, merged.
fn watchers(
    client: &Client,
    options: &InventoryOptions,
    platform: &Platform,
) -> impl Stream<Item = Seen> {
    let dra_api = platform.dra_api_served;
    let c = || client.clone();
    let version = options.module_version.clone();
    let mut streams = vec![
        watch(
            Api::<Node>::all(c()),
            "Node",
            |o| Some(facts::node(o)),
            |o| Some(facts::node_removed(o)),
        ),
        watch(
            Api::<NodeGroup>::all(c()),
            "NodeGroup",
            |o| Some(facts::node_group(o)),
            |o| Some(facts::node_group_removed(o)),
        ),
        module_settings(
            c(),
            version,
            platform.clone(),
            PLATFORM_EVERY,
            options.without_module_config,
        ),
        watch(
            Api::<GPUClass>::all(c()),
            "GPUClass",
            |o| Some(facts::gpu_class(o)),
            |o| Some(facts::gpu_class_removed(o)),
        ),
        watch(
            Api::<PhysicalGPU>::all(c()),
            "PhysicalGPU",
            |o| Some(facts::physical_gpu(o)),
            |o| Some(facts::physical_gpu_removed(o)),
        ),
        watch(
            Api::<Pod>::all(c()),
            "Pod",
            |o| Some(facts::pod(o)),
            |o| Some(facts::pod_removed(o)),
        ),
        watch(
            Api::<Deployment>::all(c()),
            "Deployment",
            |o| Some(facts::deployment(o)),
            |o| Some(facts::workload_removed(&o.metadata, "Deployment")),
        ),
        watch(
            Api::<StatefulSet>::all(c()),
            "StatefulSet",
            |o| Some(facts::stateful_set(o)),
            |o| Some(facts::workload_removed(&o.metadata, "StatefulSet")),
        ),
        watch(
            Api::<DaemonSet>::all(c()),
            "DaemonSet",
            |o| Some(facts::daemon_set(o)),
            |o| Some(facts::workload_removed(&o.metadata, "DaemonSet")),
        ),
        watch(
            Api::<Job>::all(c()),
            "Job",
            |o| Some(facts::job(o)),
            |o| Some(facts::workload_removed(&o.metadata, "Job")),
        ),
        watch(
            Api::<CronJob>::all(c()),
            "CronJob",
            |o| Some(facts::cron_job(o)),
            |o| Some(facts::workload_removed(&o.metadata, "CronJob")),
        ),
        watch(
            Api::<ResourceQuota>::all(c()),
            "ResourceQuota",
            |o| Some(facts::resource_quota(o)),
            |_| None,
        ),
    ];
    if dra_api {
        streams.push(watch(
            Api::<ResourceSlice>::all(c()),
            "ResourceSlice",
            |o| Some(facts::resource_slice(o)),
            |o| Some(facts::resource_slice_removed(o)),
        ));
        streams.push(watch(
            Api::<DeviceClass>::all(c()),
            "DeviceClass",
            |o| Some(facts::device_class(o)),
            |o| Some(facts::device_class_removed(o)),
        ));
        streams.push(watch(
            Api::<ResourceClaim>::all(c()),
            "ResourceClaim",
            |o| Some(facts::resource_claim(o)),
            |o| Some(facts::resource_claim_removed(o)),
        ));
    }
    futures::stream::select_all(streams)
}

/// Rebuilds what inventory reported from its own records in the log.
pub async fn rebuild(log: &Arc<dyn EventLog>) -> Result<Reported, LogError> {
    let mut reported = Reported::default();
    switchyard_eventlog::replay(log.as_ref(), 0, |stored| {
        if stored.envelope.actor == INVENTORY.as_str()
            && let switchyard_eventlog::Decoded::Event(event) = stored.decode()
        {
            reported.observe(event);
        }
    })
    .await?;
    Ok(reported)
}

/// Runs inventory until the watch streams end (they do not) or the log fails.
/// `appended` is told the log sequence of every fact appended.
pub async fn run(
    client: Client,
    log: Arc<dyn EventLog>,
    options: InventoryOptions,
    appended: Option<tokio::sync::mpsc::UnboundedSender<u64>>,
) -> Result<(), LogError> {
    let mut reported = rebuild(&log).await?;
    // Reading what the others append keeps the log's knowledge of each
    // subject's head fresh: the stack-assigner writes on the node subjects
    // too, and an append chained to a stale head is refused and tried again.
    let mut others = log.follow(None, log.last_sequence(None).await? + 1).await?;
    tokio::spawn(async move {
        while let Some(record) = others.next().await {
            if let Err(e) = record {
                tracing::warn!(error = %e, "following the log for its heads stopped");
                return;
            }
        }
    });
    let platform = Platform::read(&client).await;
    tracing::info!(
        dra_api = platform.dra_api_served,
        kubernetes = platform.kubernetes_version,
        gates = ?platform.feature_gates,
        "inventory watching"
    );
    let mut seen = Box::pin(watchers(&client, &options, &platform));
    while let Some(first) = seen.next().await {
        // Take whatever else is ready too, and append it in one go.
        let mut news = reported.handle(first);
        while let Some(Some(more)) = seen.next().now_or_never() {
            news.extend(reported.handle(more));
            if news.len() >= switchyard_eventlog::MAX_BATCH_EVENTS {
                break;
            }
        }
        if news.is_empty() {
            continue;
        }
        let appending = now_nanos();
        let sequences = append_facts(log.as_ref(), INVENTORY, &news, appending).await?;
        // How long the facts took to reach the log, for the benchmarks.
        tracing::debug!(
            target: "switchyard_runtime::reaction",
            facts = news.len(),
            appending_us = (now_nanos() - appending) / 1000,
            "appended facts"
        );
        if let Some(tx) = &appended {
            for seq in sequences {
                let _ = tx.send(seq);
            }
        }
    }
    Ok(())
}
