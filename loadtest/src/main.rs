//! `switchyard-loadtest`: measured figures for the book (docs/benchmarks.md).
//!
//! `switchyard-loadtest eventlog` measures the migration log on this machine in
//! one run and prints JSON: embedded appends (fsync per append and group
//! commit), embedded replay, and JetStream appends through the backend against
//! a bare async-nats publish loop on the same server with the same payload.

#![deny(unsafe_code)]

/// The same allocator as the services (mimalloc). While [`count_bytes`] is on,
/// it also counts the bytes in use, so the size of a data structure can be
/// measured exactly rather than read off the resident set (which also holds
/// freed memory the allocator keeps). Off, it costs one relaxed load per call.
#[global_allocator]
static ALLOCATOR: Counting = Counting;

struct Counting;

static COUNTING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static LIVE_BYTES: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);
static PEAK_BYTES: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);
static ALLOCATED_BYTES: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);

fn count(delta: isize) {
    use std::sync::atomic::Ordering::Relaxed;
    if COUNTING.load(Relaxed) {
        let live = LIVE_BYTES.fetch_add(delta, Relaxed) + delta;
        PEAK_BYTES.fetch_max(live, Relaxed);
        if delta > 0 {
            ALLOCATED_BYTES.fetch_add(delta, Relaxed);
        }
    }
}

// SAFETY: every call is forwarded unchanged to mimalloc; only a counter is added.
#[allow(unsafe_code)]
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        count(layout.size() as isize);
        unsafe { mimalloc::MiMalloc.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        count(-(layout.size() as isize));
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        count(new_size as isize - layout.size() as isize);
        unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
    }
}

/// Turns byte counting on or off.
pub fn count_bytes(on: bool) {
    COUNTING.store(on, std::sync::atomic::Ordering::SeqCst);
}

/// Bytes allocated and not yet freed.
/// (Counted while counting was on; frees of earlier allocations count too.)
pub fn live_bytes() -> isize {
    LIVE_BYTES.load(std::sync::atomic::Ordering::Relaxed)
}

/// The most [`live_bytes`] reached, and the bytes allocated in all (a
/// `realloc`'s growth counted), since [`reset_peak`].
pub fn peak_and_allocated_bytes() -> (isize, isize) {
    use std::sync::atomic::Ordering::Relaxed;
    (PEAK_BYTES.load(Relaxed), ALLOCATED_BYTES.load(Relaxed))
}

/// Starts [`peak_and_allocated_bytes`] over from the bytes live now.
pub fn reset_peak() {
    use std::sync::atomic::Ordering::Relaxed;
    PEAK_BYTES.store(LIVE_BYTES.load(Relaxed), Relaxed);
    ALLOCATED_BYTES.store(0, Relaxed);
}

