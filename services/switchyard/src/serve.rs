//! `switchyard serve <service>`: one service as a process against the cluster
//! (in-cluster config or `KUBECONFIG`) and the JetStream log; and the operator
//! commands that talk to a running service (`handover`, `rollback node`).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, ValueEnum};
use switchyard_eventlog::EventLog;
use switchyard_eventlog::nats::{NatsLog, NatsOptions};
use switchyard_kube::edge::Edge;
use switchyard_kube::host::{self, HostOptions, Progress};
use switchyard_kube::inventory::{self, InventoryOptions};
use switchyard_proto::v1::{CommandReply, ServiceCommand, StartHandoverCommand, service_command};
use switchyard_runtime::service_cores;
use tokio::sync::watch;

use crate::cli::NatsArgs;

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Service {
    Inventory,
    StackAssigner,
    ClassCompiler,
    ClaimAllocator,
    Alerter,
    NodeAgent,
}

impl Service {
    fn name(self) -> &'static str {
        match self {
            Service::Inventory => switchyard_runtime::INVENTORY,
            Service::StackAssigner => switchyard_runtime::STACK_ASSIGNER,
            Service::ClassCompiler => switchyard_runtime::CLASS_COMPILER,
            Service::ClaimAllocator => switchyard_runtime::CLAIM_ALLOCATOR,
            Service::Alerter => switchyard_runtime::ALERTER,
            Service::NodeAgent => switchyard_runtime::NODE_AGENT,
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct Connection {
    /// NATS server URL of the JetStream log, e.g. nats://nats:4222.
    #[arg(long = "nats-url", env = "SWITCHYARD_NATS_URL")]
    pub nats_url: String,
    /// A NATS credentials file (JWT and NKey seed).
    #[arg(long, env = "SWITCHYARD_NATS_CREDS")]
    pub nats_creds: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub nats: NatsArgs,
}

impl Connection {
    async fn client(&self, name: &str) -> anyhow::Result<async_nats::Client> {
        let mut options = async_nats::ConnectOptions::new()
            .name(format!("switchyard-{name}"))
            .retry_on_initial_connect();
        if let Some(creds) = &self.nats_creds {
            options = options
                .credentials_file(creds)
                .await
                .with_context(|| format!("read NATS credentials {}", creds.display()))?;
        }
        options
            .connect(&self.nats_url)
            .await
            .with_context(|| format!("connect to NATS at {}", self.nats_url))
    }

    async fn log(&self, client: async_nats::Client) -> anyhow::Result<Arc<dyn EventLog>> {
        let options = NatsOptions {
            stream: self.nats.stream.clone(),
            subject_prefix: self.nats.subject_prefix.clone(),
            create: true,
            ..NatsOptions::default()
        };
        let log = NatsLog::open(client, options)
            .await
            .with_context(|| format!("open the log on stream {}", self.nats.stream))?;
        Ok(Arc::new(log))
    }
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[arg(value_enum)]
    pub service: Service,
    #[command(flatten)]
    pub connection: Connection,
    /// Serve the gRPC health protocol (grpc.health.v1) here, for probes.
    #[arg(long, env = "SWITCHYARD_HEALTH_LISTEN")]
    pub health_listen: Option<SocketAddr>,
    /// The module version inventory reports with the module settings.
    #[arg(long, env = "SWITCHYARD_MODULE_VERSION", default_value = env!("CARGO_PKG_VERSION"))]
    pub module_version: String,
    /// How often time passes for the core (deadlines).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub tick: std::time::Duration,
    /// How long an issued effect may take to show before it is issued again.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub reissue: std::time::Duration,
    /// How many objects the service writes at once.
    #[arg(long, default_value_t = 16)]
    pub parallel: usize,
    /// The node this process runs on (node-agent; from the downward API).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// node-agent: `nvml`, or `fixture:FILE` (a YAML machine).
    #[arg(long, env = "SWITCHYARD_GPU_SOURCE", default_value = "nvml")]
    pub gpu_source: String,
    /// node-agent: how DRA publishes cards (static, partitionable, shared:N).
    #[arg(long, default_value = "static", value_parser = switchyard_kubelet::run::parse_layout)]
    pub layout: switchyard_gpu::publish::Layout,
    /// node-agent: how the device plugins share cards (exclusive, time-slicing:N, mig).
    #[arg(long, default_value = "exclusive", value_parser = switchyard_kubelet::run::parse_sharing)]
    pub sharing: switchyard_kubelet::deviceplugin::Sharing,
    /// node-agent: kubelet's root directory.
    #[arg(long, default_value = "/var/lib/kubelet")]
    pub kubelet_dir: std::path::PathBuf,
    /// node-agent: where CDI specs go.
    #[arg(long, default_value = "/var/run/cdi")]
    pub cdi_dir: std::path::PathBuf,
}

async fn health(
    listen: SocketAddr,
    service: &'static str,
    mut progress: watch::Receiver<Progress>,
) {
    let (reporter, server) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    tokio::spawn(async move {
        while progress.changed().await.is_ok() {
            if progress.borrow().ready {
                reporter
                    .set_service_status("", tonic_health::ServingStatus::Serving)
                    .await;
                reporter
                    .set_service_status(service, tonic_health::ServingStatus::Serving)
                    .await;
                break;
            }
        }
    });
    if let Err(err) = tonic::transport::Server::builder()
        .add_service(server)
        .serve(listen)
        .await
    {
        tracing::error!(%err, %listen, "the health server stopped");
    }
}

pub async fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let name = args.service.name();
    let config = kube::Config::infer()
        .await
        .context("find the Kubernetes API (in-cluster config or KUBECONFIG)")?;
    let kube = kube::Client::try_from(config.clone()).context("connect to the Kubernetes API")?;
    if args.service == Service::NodeAgent {
        // The node agent talks to kubelet and the API server, not the log.
        let node = args
            .node_name
            .clone()
            .context("node-agent needs --node-name (NODE_NAME from the downward API)")?;
        let (progress, watching) = watch::channel(Progress::default());
        if let Some(listen) = args.health_listen {
            tokio::spawn(health(listen, name, watching));
        }
        tracing::info!(service = name, %node, "starting");
        let options = switchyard_kubelet::run::NodeOptions {
            node,
            gpu_source: args.gpu_source,
            layout: args.layout,
            sharing: args.sharing,
            kubelet_dir: args.kubelet_dir,
            cdi_dir: args.cdi_dir,
        };
        switchyard_kubelet::run::serve_node(kube, options, move || {
            let _ = progress.send(Progress {
                ready: true,
                sequence: 0,
            });
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        return Ok(ExitCode::SUCCESS);
    }
    let nats = args.connection.client(name).await?;
    let log = args.connection.log(nats.clone()).await?;
    let (progress, watching) = watch::channel(Progress::default());
    if let Some(listen) = args.health_listen {
        tokio::spawn(health(listen, name, watching));
    }
    tracing::info!(service = name, "starting");
    match args.service {
        Service::Inventory => {
            let _ = progress.send(Progress {
                ready: true,
                sequence: 0,
            });
            inventory::run(
                kube,
                log,
                InventoryOptions {
                    module_version: args.module_version,
                },
                None,
            )
            .await?;
        }
        _ => {
            let core = service_cores()
                .into_iter()
                .find(|c| c.name() == name)
                .expect("every service but the observers has a core");
            host::run(
                core,
                log,
                Some(Edge::new(config, name)?),
                Some(nats),
                HostOptions {
                    tick: args.tick,
                    reissue: args.reissue,
                    parallel: args.parallel,
                },
                progress,
            )
            .await?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Args, Debug)]
pub struct HandoverArgs {
    /// The node to hand over.
    #[arg(long)]
    pub node: String,
    /// The group to move it to, e.g. gpu-dra.
    #[arg(long)]
    pub to: String,
    /// Id of the handover; default: a new one.
    #[arg(long)]
    pub id: Option<String>,
    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Args, Debug)]
pub struct RollbackNodeArgs {
    /// The node whose last handover to undo.
    #[arg(long)]
    pub node: String,
    #[command(flatten)]
    pub connection: Connection,
}

fn report(reply: CommandReply) -> anyhow::Result<ExitCode> {
    if !reply.error.is_empty() {
        eprintln!("refused: {}", reply.error);
        return Ok(ExitCode::from(1));
    }
    let mut refused = false;
    for decision in &reply.decisions {
        let Some(kind) = &decision.kind else { continue };
        let json = serde_json::to_string(decision).unwrap_or_default();
        println!("{} {json}", kind.type_name());
        refused |= matches!(
            kind,
            switchyard_proto::v1::domain_event::Kind::HandoverRefused(_)
        );
    }
    Ok(if refused {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

pub async fn handover(args: HandoverArgs) -> anyhow::Result<ExitCode> {
    let client = args.connection.client("cli").await?;
    let command = ServiceCommand {
        command: Some(service_command::Command::StartHandover(
            StartHandoverCommand {
                handover_id: args
                    .id
                    .unwrap_or_else(|| format!("handover-{}", uuid::Uuid::new_v4())),
                node: args.node,
                target_group: args.to,
            },
        )),
    };
    report(host::send_command(&client, switchyard_runtime::STACK_ASSIGNER, command).await?)
}

pub async fn rollback_node(args: RollbackNodeArgs) -> anyhow::Result<ExitCode> {
    let client = args.connection.client("cli").await?;
    let log = args.connection.log(client.clone()).await?;
    let mut prefix = Vec::new();
    switchyard_eventlog::replay(log.as_ref(), 0, |stored| {
        if let switchyard_eventlog::Decoded::Event(event) = stored.decode() {
            prefix.push((stored.sequence, event));
        }
    })
    .await?;
    let rollback_id = format!("rollback-{}", uuid::Uuid::new_v4());
    let planned =
        match switchyard_core::rollback::plan_node_rollback(&prefix, &args.node, &rollback_id) {
            Ok(planned) => planned,
            Err(why) => {
                eprintln!("refused: {why}");
                return Ok(ExitCode::from(1));
            }
        };
    let command = ServiceCommand {
        command: Some(service_command::Command::Rollback(planned)),
    };
    report(host::send_command(&client, switchyard_runtime::STACK_ASSIGNER, command).await?)
}
