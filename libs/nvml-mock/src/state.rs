//! The library's state behind the C functions: initialisation counted as
//! NVML counts it, device handles, event sets and the faults applied to
//! them. No FFI here: handles are addresses, answers are values or NVML
//! return codes.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::convert::Infallible;

use nvml_wrapper_sys::bindings as sys;

use crate::faults::{Fault, FaultFile};
use crate::machine::{
    Card, GpuInstanceProfile, Mig, MigSlot, MockMachine, UNHEALTHY_XID, gpu_instance_profile,
};

/// An NVML return code other than `NVML_SUCCESS`.
pub type Code = sys::nvmlReturn_t;

pub const UNINITIALIZED: Code = sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
pub const INVALID_ARGUMENT: Code = sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
pub const NOT_SUPPORTED: Code = sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
pub const NOT_FOUND: Code = sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
pub const GPU_IS_LOST: Code = sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;

/// The events a card supports (`nvmlDeviceGetSupportedEventTypes`): those of
/// a data-center card.
pub const SUPPORTED_EVENTS: u64 = (sys::nvmlEventTypeSingleBitEccError
    | sys::nvmlEventTypeDoubleBitEccError
    | sys::nvmlEventTypePState
    | sys::nvmlEventTypeXidCriticalError
    | sys::nvmlEventTypeClock) as u64;

const XID: u64 = sys::nvmlEventTypeXidCriticalError as u64;
const DOUBLE_BIT_ECC: u64 = sys::nvmlEventTypeDoubleBitEccError as u64;

/// `nvmlEventData_t`'s instance ids of an event not attributed to a MIG
/// device.
pub const NO_INSTANCE: u32 = u32::MAX;

/// What a device handle points to. Its address is the handle, so it is
/// never a zero-sized value and never moves (it lives in a leaked [`Loaded`]).
#[derive(Debug)]
pub struct Handle {
    pub card: usize,
    /// The MIG slot, for a MIG device.
    pub slot: Option<usize>,
}

/// A machine with its handles, loaded once and kept for the process's life,
/// so that handles stay valid across `nvmlShutdown` and a new `nvmlInit`.
/// Each MIG slot has three: the MIG device's, its GPU instance's and its
/// compute instance's, kept apart so that one is never taken for another.
#[derive(Debug)]
pub struct Loaded {
    pub machine: MockMachine,
    cards: Vec<Handle>,
    migs: Vec<Vec<Handle>>,
    gpu_instances: Vec<Vec<Handle>>,
    compute_instances: Vec<Vec<Handle>>,
}

impl Loaded {
    pub fn new(machine: MockMachine) -> Loaded {
        let cards = (0..machine.cards.len())
            .map(|card| Handle { card, slot: None })
            .collect();
        let slots = || -> Vec<Vec<Handle>> {
            machine
                .cards
                .iter()
                .enumerate()
                .map(|(card, c)| match &c.mig {
                    Mig::Enabled(slots) => (0..slots.len())
                        .map(|slot| Handle {
                            card,
                            slot: Some(slot),
                        })
                        .collect(),
                    _ => Vec::new(),
                })
                .collect()
        };
        let (migs, gpu_instances, compute_instances) = (slots(), slots(), slots());
        Loaded {
            machine,
            cards,
            migs,
            gpu_instances,
            compute_instances,
        }
    }

    fn card_handle(&self, card: usize) -> usize {
        address(&self.cards[card])
    }

    fn resolve(&self, handle: usize) -> Option<&Handle> {
        self.cards
            .iter()
            .chain(self.migs.iter().flatten())
            .find(|h| address(h) == handle)
    }

    /// The card and MIG slot a UUID names.
    fn find(&self, uuid: &str) -> Option<(usize, Option<usize>)> {
        self.machine.cards.iter().enumerate().find_map(|(card, c)| {
            if c.uuid == uuid {
                return Some((card, None));
            }
            let Mig::Enabled(slots) = &c.mig else {
                return None;
            };
            slots
                .iter()
                .position(|s| s.as_ref().is_some_and(|s| s.uuid == uuid))
                .map(|slot| (card, Some(slot)))
        })
    }
}