mod allocate;
mod chart;
mod cores;
mod eventlog;
mod kube;
mod kubelet;
mod migrate;
mod node_agent;
mod nodes;
mod plan;
mod quantity;
mod soak;
mod telemetry;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "switchyard-loadtest",
    about = "Benchmarks and load scenarios for Switchyard"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Event log throughput: embedded append and replay, JetStream vs bare async-nats.
    Eventlog(eventlog::Args),
    /// The decision cores at scale: full assignment, decision latency, handover
    /// waves, replay of a large log, memory per GPU.
    Cores(cores::Args),
    /// The Kubernetes edge on a real control plane: start-up, creation-to-label
    /// latency for many nodes, relabelling a wave.
    Kube(kube::Args),
    /// Kubernetes quantities: ours against k8s.io/apimachinery's, same run.
    Quantity(quantity::Args),
    /// DRA allocation throughput: ours against the Kubernetes structured
    /// allocator on identical inputs (N nodes x 8 A100 with MIG).
    Allocate(allocate::Args),
    /// The DRA kubelet plugin: NodePrepareResources / NodeUnprepareResources
    /// latency over its socket (CDI write and fsynced checkpoint), and memory.
    Kubelet(kubelet::Args),
    /// The node agent as a process on a real control plane: memory with 8
    /// GPUs, and the time to switch stacks.
    NodeAgent(node_agent::Args),
    /// Pod start-up on real nodes (kubelet, containerd, runc): a plain pod,
    /// a DRA claim served by the node agent, nvidia.com/gpu from the agent's
    /// device plugin and from NVIDIA's on the same mock NVML; kubelet's DRA
    /// call times; the agent's memory next to NVIDIA's plugin's.
    Nodes(nodes::Args),
    /// The chart on real nodes: the image's size, its import on each node, a
    /// cold `helm install` until every pod is Ready, each pod's memory.
    Chart(chart::Args),
    /// `switchyard plan` at scale: the register and the waves for N nodes x G
    /// GPUs and W workloads, from the snapshot.
    Plan(plan::Args),
    /// `switchyard migrate --wait` on kwok (N GPU nodes, W workloads): its
    /// wall time, Switchyard's CPU share of it and its own latency against
    /// the time spent waiting on Kubernetes.
    Migrate(migrate::Args),
    /// The fault soak: the reference migration on kwok with a fault in every
    /// step (services, node agents and the waiting CLI killed, nats-server
    /// and kube-apiserver restarted, etcd paused, a junk record), once per
    /// seed: faults survived by kind, kill points by step.
    Soak(soak::Args),
    /// What tracing costs the services' hot path: a service following node
    /// facts, deciding and appending, with and without the OpenTelemetry
    /// layer, in the same run.
    Telemetry(telemetry::Args),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // Quiet unless SWITCHYARD_LOG_LEVEL asks (the in-process services' reactions).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let _telemetry =
        runtime.block_on(async { switchyard_runtime::init_tracing("loadtest", "error") });
    let report = runtime.block_on(match cli.command {
        Command::Eventlog(args) => Box::pin(eventlog::run(args))
            as std::pin::Pin<
                Box<dyn std::future::Future<Output = anyhow::Result<serde_json::Value>>>,
            >,
        Command::Cores(args) => Box::pin(cores::run(args)),
        Command::Kube(args) => Box::pin(kube::run(args)),
        Command::Quantity(args) => Box::pin(quantity::run(args)),
        Command::Allocate(args) => Box::pin(allocate::run(args)),
        Command::Kubelet(args) => Box::pin(kubelet::run(args)),
        Command::NodeAgent(args) => Box::pin(node_agent::run(args)),
        Command::Nodes(args) => Box::pin(nodes::run(args)),
        Command::Chart(args) => Box::pin(chart::run(args)),
        Command::Plan(args) => Box::pin(plan::run(args)),
        Command::Migrate(args) => Box::pin(migrate::run(args)),
        Command::Soak(args) => Box::pin(soak::run(args)),
        Command::Telemetry(args) => Box::pin(telemetry::run(args)),
    })?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

/// The path of a reference program of tools/ (run from the repository root).
/// When nats-server fsyncs JetStream's writes: its default (acknowledged
/// before they reach the disk, fsynced every two minutes) or
/// `sync_interval: always` (fsync before every acknowledgement), as the chart
/// runs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sync {
    Default,
    Always,
}

pub fn oracle(name: &str) -> anyhow::Result<String> {
    switchyard_testkit::oracle(std::path::Path::new("."), name).map_err(anyhow::Error::msg)
}

/// A size field of `/proc/<pid>/status` (`VmRSS:`, `VmHWM:`), in KiB; `pid`
/// may be `self`.
pub fn status_kib(pid: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Resident set size of this process now (VmRSS), in KiB.
pub fn rss_kib() -> Option<u64> {
    status_kib("self", "VmRSS:")
}

/// Peak resident set size of this process (VmHWM), in KiB.
pub fn peak_rss_kib() -> Option<u64> {
    status_kib("self", "VmHWM:")
}
