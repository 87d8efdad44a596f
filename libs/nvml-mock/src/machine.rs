//! The fixture as NVML answers it: every value a call returns, worked out
//! once when the library initialises, and the checks that refuse a fixture
//! NVML could not have reported (one that would not read back equal through
//! `switchyard_gpu::nvml`).

use std::collections::BTreeSet;

use nvml_wrapper_sys::bindings as sys;
use switchyard_gpu::{Gpu, Machine, MigDevice};

/// The MIG devices a MIG-capable card has room for
/// (`nvmlDeviceGetMaxMigDeviceCount`): seven GPU instances, as on an A100 or
/// an H100.
pub const MIG_SLOTS: u32 = 7;

/// `nvmlPciInfo_t.pciDeviceId` holds the vendor in its low half; the fixture
/// names no device id, so the high half is 0.
pub const NVIDIA_PCI_VENDOR: u32 = 0x10de;

/// NVML's brands (`nvmlBrandType_t`) by the name nvml-wrapper's `Brand`
/// prints with `{:?}`, which is what a fixture's `brand` holds. `VGaming` is
/// left out: it has CloudGaming's value and reads back as `CloudGaming`.
pub const BRANDS: [(&str, sys::nvmlBrandType_t); 17] = [
    ("Unknown", sys::nvmlBrandType_enum_NVML_BRAND_UNKNOWN),
    ("Quadro", sys::nvmlBrandType_enum_NVML_BRAND_QUADRO),
    ("Tesla", sys::nvmlBrandType_enum_NVML_BRAND_TESLA),
    ("NVS", sys::nvmlBrandType_enum_NVML_BRAND_NVS),
    ("GRID", sys::nvmlBrandType_enum_NVML_BRAND_GRID),
    ("GeForce", sys::nvmlBrandType_enum_NVML_BRAND_GEFORCE),
    ("Titan", sys::nvmlBrandType_enum_NVML_BRAND_TITAN),
    ("VApps", sys::nvmlBrandType_enum_NVML_BRAND_NVIDIA_VAPPS),
    ("VPC", sys::nvmlBrandType_enum_NVML_BRAND_NVIDIA_VPC),
    ("VCS", sys::nvmlBrandType_enum_NVML_BRAND_NVIDIA_VCS),
    ("VWS", sys::nvmlBrandType_enum_NVML_BRAND_NVIDIA_VWS),
    (
        "CloudGaming",
        sys::nvmlBrandType_enum_NVML_BRAND_NVIDIA_CLOUD_GAMING,
    ),
    ("QuadroRTX", sys::nvmlBrandType_enum_NVML_BRAND_QUADRO_RTX),
    ("NvidiaRTX", sys::nvmlBrandType_enum_NVML_BRAND_NVIDIA_RTX),
    ("Nvidia", sys::nvmlBrandType_enum_NVML_BRAND_NVIDIA),
    ("GeForceRTX", sys::nvmlBrandType_enum_NVML_BRAND_GEFORCE_RTX),
    ("TitanRTX", sys::nvmlBrandType_enum_NVML_BRAND_TITAN_RTX),
];

/// NVML's architectures (`nvmlDeviceArchitecture_t`) by the name
/// nvml-wrapper's `DeviceArchitecture` displays, a fixture's `architecture`.
pub const ARCHITECTURES: [(&str, sys::nvmlDeviceArchitecture_t); 10] = [
    ("Kepler", sys::NVML_DEVICE_ARCH_KEPLER),
    ("Maxwell", sys::NVML_DEVICE_ARCH_MAXWELL),
    ("Pascal", sys::NVML_DEVICE_ARCH_PASCAL),
    ("Volta", sys::NVML_DEVICE_ARCH_VOLTA),
    ("Turing", sys::NVML_DEVICE_ARCH_TURING),
    ("Ampere", sys::NVML_DEVICE_ARCH_AMPERE),
    ("Ada", sys::NVML_DEVICE_ARCH_ADA),
    ("Hopper", sys::NVML_DEVICE_ARCH_HOPPER),
    ("Blackwell", sys::NVML_DEVICE_ARCH_BLACKWELL),
    ("Unknown", sys::NVML_DEVICE_ARCH_UNKNOWN),
];