fn address(handle: &Handle) -> usize {
    handle as *const Handle as usize
}

/// The handle among `handles` that has this address.
fn find_handle(handles: &[Vec<Handle>], handle: usize) -> Option<&Handle> {
    handles.iter().flatten().find(|h| address(h) == handle)
}

/// A device as a call sees it.
#[derive(Clone, Copy, Debug)]
pub enum Device<'a> {
    Card {
        index: usize,
        card: &'a Card,
    },
    Mig {
        card_index: usize,
        card: &'a Card,
        mig: &'a MigSlot,
    },
}

impl<'a> Device<'a> {
    /// The card itself, or the card a MIG device is on.
    pub fn card(&self) -> &'a Card {
        match self {
            Device::Card { card, .. } | Device::Mig { card, .. } => card,
        }
    }
}

/// A MIG device's GPU instance, or its compute instance, as a call sees it.
#[derive(Clone, Copy, Debug)]
pub struct Instance {
    /// The card's handle.
    pub card: usize,
    /// The GPU instance's handle.
    pub gpu_instance: usize,
    /// The compute instance's handle.
    pub compute_instance: usize,
    pub mig: &'static MigSlot,
}

/// An event waiting in a set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The card's handle.
    pub device: usize,
    /// `nvmlEventType*`.
    pub event_type: u64,
    pub event_data: u64,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
}

#[derive(Debug, Default)]
struct EventSet {
    /// The event types registered, by card.
    registered: BTreeMap<usize, u64>,
    /// Events not yet waited for; `Err(GPU_IS_LOST)` for a card that fell
    /// off the bus.
    waiting: VecDeque<Result<Event, Code>>,
}

/// Why `nvmlInit` was refused: the code it returns and the reason printed.
#[derive(Debug)]
pub struct Refusal {
    pub code: Code,
    pub reason: String,
}

/// The library: the machine once loaded, how many `nvmlInit`s are open, the
/// event sets, the cards lost.
#[derive(Debug)]
pub struct Library {
    inits: u32,
    loaded: Option<&'static Loaded>,
    faults: Option<FaultFile>,
    lost: BTreeSet<usize>,
    /// By handle (the address of the boxed set).
    sets: BTreeMap<usize, Box<EventSet>>,
}

impl Library {
    pub const fn new() -> Library {
        Library {
            inits: 0,
            loaded: None,
            faults: None,
            lost: BTreeSet::new(),
            sets: BTreeMap::new(),
        }
    }

    /// `nvmlInit`: the first that succeeds loads the machine (and names the
    /// fault file) with `load`; later ones count.
    pub fn init(
        &mut self,
        load: impl FnOnce() -> Result<(MockMachine, Option<FaultFile>), Refusal>,
    ) -> Result<(), Refusal> {
        if self.loaded.is_none() {
            let (machine, faults) = load()?;
            self.loaded = Some(Box::leak(Box::new(Loaded::new(machine))));
            self.faults = faults;
        }
        self.inits += 1;
        Ok(())
    }

    pub fn shutdown(&mut self) -> Result<(), Code> {
        self.inits = self.inits.checked_sub(1).ok_or(UNINITIALIZED)?;
        Ok(())
    }

