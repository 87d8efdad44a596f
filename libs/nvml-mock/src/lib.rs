//! A mock NVML: a `libnvidia-ml.so.1` that reports the machine a fixture
//! describes (`deploy/fixtures/`), so that NVML's users — the node agent's
//! `--gpu-source nvml`, NVIDIA's device plugin and GPU Feature Discovery —
//! run without a GPU, the way NVIDIA's CI runs on its mock NVML.
//!
//! ```text
//! cargo build -p switchyard-nvml-mock
//! mkdir -p /tmp/nvml && ln -sf $CARGO_TARGET_DIR/debug/libswitchyard_nvml_mock.so /tmp/nvml/libnvidia-ml.so.1
//! SWITCHYARD_NVML_MOCK_MACHINE=deploy/fixtures/a100-8x-mig.yaml LD_LIBRARY_PATH=/tmp/nvml \
//!     switchyard-node-agent discover --gpu-source nvml --node n1
//! ```
//!
//! # The machine
//!
//! `SWITCHYARD_NVML_MOCK_MACHINE` names the fixture. It is read at the first
//! `nvmlInit_v2` (or `nvmlInitWithFlags`) that succeeds and kept for the
//! process's life, so that handles stay valid across `nvmlShutdown`. The
//! fixture is loaded and checked by `switchyard_gpu::Fixture::load`, then
//! held to what NVML can report ([`machine::MockMachine::from_fixture`]):
//! cards listed in index order from 0; brands and architectures by the names
//! nvml-wrapper gives them (`Nvidia`, `Ampere`); `pciBusId` as NVML writes
//! it; MIG devices in slots 0-6, listed in order, each profile named as its
//! memory's share of the card names it (`1g.5gb` for 4864 MiB of 40960).
//! Refused, `nvmlInit` prints the reason, naming the field, to stderr and
//! returns `NVML_ERROR_UNINITIALIZED`; with the variable unset it returns
//! `NVML_ERROR_DRIVER_NOT_LOADED`, as on a node without NVIDIA's driver.
//!
//! What the fixture does not say is made up: all memory is free; a card's
//! minor number is its index; `pciDeviceId` is NVIDIA's vendor id with device
//! id 0; a MIG device's GPU instance id is its slot and its compute instance
//! id 0. A MIG device answers its own UUID, name (`<card> MIG <profile>`),
//! memory, attributes and instance ids, and its card's brand, architecture,
//! compute capability, PCI info and minor number; asked a card's own
//! questions (index, MIG mode, events) it answers `NVML_ERROR_NOT_SUPPORTED`,
//! as a card does asked for attributes or instance ids (NVML answers those
//! for MIG devices only).
//!
//! Each MIG device is a GPU instance (`nvmlDeviceGetGpuInstanceById` on its
//! card, by its GPU instance id) holding one compute instance that spans it
//! (`nvmlGpuInstanceGetComputeInstanceById`, id 0), so that go-nvlib names
//! its profile as GPU Feature Discovery and NVIDIA's device plugin do with
//! the mixed MIG strategy. Profiles are a seven-slice card's (an A100's or
//! an H100's): GPU instance profiles 1g, 2g, 3g, 4g and 7g with NVML's ids
//! 19, 14, 9, 5 and 0, compute instance profiles of as many slices. A card
//! answers `nvmlDeviceGetGpuInstanceProfileInfo` only for the profiles its
//! MIG devices have, with the first such device's attributes and memory
//! (others are `NVML_ERROR_NOT_SUPPORTED`: the fixture does not describe
//! them), and a GPU instance `nvmlGpuInstanceGetComputeInstanceProfileInfo`
//! only for the profile spanning it. The fixture places no instances: a GPU
//! instance's placement is zeros.
//!
//! The topology is made up from the PCI bus ids, as a two-socket server
//! numbers its buses: in each domain, buses 0x00-0x7F behind the first CPU,
//! 0x80-0xFF behind the second. `nvmlDeviceGetTopologyCommonAncestor` answers
//! `NVML_TOPOLOGY_NODE` for two cards behind one CPU,
//! `NVML_TOPOLOGY_SYSTEM` across CPUs and `NVML_TOPOLOGY_INTERNAL` for a
//! card and itself ([`machine::common_ancestor`]). No card has NVLinks: each
//! link's state and remote PCI info answer `NVML_ERROR_NOT_SUPPORTED`, as on
//! PCIe cards (NVIDIA's device plugin reads that as no link when it picks
//! the cards of a preferred allocation).
//!
//! # Health
//!
//! A card the fixture has `healthy: false` is told to each event set that
//! registers for critical XIDs on it, first, as XID 79 — so that the health
//! watch reaches the fixture's state.
//!
//! # Faults
//!
//! `SWITCHYARD_NVML_MOCK_FAULTS` names a file of faults to inject while the
//! library runs. The library reads what was appended since its last reading
//! at every call after `nvmlInit` and, while `nvmlEventSetWait_v2` waits,
//! every 50 ms; each complete line is applied once, in order (a line still
//! without its newline waits). The file need not exist yet; one that shrinks
//! was written anew and is read from its start. One fault a line:
//!
//! ```text
//! # comments and blank lines are skipped
//! xid GPU-9676c907-8332-56e5-bf73-675c0a4cb81a 79
//! ecc GPU-9676c907-8332-56e5-bf73-675c0a4cb81a
//! lost GPU-54a67ad4-f823-59b1-b15c-b76d6749c2e1
//! ```
//!
//! - `xid <uuid> <n>`: a critical XID error: each event set registered for
//!   `nvmlEventTypeXidCriticalError` on the card gets an event with
//!   `eventData` n. A MIG device's UUID makes it an event on its card with the
//!   MIG device's GPU and compute instance ids (else both are 0xFFFFFFFF).
//! - `ecc <uuid>`: a double-bit ECC error, `nvmlEventTypeDoubleBitEccError`,
//!   to the sets registered for it.
//! - `lost <uuid>`: the card fell off the bus: each event set registered on it
//!   gets `NVML_ERROR_GPU_IS_LOST` from `nvmlEventSetWait_v2` once, and from
//!   then on every call on the card's handles, or for them (by index, by
//!   UUID), returns `NVML_ERROR_GPU_IS_LOST`.
//!
//! As with NVML, an event happens to the sets registered at the time: a
//! fault read before a set registers is not told to it. A line that does not
//! parse or names no device is reported on stderr and skipped.