/// The longest string NVML's callers make room for: UUIDs and names are
/// read into buffers of `NVML_DEVICE_UUID_V2_BUFFER_SIZE` and
/// `NVML_DEVICE_NAME_V2_BUFFER_SIZE` bytes, the terminating NUL included.
const STRING_MAX: usize = sys::NVML_DEVICE_UUID_V2_BUFFER_SIZE as usize - 1;

/// A machine as the mock NVML reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MockMachine {
    /// `nvmlSystemGetDriverVersion`.
    pub driver_version: String,
    /// `nvmlSystemGetCudaDriverVersion`: `12.4` → 12040.
    pub cuda_driver_version: i32,
    /// By NVML index.
    pub cards: Vec<Card>,
}

/// One card.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Card {
    pub uuid: String,
    pub name: String,
    pub brand: sys::nvmlBrandType_t,
    pub architecture: sys::nvmlDeviceArchitecture_t,
    /// (major, minor).
    pub compute_capability: (i32, i32),
    pub memory_mib: u64,
    pub pci: Pci,
    pub mig: Mig,
    /// `healthy: false` in the fixture: an event set that registers for
    /// critical XIDs on the card is told [`UNHEALTHY_XID`] first.
    pub unhealthy: bool,
}

/// The XID an event set is told for a card the fixture has unhealthy
/// (79: the GPU has fallen off the bus).
pub const UNHEALTHY_XID: u64 = 79;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pci {
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    /// `%08X:%02X:%02X.0`, as the fixture has it.
    pub bus_id: String,
    /// `%04X:%02X:%02X.0`.
    pub bus_id_legacy: String,
}

impl Pci {
    /// The host bridges the card hangs off, as a two-socket server numbers
    /// its buses: in each PCI domain, buses 0x00-0x7F behind the first CPU's
    /// root ports, 0x80-0xFF behind the second's (the fixtures' HGX machines
    /// have cards 0-3 on one side and 4-7 on the other). The fixture names no
    /// CPUs; this is what [`common_ancestor`] answers from.
    pub fn host_bridges(&self) -> (u32, bool) {
        (self.domain, self.bus >= 0x80)
    }
}

/// `nvmlDeviceGetTopologyCommonAncestor` between two cards:
/// `NVML_TOPOLOGY_INTERNAL` for a card and itself, `NVML_TOPOLOGY_NODE` for
/// cards behind the same CPU's host bridges ([`Pci::host_bridges`]),
/// `NVML_TOPOLOGY_SYSTEM` across CPUs. No PCIe switches are made up, so
/// nothing is nearer than the CPU (`SINGLE`, `MULTIPLE`, `HOSTBRIDGE` are
/// never answered).
pub fn common_ancestor(a: &Card, b: &Card) -> sys::nvmlGpuTopologyLevel_t {
    if a.uuid == b.uuid {
        sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_INTERNAL
    } else if a.pci.host_bridges() == b.pci.host_bridges() {
        sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_NODE
    } else {
        sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_SYSTEM
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mig {
    /// Not MIG capable: MIG calls answer `NVML_ERROR_NOT_SUPPORTED`.
    Unsupported,
    /// MIG capable, MIG mode off: no MIG devices.
    Disabled,
    /// MIG mode on: [`MIG_SLOTS`] slots, some holding a MIG device.
    Enabled(Vec<Option<MigSlot>>),
}

/// A MIG device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigSlot {
    pub uuid: String,
    /// The card's name and the profile: `NVIDIA A100-SXM4-40GB MIG 1g.5gb`.
    pub name: String,
    /// The GPU instance's id: the slot's index (the fixture places no
    /// instances).
    pub gpu_instance_id: u32,
    /// The compute instance's id in its GPU instance: 0, the one compute
    /// instance spanning it.
    pub compute_instance_id: u32,
    pub attributes: Attributes,
}

/// A GPU instance profile of a seven-slice card (an A100 or an H100), as
/// NVML numbers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuInstanceProfile {
    /// What callers ask `nvmlDeviceGetGpuInstanceProfileInfo` for:
    /// `NVML_GPU_INSTANCE_PROFILE_<n>_SLICE`.
    pub index: u32,
    /// The id NVML gives it (`nvidia-smi mig -lgip`'s ID), in its profile
    /// info and its instances' info.
    pub id: u32,
    /// How many instances of it the card holds.
    pub instances: u32,
}