    /// The machine, for a call made after `nvmlInit`; the fault file read
    /// first, so that a fault appended before the call shows in it.
    pub fn machine(&mut self) -> Result<&'static Loaded, Code> {
        let loaded = self
            .loaded
            .filter(|_| self.inits > 0)
            .ok_or(UNINITIALIZED)?;
        self.read_faults(loaded);
        Ok(loaded)
    }

    /// The device a handle names: `NVML_ERROR_INVALID_ARGUMENT` for what is
    /// not a handle, `NVML_ERROR_GPU_IS_LOST` on a lost card.
    pub fn device(&mut self, handle: usize) -> Result<Device<'static>, Code> {
        let loaded = self.machine()?;
        let h = loaded.resolve(handle).ok_or(INVALID_ARGUMENT)?;
        self.present(loaded, h.card, h.slot)
    }

    fn present(
        &self,
        loaded: &'static Loaded,
        card_index: usize,
        slot: Option<usize>,
    ) -> Result<Device<'static>, Code> {
        if self.lost.contains(&card_index) {
            return Err(GPU_IS_LOST);
        }
        let card = &loaded.machine.cards[card_index];
        let Some(slot) = slot else {
            return Ok(Device::Card {
                index: card_index,
                card,
            });
        };
        let Mig::Enabled(slots) = &card.mig else {
            return Err(INVALID_ARGUMENT);
        };
        let mig = slots[slot].as_ref().ok_or(INVALID_ARGUMENT)?;
        Ok(Device::Mig {
            card_index,
            card,
            mig,
        })
    }

    pub fn device_count(&mut self) -> Result<u32, Code> {
        Ok(self.machine()?.machine.cards.len() as u32)
    }

    /// `nvmlDeviceGetHandleByIndex_v2`.
    pub fn card_by_index(&mut self, index: u32) -> Result<usize, Code> {
        let loaded = self.machine()?;
        let card = usize::try_from(index)
            .ok()
            .filter(|i| *i < loaded.cards.len())
            .ok_or(INVALID_ARGUMENT)?;
        self.present(loaded, card, None)?;
        Ok(loaded.card_handle(card))
    }

    /// `nvmlDeviceGetHandleByUUID`: a card's or a MIG device's.
    pub fn device_by_uuid(&mut self, uuid: &str) -> Result<usize, Code> {
        let loaded = self.machine()?;
        let (card, slot) = loaded.find(uuid).ok_or(NOT_FOUND)?;
        self.present(loaded, card, slot)?;
        Ok(match slot {
            None => loaded.card_handle(card),
            Some(slot) => address(&loaded.migs[card][slot]),
        })
    }

    /// `nvmlDeviceGetHandleByPciBusId_v2`: either form of the bus id.
    pub fn card_by_pci_bus_id(&mut self, bus_id: &str) -> Result<usize, Code> {
        let loaded = self.machine()?;
        let card = loaded
            .machine
            .cards
            .iter()
            .position(|c| {
                c.pci.bus_id.eq_ignore_ascii_case(bus_id)
                    || c.pci.bus_id_legacy.eq_ignore_ascii_case(bus_id)
            })
            .ok_or(NOT_FOUND)?;
        self.present(loaded, card, None)?;
        Ok(loaded.card_handle(card))
    }

    /// `nvmlDeviceGetMigDeviceHandleByIndex`.
    pub fn mig_by_index(&mut self, card: usize, index: u32) -> Result<usize, Code> {
        let loaded = self.machine()?;
        let Device::Card {
            index: card_index,
            card,
        } = self.device(card)?
        else {
            return Err(NOT_SUPPORTED);
        };
        let slots = match &card.mig {
            Mig::Unsupported => return Err(NOT_SUPPORTED),
            Mig::Disabled => return Err(NOT_FOUND),
            Mig::Enabled(slots) => slots,
        };
        let slot = usize::try_from(index)
            .ok()
            .filter(|s| *s < slots.len())
            .ok_or(INVALID_ARGUMENT)?;
        slots[slot].as_ref().ok_or(NOT_FOUND)?;
        Ok(address(&loaded.migs[card_index][slot]))
    }

    /// `nvmlDeviceGetDeviceHandleFromMigDeviceHandle`.
    pub fn card_of_mig(&mut self, mig: usize) -> Result<usize, Code> {
        let loaded = self.machine()?;
        match self.device(mig)? {
            Device::Mig { card_index, .. } => Ok(loaded.card_handle(card_index)),
            Device::Card { .. } => Err(INVALID_ARGUMENT),
        }
    }

    /// `nvmlDeviceGetGpuInstanceProfileInfo`: a GPU instance profile of a
    /// card in MIG mode that one of its MIG devices has, with that device
    /// (the first of them), whose attributes are the profile's. A profile
    /// none of them has is `NVML_ERROR_NOT_SUPPORTED`: the fixture does not
    /// describe it. Past `NVML_GPU_INSTANCE_PROFILE_COUNT`,
    /// `NVML_ERROR_INVALID_ARGUMENT`.
    pub fn gpu_instance_profile(
        &mut self,
        card: usize,
        profile: u32,
    ) -> Result<(&'static MigSlot, GpuInstanceProfile), Code> {
        let Device::Card { card, .. } = self.device(card)? else {
            return Err(NOT_SUPPORTED);
        };
        if profile >= sys::NVML_GPU_INSTANCE_PROFILE_COUNT {
            return Err(INVALID_ARGUMENT);
        }
        let Mig::Enabled(slots) = &card.mig else {
            return Err(NOT_SUPPORTED);
        };
        slots
            .iter()
            .flatten()
            .find_map(|mig| {
                gpu_instance_profile(mig.attributes.gpu_instance_slices)
                    .filter(|p| p.index == profile)
                    .map(|p| (mig, p))
            })
            .ok_or(NOT_SUPPORTED)
    }

    /// `nvmlDeviceGetGpuInstanceById`: on a card in MIG mode, the GPU
    /// instance of the MIG device with that GPU instance id.
    pub fn gpu_instance_by_id(&mut self, card: usize, id: u32) -> Result<usize, Code> {
        let loaded = self.machine()?;
        let Device::Card { index, card } = self.device(card)? else {
            return Err(NOT_SUPPORTED);
        };
        let Mig::Enabled(slots) = &card.mig else {
            return Err(NOT_SUPPORTED);
        };
        let slot = slots
            .iter()
            .position(|s| s.as_ref().is_some_and(|m| m.gpu_instance_id == id))
            .ok_or(NOT_FOUND)?;
        Ok(address(&loaded.gpu_instances[index][slot]))
    }

    /// `nvmlGpuInstanceGetComputeInstanceById`: the one compute instance of a
    /// GPU instance, by its id.
    pub fn compute_instance_by_id(&mut self, gpu_instance: usize, id: u32) -> Result<usize, Code> {
        let instance = self.gpu_instance(gpu_instance)?;
        if instance.mig.compute_instance_id != id {
            return Err(NOT_FOUND);
        }
        Ok(instance.compute_instance)
    }

    /// The GPU instance a handle names: `NVML_ERROR_INVALID_ARGUMENT` for
    /// what is not one, `NVML_ERROR_GPU_IS_LOST` on a lost card.
    pub fn gpu_instance(&mut self, handle: usize) -> Result<Instance, Code> {
        let loaded = self.machine()?;
        let h = find_handle(&loaded.gpu_instances, handle).ok_or(INVALID_ARGUMENT)?;
        self.instance(loaded, h)
    }

    /// The compute instance a handle names, as [`Library::gpu_instance`].
    pub fn compute_instance(&mut self, handle: usize) -> Result<Instance, Code> {
        let loaded = self.machine()?;
        let h = find_handle(&loaded.compute_instances, handle).ok_or(INVALID_ARGUMENT)?;
        self.instance(loaded, h)
    }

    fn instance(&self, loaded: &'static Loaded, h: &Handle) -> Result<Instance, Code> {
        let Device::Mig {
            card_index, mig, ..
        } = self.present(loaded, h.card, h.slot)?
        else {
            return Err(INVALID_ARGUMENT);
        };
        let slot = h.slot.ok_or(INVALID_ARGUMENT)?;
        Ok(Instance {
            card: loaded.card_handle(card_index),
            gpu_instance: address(&loaded.gpu_instances[card_index][slot]),
            compute_instance: address(&loaded.compute_instances[card_index][slot]),
            mig,
        })
    }

    /// `nvmlDeviceGetTopologyCommonAncestor`: between two cards, by
    /// [`crate::machine::common_ancestor`]; `NVML_ERROR_NOT_SUPPORTED` for a
    /// MIG device (its card answers for it).
    pub fn common_ancestor(
        &mut self,
        a: usize,
        b: usize,
    ) -> Result<sys::nvmlGpuTopologyLevel_t, Code> {
        match (self.device(a)?, self.device(b)?) {
            (Device::Card { card: a, .. }, Device::Card { card: b, .. }) => {
                Ok(crate::machine::common_ancestor(a, b))
            }
            _ => Err(NOT_SUPPORTED),
        }
    }

    /// A device's NVLink `link` (`nvmlDeviceGetNvLinkState`,
    /// `nvmlDeviceGetNvLinkRemotePciInfo_v2`): the fixture names no NVLinks,
    /// so there is none to answer for. Each link a device can have (0 to
    /// `NVML_NVLINK_MAX_LINKS` - 1) is `NVML_ERROR_NOT_SUPPORTED`, as on a PCIe
    /// card; a link past them is `NVML_ERROR_INVALID_ARGUMENT`.
    pub fn nvlink(&mut self, device: usize, link: u32) -> Result<Infallible, Code> {
        self.device(device)?;
        if link >= sys::NVML_NVLINK_MAX_LINKS {
            return Err(INVALID_ARGUMENT);
        }
        Err(NOT_SUPPORTED)
    }

    pub fn create_set(&mut self) -> Result<usize, Code> {
        self.machine()?;
        let set = Box::<EventSet>::default();
        let handle = &*set as *const EventSet as usize;
        self.sets.insert(handle, set);
        Ok(handle)
    }

    pub fn free_set(&mut self, set: usize) -> Result<(), Code> {
        self.machine()?;
        self.sets.remove(&set).map(drop).ok_or(INVALID_ARGUMENT)
    }

    /// `nvmlDeviceRegisterEvents`: on a card, for event types it supports. A
    /// card the fixture has unhealthy is told to the set as a critical XID
    /// the first time the set registers for them.
    pub fn register(&mut self, device: usize, types: u64, set: usize) -> Result<(), Code> {
        let loaded = self.machine()?;
        let Device::Card { index, card } = self.device(device)? else {
            return Err(NOT_SUPPORTED);
        };
        if types & !SUPPORTED_EVENTS != 0 {
            return Err(NOT_SUPPORTED);
        }
        let set = self.sets.get_mut(&set).ok_or(INVALID_ARGUMENT)?;
        let registered = set.registered.entry(index).or_default();
        let newly = types & !*registered;
        *registered |= types;
        if card.unhealthy && newly & XID != 0 {
            set.waiting.push_back(Ok(Event {
                device: loaded.card_handle(index),
                event_type: XID,
                event_data: UNHEALTHY_XID,
                gpu_instance_id: NO_INSTANCE,
                compute_instance_id: NO_INSTANCE,
            }));
        }
        Ok(())
    }

    /// The next event of a set, if one is waiting (the fault file read
    /// first); `Err(NVML_ERROR_GPU_IS_LOST)` once for each registered card
    /// that fell off the bus.
    pub fn next_event(&mut self, set: usize) -> Result<Option<Event>, Code> {
        self.machine()?;
        let set = self.sets.get_mut(&set).ok_or(INVALID_ARGUMENT)?;
        set.waiting.pop_front().transpose()
    }

    fn read_faults(&mut self, loaded: &'static Loaded) {
        let Some(file) = &mut self.faults else {
            return;
        };
        let path = file.path().display().to_string();
        let faults = match file.read_new() {
            Ok(faults) => faults,
            Err(e) => {
                eprintln!("switchyard-nvml-mock: fault file {path}: {e}");
                return;
            }
        };
        for fault in faults {
            if let Err(reason) = fault.and_then(|fault| self.apply(loaded, &fault)) {
                eprintln!("switchyard-nvml-mock: fault file {path}: {reason}; line skipped");
            }
        }
    }

    /// A fault, told to the event sets registered for it on its card.
    pub fn apply(&mut self, loaded: &Loaded, fault: &Fault) -> Result<(), String> {
        let (card, slot) = loaded
            .find(fault.uuid())
            .ok_or_else(|| format!("{fault:?}: no card or MIG device has this UUID"))?;
        let device = loaded.card_handle(card);
        let (gpu_instance_id, compute_instance_id) = match (&loaded.machine.cards[card].mig, slot) {
            (Mig::Enabled(slots), Some(slot)) => slots[slot]
                .as_ref()
                .map_or((NO_INSTANCE, NO_INSTANCE), |m| {
                    (m.gpu_instance_id, m.compute_instance_id)
                }),
            _ => (NO_INSTANCE, NO_INSTANCE),
        };
        let event = |event_type, event_data| Event {
            device,
            event_type,
            event_data,
            gpu_instance_id,
            compute_instance_id,
        };
        let (wanted, told) = match fault {
            Fault::Xid { xid, .. } => (XID, Ok(event(XID, *xid))),
            Fault::Ecc { .. } => (DOUBLE_BIT_ECC, Ok(event(DOUBLE_BIT_ECC, 0))),
            Fault::Lost { .. } => {
                if !self.lost.insert(card) {
                    return Ok(());
                }
                (u64::MAX, Err(GPU_IS_LOST))
            }
        };
        for set in self.sets.values_mut() {
            if set.registered.get(&card).is_some_and(|t| t & wanted != 0) {
                set.waiting.push_back(told.clone());
            }
        }
        Ok(())
    }
}