pub mod faults;
mod ffi;
pub mod machine;
mod state;

use std::path::{Path, PathBuf};

use nvml_wrapper_sys::bindings as sys;

use faults::FaultFile;
use machine::MockMachine;
use state::Refusal;

/// The variable naming the fixture the library reports.
pub const MACHINE_ENV: &str = "SWITCHYARD_NVML_MOCK_MACHINE";
/// The variable naming the fault file.
pub const FAULTS_ENV: &str = "SWITCHYARD_NVML_MOCK_FAULTS";
/// The name NVML's users load the library by.
pub const SONAME: &str = "libnvidia-ml.so.1";

/// The machine and fault file the environment names, for the first
/// `nvmlInit`.
fn load_from_env() -> Result<(MockMachine, Option<FaultFile>), Refusal> {
    let Some(path) = std::env::var_os(MACHINE_ENV).filter(|p| !p.is_empty()) else {
        return Err(Refusal {
            code: sys::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED,
            reason: format!(
                "{MACHINE_ENV} is not set; it names the fixture (a YAML machine, see deploy/fixtures/) this mock NVML reports"
            ),
        });
    };
    let refused = |reason: String| Refusal {
        code: sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED,
        reason,
    };
    let path = Path::new(&path);
    let fixture = switchyard_gpu::Fixture::load(path).map_err(|e| refused(e.to_string()))?;
    let machine =
        switchyard_gpu::GpuSource::machine(&fixture).map_err(|e| refused(e.to_string()))?;
    let machine = MockMachine::from_fixture(&machine)
        .map_err(|reason| refused(format!("fixture {}: {reason}", path.display())))?;
    let faults = std::env::var_os(FAULTS_ENV)
        .filter(|p| !p.is_empty())
        .map(|p| FaultFile::new(PathBuf::from(p)));
    Ok((machine, faults))
}