/// The GPU instance profile of `slices` slices: 1g, 2g, 3g, 4g or 7g with
/// the ids an A100 or an H100 gives them (19, 14, 9, 5, 0); none for 5 or 6
/// slices, which no seven-slice card has.
pub fn gpu_instance_profile(slices: u32) -> Option<GpuInstanceProfile> {
    let (index, id, instances) = match slices {
        1 => (sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, 7),
        2 => (sys::NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, 3),
        3 => (sys::NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, 2),
        4 => (sys::NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, 1),
        7 => (sys::NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, 1),
        _ => return None,
    };
    Some(GpuInstanceProfile {
        index,
        id,
        instances,
    })
}

/// The compute instance profile of `slices` slices,
/// `NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE`, which is also its id; none
/// where no GPU instance profile has that many slices.
pub fn compute_instance_profile(slices: u32) -> Option<u32> {
    Some(match slices {
        1 => sys::NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
        2 => sys::NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
        3 => sys::NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
        4 => sys::NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
        7 => sys::NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
        _ => return None,
    })
}

/// `nvmlDeviceAttributes_t` of a MIG device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attributes {
    pub multiprocessors: u32,
    pub copy_engines: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpeg_engines: u32,
    pub ofa_engines: u32,
    /// The profile's leading number: `3g.20gb` → 3.
    pub gpu_instance_slices: u32,
    /// The compute instance spans its GPU instance.
    pub compute_instance_slices: u32,
    pub memory_mib: u64,
}

impl MockMachine {
    /// The machine a fixture describes, or why NVML could not report it,
    /// naming the field (`gpus[1].brand: …`).
    pub fn from_fixture(machine: &Machine) -> Result<MockMachine, String> {
        let cuda_driver_version = cuda_version(&machine.cuda_driver_version).ok_or_else(|| {
            format!(
                "cudaDriverVersion: {:?} is not MAJOR.MINOR as NVML reports it (e.g. 12.4)",
                machine.cuda_driver_version
            )
        })?;
        let mut uuids = BTreeSet::new();
        let cards = machine
            .gpus
            .iter()
            .enumerate()
            .map(|(i, gpu)| card(i, gpu, &mut uuids))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(MockMachine {
            driver_version: c_string("driverVersion", &machine.driver_version)?,
            cuda_driver_version,
            cards,
        })
    }

    /// `nvmlSystemGetNVMLVersion`: the CUDA major version and the driver's,
    /// `12.550.54.15`.
    pub fn nvml_version(&self) -> String {
        format!(
            "{}.{}",
            self.cuda_driver_version / 1000,
            self.driver_version
        )
    }
}