impl Default for Library {
    fn default() -> Library {
        Library::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn library(fixture: &str) -> Library {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../deploy/fixtures")
            .join(fixture);
        let machine =
            switchyard_gpu::GpuSource::machine(&switchyard_gpu::Fixture::load(&path).unwrap())
                .unwrap();
        let mut library = Library::new();
        library
            .init(|| Ok((MockMachine::from_fixture(&machine).unwrap(), None)))
            .unwrap();
        library
    }

    fn fault(line: &str) -> Fault {
        line.parse().unwrap()
    }

    #[test]
    fn calls_before_init_and_after_the_last_shutdown_are_refused() {
        let mut library = Library::new();
        assert_eq!(library.device_count(), Err(UNINITIALIZED));
        let mut library = self::library("mixed.yaml");
        library.init(|| unreachable!("loaded once")).unwrap();
        library.shutdown().unwrap();
        assert_eq!(library.device_count(), Ok(4));
        library.shutdown().unwrap();
        assert_eq!(library.device_count(), Err(UNINITIALIZED));
        assert_eq!(library.shutdown(), Err(UNINITIALIZED));
    }

    #[test]
    fn handles_name_cards_and_mig_devices() {
        let mut library = library("a100-8x-mig.yaml");
        let card = library.card_by_index(3).unwrap();
        assert_eq!(
            library.card_by_index(3),
            Ok(card),
            "the same handle each time"
        );
        assert_eq!(library.card_by_index(8), Err(INVALID_ARGUMENT));
        assert!(matches!(
            library.device(card),
            Ok(Device::Card { index: 3, .. })
        ));
        let mig = library.mig_by_index(card, 2).unwrap();
        let Ok(Device::Mig { mig: slot, .. }) = library.device(mig) else {
            panic!("a MIG device");
        };
        assert_eq!(slot.uuid, "MIG-6e82fd14-5f13-5486-92d3-cbfca527523a");
        assert_eq!(library.device_by_uuid(&slot.uuid.clone()), Ok(mig));
        assert_eq!(library.card_of_mig(mig), Ok(card));
        assert_eq!(library.card_of_mig(card), Err(INVALID_ARGUMENT));
        assert_eq!(
            library.mig_by_index(card, 4),
            Err(NOT_FOUND),
            "an empty slot"
        );
        assert_eq!(library.mig_by_index(card, 7), Err(INVALID_ARGUMENT));
        let whole = library.card_by_index(4).unwrap();
        assert_eq!(library.mig_by_index(whole, 0), Err(NOT_FOUND), "MIG off");
        assert_eq!(library.device(whole + 1).err(), Some(INVALID_ARGUMENT));
        assert_eq!(library.card_by_pci_bus_id("0000:4e:00.0"), Ok(card));
    }

    #[test]
    fn each_mig_device_is_a_gpu_instance_holding_one_compute_instance() {
        let mut library = library("a100-8x-mig.yaml");
        let loaded = library.machine().unwrap();
        // Card 3: 3g.20gb, 2g.10gb, 1g.5gb, 1g.5gb in slots 0-3.
        let card = library.card_by_index(3).unwrap();
        let gi = library.gpu_instance_by_id(card, 1).unwrap();
        assert_eq!(library.gpu_instance_by_id(card, 1), Ok(gi));
        let instance = library.gpu_instance(gi).unwrap();
        assert_eq!(instance.card, card);
        assert_eq!(
            instance.mig.uuid,
            "MIG-65750938-9ff8-5aa2-bf96-38de719fe95f"
        );
        assert_eq!(instance.gpu_instance, gi);
        let ci = library.compute_instance_by_id(gi, 0).unwrap();
        assert_eq!(ci, instance.compute_instance);
        assert_eq!(library.compute_instance(ci).unwrap().gpu_instance, gi);
        assert_eq!(library.compute_instance_by_id(gi, 1), Err(NOT_FOUND));
        assert_eq!(library.gpu_instance_by_id(card, 4), Err(NOT_FOUND));
        // Handles of one kind are not taken for another.
        let mig = library.mig_by_index(card, 1).unwrap();
        assert_eq!(library.gpu_instance(mig).err(), Some(INVALID_ARGUMENT));
        assert_eq!(library.gpu_instance(ci).err(), Some(INVALID_ARGUMENT));
        assert_eq!(library.compute_instance(gi).err(), Some(INVALID_ARGUMENT));
        assert_eq!(library.device(gi).err(), Some(INVALID_ARGUMENT));
        assert_eq!(library.gpu_instance_by_id(mig, 1), Err(NOT_SUPPORTED));

        let (with, profile) = library
            .gpu_instance_profile(card, sys::NVML_GPU_INSTANCE_PROFILE_2_SLICE)
            .unwrap();
        assert_eq!((with.attributes.memory_mib, profile.id), (9856, 14));
        assert_eq!(
            library
                .gpu_instance_profile(card, sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE)
                .map(|(m, p)| (m.uuid.as_str(), p.id, p.instances)),
            Ok(("MIG-6e82fd14-5f13-5486-92d3-cbfca527523a", 19, 7)),
            "the first 1g.5gb"
        );
        assert_eq!(
            library
                .gpu_instance_profile(card, sys::NVML_GPU_INSTANCE_PROFILE_7_SLICE)
                .err(),
            Some(NOT_SUPPORTED),
            "no 7g.40gb on the card: the fixture does not describe it"
        );
        assert_eq!(
            library
                .gpu_instance_profile(card, sys::NVML_GPU_INSTANCE_PROFILE_COUNT)
                .err(),
            Some(INVALID_ARGUMENT)
        );
        let whole = library.card_by_index(4).unwrap();
        assert_eq!(library.gpu_instance_by_id(whole, 0), Err(NOT_SUPPORTED));
        assert_eq!(
            library.gpu_instance_profile(whole, 0).err(),
            Some(NOT_SUPPORTED),
            "MIG off"
        );

        let uuid = loaded.machine.cards[3].uuid.clone();
        library
            .apply(loaded, &fault(&format!("lost {uuid}")))
            .unwrap();
        assert_eq!(library.gpu_instance(gi).err(), Some(GPU_IS_LOST));
        assert_eq!(library.compute_instance(ci).err(), Some(GPU_IS_LOST));
    }

    #[test]
    fn the_topology_is_of_cards_and_no_card_has_nvlinks() {
        let mut library = library("mixed.yaml");
        let loaded = library.machine().unwrap();
        let card1 = library.card_by_index(1).unwrap();
        let card2 = library.card_by_index(2).unwrap();
        assert_eq!(
            library.common_ancestor(card1, card2),
            Ok(sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_NODE)
        );
        assert_eq!(
            library.common_ancestor(card1, card1),
            Ok(sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_INTERNAL)
        );
        let card0 = library.card_by_index(0).unwrap();
        let mig = library.mig_by_index(card0, 0).unwrap();
        assert_eq!(library.common_ancestor(mig, card1), Err(NOT_SUPPORTED));
        assert_eq!(library.common_ancestor(card1, 7), Err(INVALID_ARGUMENT));

        for link in [0, sys::NVML_NVLINK_MAX_LINKS - 1] {
            assert_eq!(library.nvlink(card1, link), Err(NOT_SUPPORTED));
            assert_eq!(library.nvlink(mig, link), Err(NOT_SUPPORTED));
        }
        assert_eq!(
            library.nvlink(card1, sys::NVML_NVLINK_MAX_LINKS),
            Err(INVALID_ARGUMENT)
        );
        assert_eq!(library.nvlink(7, 0), Err(INVALID_ARGUMENT));

        let uuid2 = loaded.machine.cards[2].uuid.clone();
        library
            .apply(loaded, &fault(&format!("lost {uuid2}")))
            .unwrap();
        assert_eq!(library.common_ancestor(card1, card2), Err(GPU_IS_LOST));
        assert_eq!(library.nvlink(card2, 0), Err(GPU_IS_LOST));
    }

    #[test]
    fn faults_reach_the_sets_registered_for_them() {
        let mut library = library("h100-8x.yaml");
        let loaded = library.machine().unwrap();
        let card0 = library.card_by_index(0).unwrap();
        let card1 = library.card_by_index(1).unwrap();
        let xids = library.create_set().unwrap();
        let ecc = library.create_set().unwrap();
        library.register(card0, XID, xids).unwrap();
        library.register(card1, XID, xids).unwrap();
        library.register(card0, DOUBLE_BIT_ECC, ecc).unwrap();
        assert_eq!(library.register(card0, 1 << 40, ecc), Err(NOT_SUPPORTED));

        let uuid0 = loaded.machine.cards[0].uuid.clone();
        let uuid1 = loaded.machine.cards[1].uuid.clone();
        for line in [
            format!("xid {uuid1} 79"),
            format!("ecc {uuid0}"),
            format!("lost {uuid0}"),
        ] {
            library.apply(loaded, &fault(&line)).unwrap();
        }
        assert!(library.apply(loaded, &fault("lost GPU-nope")).is_err());

        assert_eq!(
            library.next_event(xids),
            Ok(Some(Event {
                device: card1,
                event_type: XID,
                event_data: 79,
                gpu_instance_id: NO_INSTANCE,
                compute_instance_id: NO_INSTANCE,
            }))
        );
        assert_eq!(library.next_event(xids), Err(GPU_IS_LOST));
        assert_eq!(library.next_event(xids), Ok(None), "lost is told once");
        assert_eq!(
            library.next_event(ecc).unwrap().unwrap().event_type,
            DOUBLE_BIT_ECC
        );
        assert_eq!(library.next_event(ecc), Err(GPU_IS_LOST));
        assert_eq!(library.device(card0).err(), Some(GPU_IS_LOST));
        assert_eq!(library.card_by_index(0), Err(GPU_IS_LOST));
        assert!(library.device(card1).is_ok());
        library.free_set(xids).unwrap();
        assert_eq!(library.next_event(xids), Err(INVALID_ARGUMENT));
    }

    #[test]
    fn an_unhealthy_card_is_told_as_a_critical_xid_to_each_set_once() {
        let mut library = library("mixed.yaml");
        let card3 = library.card_by_index(3).unwrap();
        let set = library.create_set().unwrap();
        library.register(card3, XID, set).unwrap();
        library.register(card3, XID, set).unwrap();
        let event = library.next_event(set).unwrap().unwrap();
        assert_eq!((event.device, event.event_data), (card3, UNHEALTHY_XID));
        assert_eq!(library.next_event(set), Ok(None));
    }

    #[test]
    fn an_xid_on_a_mig_device_is_on_its_card_with_its_instance() {
        let mut library = library("mixed.yaml");
        let loaded = library.machine().unwrap();
        let card0 = library.card_by_index(0).unwrap();
        let set = library.create_set().unwrap();
        library.register(card0, XID, set).unwrap();
        library
            .apply(
                loaded,
                &fault("xid MIG-2643cf1a-ae77-5b39-8c42-e87be2138931 43"),
            )
            .unwrap();
        let event = library.next_event(set).unwrap().unwrap();
        assert_eq!(
            (
                event.device,
                event.gpu_instance_id,
                event.compute_instance_id
            ),
            (card0, 0, 0)
        );
    }
}