fn card(i: usize, gpu: &Gpu, uuids: &mut BTreeSet<String>) -> Result<Card, String> {
    let field = |name: &str| format!("gpus[{i}].{name}");
    if usize::try_from(gpu.index) != Ok(i) {
        return Err(format!(
            "{}: {}, but NVML numbers cards 0, 1, 2, … as listed, so this card is {i}",
            field("index"),
            gpu.index
        ));
    }
    unique(&field("uuid"), &gpu.uuid, uuids)?;
    let brand = lookup(&BRANDS, &gpu.brand)
        .ok_or_else(|| not_one_of(&field("brand"), &gpu.brand, &BRANDS))?;
    let architecture = lookup(&ARCHITECTURES, &gpu.architecture)
        .ok_or_else(|| not_one_of(&field("architecture"), &gpu.architecture, &ARCHITECTURES))?;
    let compute_capability = compute_capability(&gpu.compute_capability).ok_or_else(|| {
        format!(
            "{}: {:?} is not MAJOR.MINOR (e.g. 8.0)",
            field("computeCapability"),
            gpu.compute_capability
        )
    })?;
    if gpu.memory_mib == 0 || gpu.memory_mib.checked_mul(1 << 20).is_none() {
        return Err(format!(
            "{}: {} MiB is no card's memory",
            field("memoryMiB"),
            gpu.memory_mib
        ));
    }
    let pci = pci(&gpu.pci_bus_id).ok_or_else(|| {
        format!(
            "{}: {:?} is not DOMAIN:BUS:DEVICE.0 as NVML writes it (%08X:%02X:%02X.0, e.g. 00000000:07:00.0)",
            field("pciBusId"),
            gpu.pci_bus_id
        )
    })?;
    let name = c_string(&field("productName"), &gpu.product_name)?;
    let mig = match (gpu.mig_capable, gpu.mig_enabled) {
        (false, false) if gpu.mig_devices.is_empty() => Mig::Unsupported,
        (true, false) if gpu.mig_devices.is_empty() => Mig::Disabled,
        (true, true) => Mig::Enabled(mig_slots(i, gpu, uuids)?),
        (false, _) => {
            return Err(format!(
                "{}: MIG mode or MIG devices on a card that is not migCapable",
                field("migCapable")
            ));
        }
        (true, false) => {
            return Err(format!(
                "{}: MIG devices on a card whose migEnabled is false",
                field("migDevices")
            ));
        }
    };
    Ok(Card {
        uuid: c_string(&field("uuid"), &gpu.uuid)?,
        name,
        brand,
        architecture,
        compute_capability,
        memory_mib: gpu.memory_mib,
        pci,
        mig,
        unhealthy: !gpu.healthy,
    })
}

fn mig_slots(
    i: usize,
    gpu: &Gpu,
    uuids: &mut BTreeSet<String>,
) -> Result<Vec<Option<MigSlot>>, String> {
    let mut slots: Vec<Option<MigSlot>> = vec![None; MIG_SLOTS as usize];
    let mut previous = None;
    for (j, mig) in gpu.mig_devices.iter().enumerate() {
        let field = |name: &str| format!("gpus[{i}].migDevices[{j}].{name}");
        if mig.index >= MIG_SLOTS {
            return Err(format!(
                "{}: {} is past the card's {MIG_SLOTS} MIG slots (0-{})",
                field("index"),
                mig.index,
                MIG_SLOTS - 1
            ));
        }
        if previous.is_some_and(|p| mig.index <= p) {
            return Err(format!(
                "{}: {} after {}: NVML lists a card's MIG devices by index, once each, so list them in that order",
                field("index"),
                mig.index,
                previous.unwrap_or_default()
            ));
        }
        previous = Some(mig.index);
        unique(&field("uuid"), &mig.uuid, uuids)?;
        slots[mig.index as usize] = Some(mig_slot(&field, mig, gpu)?);
    }
    Ok(slots)
}

fn mig_slot(field: &dyn Fn(&str) -> String, mig: &MigDevice, gpu: &Gpu) -> Result<MigSlot, String> {
    let slices = switchyard_gpu::publish::profile_parts(&mig.profile)
        .map(|(slices, _)| slices)
        .filter(|slices| (1..=MIG_SLOTS).contains(slices))
        .ok_or_else(|| {
            format!(
                "{}: {:?} is not a MIG profile of 1 to {MIG_SLOTS} slices such as 1g.5gb",
                field("profile"),
                mig.profile
            )
        })?;
    if mig.memory_mib == 0 || mig.memory_mib > gpu.memory_mib {
        return Err(format!(
            "{}: {} MiB does not fit the card's {} MiB",
            field("memoryMiB"),
            mig.memory_mib,
            gpu.memory_mib
        ));
    }
    let named = switchyard_gpu::nvml::profile(slices, mig.memory_mib, gpu.memory_mib);
    if named != mig.profile {
        return Err(format!(
            "{}: {:?}, but NVML's {} MiB of a {} MiB card is named {named:?}",
            field("profile"),
            mig.profile,
            mig.memory_mib,
            gpu.memory_mib
        ));
    }
    Ok(MigSlot {
        uuid: c_string(&field("uuid"), &mig.uuid)?,
        name: c_string(
            &field("profile"),
            &format!("{} MIG {}", gpu.product_name, mig.profile),
        )?,
        gpu_instance_id: mig.index,
        compute_instance_id: 0,
        attributes: Attributes {
            multiprocessors: mig.multiprocessors,
            copy_engines: mig.copy_engines,
            decoders: mig.decoders,
            encoders: mig.encoders,
            jpeg_engines: mig.jpeg_engines,
            ofa_engines: mig.ofa_engines,
            gpu_instance_slices: slices,
            compute_instance_slices: slices,
            memory_mib: mig.memory_mib,
        },
    })
}

fn unique(field: &str, uuid: &str, uuids: &mut BTreeSet<String>) -> Result<(), String> {
    if uuids.insert(uuid.to_string()) {
        Ok(())
    } else {
        Err(format!(
            "{field}: {uuid} appears twice; NVML's UUIDs name one device each"
        ))
    }
}

fn lookup<T: Copy>(table: &[(&str, T)], name: &str) -> Option<T> {
    table.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

fn not_one_of<T>(field: &str, value: &str, table: &[(&str, T)]) -> String {
    let names: Vec<&str> = table.iter().map(|(n, _)| *n).collect();
    format!(
        "{field}: {value:?} is not a value NVML reports (as nvml-wrapper names them: {})",
        names.join(", ")
    )
}

/// A string NVML's callers can read: no NUL inside, room in their buffers.
fn c_string(field: &str, value: &str) -> Result<String, String> {
    if value.contains('\0') {
        return Err(format!("{field}: {value:?} holds a NUL byte"));
    }
    if value.len() > STRING_MAX {
        return Err(format!(
            "{field}: {} bytes; NVML's callers make room for {STRING_MAX}",
            value.len()
        ));
    }
    Ok(value.to_string())
}

/// `MAJOR.MINOR` as two numbers that print back the same.
fn major_minor(value: &str) -> Option<(i32, i32)> {
    let (major, minor) = value.split_once('.')?;
    let parsed = (major.parse().ok()?, minor.parse().ok()?);
    (format!("{}.{}", parsed.0, parsed.1) == value && parsed.0 >= 0 && parsed.1 >= 0)
        .then_some(parsed)
}

fn compute_capability(value: &str) -> Option<(i32, i32)> {
    major_minor(value)
}

/// CUDA's version number: `12.4` → 12040 (major × 1000 + minor × 10).
fn cuda_version(value: &str) -> Option<i32> {
    let (major, minor) = major_minor(value)?;
    (minor < 100)
        .then(|| major.checked_mul(1000)?.checked_add(minor * 10))
        .flatten()
}

fn pci(bus_id: &str) -> Option<Pci> {
    let (domain, rest) = bus_id.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (device, function) = rest.split_once('.')?;
    if function != "0" {
        return None;
    }
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let bus = u32::from_str_radix(bus, 16).ok()?;
    let device = u32::from_str_radix(device, 16).ok()?;
    let canonical = format!("{domain:08X}:{bus:02X}:{device:02X}.0");
    // The legacy id keeps four digits of the domain: the low 16 bits.
    (canonical == bus_id && bus <= 0xff && device <= 0x1f).then(|| Pci {
        domain,
        bus,
        device,
        bus_id: canonical,
        bus_id_legacy: format!("{:04X}:{bus:02X}:{device:02X}.0", domain & 0xffff),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Machine {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../deploy/fixtures")
            .join(name);
        switchyard_gpu::GpuSource::machine(&switchyard_gpu::Fixture::load(&path).unwrap()).unwrap()
    }

    #[test]
    fn the_fixtures_are_machines_nvml_can_report() {
        for name in ["h100-8x.yaml", "a100-8x-mig.yaml", "mixed.yaml"] {
            let machine = fixture(name);
            let mock =
                MockMachine::from_fixture(&machine).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(mock.cards.len(), machine.gpus.len());
        }
        let mixed = MockMachine::from_fixture(&fixture("mixed.yaml")).unwrap();
        assert_eq!(mixed.cuda_driver_version, 12020);
        assert_eq!(mixed.nvml_version(), "12.535.161.08");
        assert!(mixed.cards[3].unhealthy);
        let Mig::Enabled(slots) = &mixed.cards[0].mig else {
            panic!("card 0 is in MIG mode");
        };
        let seven = slots[0].as_ref().unwrap();
        assert_eq!(seven.name, "NVIDIA A100-SXM4-40GB MIG 7g.40gb");
        assert_eq!(seven.attributes.gpu_instance_slices, 7);
        assert_eq!(mixed.cards[2].mig, Mig::Unsupported);
        assert_eq!(mixed.cards[1].mig, Mig::Disabled);
        assert_eq!(mixed.cards[1].pci.bus_id_legacy, "0000:0F:00.0");
        assert_eq!(mixed.cards[1].pci.bus, 0x0f);
    }

    #[test]
    fn cards_behind_one_cpu_share_a_numa_node_and_others_meet_at_the_system() {
        let h100 = MockMachine::from_fixture(&fixture("h100-8x.yaml")).unwrap();
        let level = |a: usize, b: usize| common_ancestor(&h100.cards[a], &h100.cards[b]);
        assert_eq!(level(2, 2), sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_INTERNAL);
        // Buses 07, 0F, 47, 4E | 87, 90, B7, BD.
        for (a, b) in [(0, 1), (0, 3), (4, 7), (6, 5)] {
            assert_eq!(
                level(a, b),
                sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_NODE,
                "{a}-{b}"
            );
        }
        for (a, b) in [(0, 4), (3, 4), (7, 0)] {
            assert_eq!(
                level(a, b),
                sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_SYSTEM,
                "{a}-{b}"
            );
        }
        // Another PCI domain is another CPU's, whatever the bus.
        let mut far = h100.cards[1].clone();
        far.uuid.push('x');
        far.pci.domain = 1;
        assert_eq!(
            common_ancestor(&h100.cards[0], &far),
            sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_SYSTEM
        );
    }

    #[test]
    fn what_nvml_could_not_report_is_refused_naming_the_field() {
        let refused = |edit: &dyn Fn(&mut Machine)| {
            let mut machine = fixture("a100-8x-mig.yaml");
            edit(&mut machine);
            MockMachine::from_fixture(&machine).unwrap_err()
        };
        type Edit = dyn Fn(&mut Machine);
        let cases: [(&Edit, &str); 9] = [
            (&|m| m.gpus[2].index = 5, "gpus[2].index: 5"),
            (&|m| m.gpus[1].brand = "NVIDIA".into(), "gpus[1].brand"),
            (
                &|m| m.gpus[1].architecture = "Lovelace".into(),
                "gpus[1].architecture",
            ),
            (
                &|m| m.gpus[4].pci_bus_id = "0000:87:00.0".into(),
                "gpus[4].pciBusId",
            ),
            (
                &|m| m.gpus[4].compute_capability = "8".into(),
                "gpus[4].computeCapability",
            ),
            (
                &|m| m.cuda_driver_version = "12.04".into(),
                "cudaDriverVersion",
            ),
            (
                &|m| m.gpus[0].mig_devices[3].profile = "1g.10gb".into(),
                "gpus[0].migDevices[3].profile",
            ),
            (
                &|m| m.gpus[1].mig_devices[1].index = 0,
                "gpus[1].migDevices[1].index: 0 after 0",
            ),
            (&|m| m.gpus[5].uuid = m.gpus[4].uuid.clone(), "gpus[5].uuid"),
        ];
        for (edit, field) in cases {
            let message = refused(edit);
            assert!(
                message.starts_with(field),
                "{message:?} does not name {field}"
            );
        }
    }

    #[test]
    fn brands_and_architectures_read_back_through_nvml_wrapper() {
        use nvml_wrapper::enum_wrappers::device::Brand;
        use nvml_wrapper::enums::device::DeviceArchitecture;
        for (name, value) in BRANDS {
            assert_eq!(format!("{:?}", Brand::try_from(value).unwrap()), name);
        }
        for (name, value) in ARCHITECTURES {
            assert_eq!(
                DeviceArchitecture::try_from(value).unwrap().to_string(),
                name
            );
        }
    }
}
