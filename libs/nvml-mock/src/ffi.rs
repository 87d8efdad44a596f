//! The C functions, named and typed as nvml.h declares them (checked against
//! nvml-wrapper-sys's bindings by [`signatures_are_nvml_h`]).
//!
//! Safety: every function is `unsafe extern "C"` with nvml.h's contract — a
//! pointer given is null (refused with `NVML_ERROR_INVALID_ARGUMENT`) or
//! valid for the access nvml.h describes (a write of the out-parameter's
//! type, `length` bytes of a string buffer, a NUL-terminated input string).
//! Handles are only compared as addresses, never dereferenced.

#![allow(non_snake_case)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use nvml_wrapper_sys::bindings::{
    self as sys, nvmlBrandType_t, nvmlComputeInstance_st, nvmlComputeInstance_t,
    nvmlComputeInstanceInfo_t, nvmlComputeInstancePlacement_t, nvmlComputeInstanceProfileInfo_t,
    nvmlDevice_st, nvmlDevice_t, nvmlDeviceArchitecture_t, nvmlDeviceAttributes_t,
    nvmlEnableState_t, nvmlEventData_t, nvmlEventSet_st, nvmlEventSet_t, nvmlGpuInstance_st,
    nvmlGpuInstance_t, nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t,
    nvmlGpuInstanceProfileInfo_t, nvmlGpuTopologyLevel_t, nvmlMemory_t, nvmlMemory_v2_t,
    nvmlPciInfo_t, nvmlReturn_t,
};

use crate::machine::{Mig, NVIDIA_PCI_VENDOR, compute_instance_profile, gpu_instance_profile};
use crate::state::{Code, Device, INVALID_ARGUMENT, Library, NOT_SUPPORTED, SUPPORTED_EVENTS};

const SUCCESS: nvmlReturn_t = sys::nvmlReturn_enum_NVML_SUCCESS;
const INSUFFICIENT_SIZE: Code = sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
const TIMEOUT: Code = sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT;
const ARGUMENT_VERSION_MISMATCH: Code = sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;

/// How often `nvmlEventSetWait_v2` reads the fault file while it waits.
const WAIT_POLL: Duration = Duration::from_millis(50);

/// `nvmlMemory_v2`: NVML_STRUCT_VERSION(Memory, 2), the size and the
/// version in the top byte.
const MEMORY_V2: c_uint = (size_of::<nvmlMemory_v2_t>() as c_uint) | (2 << 24);

static LIBRARY: Mutex<Library> = Mutex::new(Library::new());

fn library() -> MutexGuard<'static, Library> {
    // A panic cannot cross the C boundary (it aborts), so a poisoned lock
    // only means a test thread panicked while holding it.
    LIBRARY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs a call against the library, the lock held, and returns its code.
fn answer(call: impl FnOnce(&mut Library) -> Result<(), Code>) -> nvmlReturn_t {
    match call(&mut library()) {
        Ok(()) => SUCCESS,
        Err(code) => code,
    }
}

/// Writes an out-parameter.
///
/// # Safety
/// `out` is null or valid for a write of `T`.
unsafe fn put<T>(out: *mut T, value: T) -> Result<(), Code> {
    if out.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and valid for a write of T by the caller's contract.
    unsafe { out.write(value) };
    Ok(())
}

/// Writes a string and its NUL into a caller's buffer of `length` bytes.
///
/// # Safety
/// `out` is null or valid for writes of `length` bytes.
unsafe fn put_str(out: *mut c_char, length: c_uint, value: &str) -> Result<(), Code> {
    if out.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    let bytes = value.as_bytes();
    if bytes.len() >= length as usize {
        return Err(INSUFFICIENT_SIZE);
    }
    // SAFETY: bytes.len() + 1 <= length bytes, valid for writes by the
    // caller's contract; the source is a distinct Rust string.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.cast::<u8>(), bytes.len());
        out.add(bytes.len()).write(0);
    }
    Ok(())
}

/// Reads a caller's NUL-terminated string.
///
/// # Safety
/// `s` is null or a valid NUL-terminated string.
unsafe fn get_str<'a>(s: *const c_char) -> Result<&'a str, Code> {
    if s.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(s) }
        .to_str()
        .map_err(|_| INVALID_ARGUMENT)
}

/// A string in a fixed C array, NUL-padded (the machine's checks keep it
/// shorter than the array).
fn c_array<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0; N];
    for (o, b) in out.iter_mut().zip(s.bytes().take(N - 1)) {
        *o = b as c_char;
    }
    out
}

fn handle(device: nvmlDevice_t) -> usize {
    device as usize
}

fn device_t(handle: usize) -> nvmlDevice_t {
    handle as *mut nvmlDevice_st
}

// ---- Initialisation --------------------------------------------------------

fn init() -> nvmlReturn_t {
    match library().init(crate::load_from_env) {
        Ok(()) => SUCCESS,
        Err(refusal) => {
            eprintln!("switchyard-nvml-mock: nvmlInit refused: {}", refusal.reason);
            refusal.code
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    init()
}

/// The flags (no GPUs, no attach) change nothing here: the machine is the
/// fixture's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    init()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    answer(|l| l.shutdown())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    error_string(result).as_ptr()
}

fn error_string(result: nvmlReturn_t) -> &'static CStr {
    match result {
        sys::nvmlReturn_enum_NVML_SUCCESS => c"Success",
        sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED => c"Uninitialized",
        sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED => c"Not Supported",
        sys::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION => c"Insufficient Permissions",
        sys::nvmlReturn_enum_NVML_ERROR_ALREADY_INITIALIZED => c"Already Initialized",
        sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND => c"Not Found",
        sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_POWER => c"Insufficient External Power",
        sys::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED => c"Driver Not Loaded",
        sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT => c"Timeout",
        sys::nvmlReturn_enum_NVML_ERROR_IRQ_ISSUE => c"Interrupt Request Issue",
        sys::nvmlReturn_enum_NVML_ERROR_LIBRARY_NOT_FOUND => c"NVML Shared Library Not Found",
        sys::nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND => c"Function Not Found",
        sys::nvmlReturn_enum_NVML_ERROR_CORRUPTED_INFOROM => c"Corrupted infoROM",
        sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST => c"GPU is lost",
        sys::nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED => c"GPU requires reset",
        sys::nvmlReturn_enum_NVML_ERROR_OPERATING_SYSTEM => {
            c"The operating system has blocked the request"
        }
        sys::nvmlReturn_enum_NVML_ERROR_LIB_RM_VERSION_MISMATCH => {
            c"RM has detected an NVML/RM version mismatch"
        }
        sys::nvmlReturn_enum_NVML_ERROR_IN_USE => c"In use by another client",
        sys::nvmlReturn_enum_NVML_ERROR_MEMORY => c"Insufficient Memory",
        sys::nvmlReturn_enum_NVML_ERROR_NO_DATA => c"No data",
        sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES => c"Insufficient resources",
        sys::nvmlReturn_enum_NVML_ERROR_FREQ_NOT_SUPPORTED => c"Frequency not supported",
        sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH => c"Argument version mismatch",
        sys::nvmlReturn_enum_NVML_ERROR_DEPRECATED => c"Deprecated",
        sys::nvmlReturn_enum_NVML_ERROR_NOT_READY => c"Not ready",
        sys::nvmlReturn_enum_NVML_ERROR_GPU_NOT_FOUND => c"GPU not found",
        sys::nvmlReturn_enum_NVML_ERROR_INVALID_STATE => c"Invalid state",
        _ => c"Unknown Error",
    }
}

// ---- The system ------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    answer(|l| {
        let loaded = l.machine()?;
        // SAFETY: the caller's buffer of `length` bytes (module contract).
        unsafe { put_str(version, length, &loaded.machine.driver_version) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    answer(|l| {
        let loaded = l.machine()?;
        // SAFETY: the caller's buffer of `length` bytes (module contract).
        unsafe { put_str(version, length, &loaded.machine.nvml_version()) }
    })
}

/// # Safety
/// `out` is null or valid for a write of an int.
unsafe fn cuda_driver_version(out: *mut c_int) -> nvmlReturn_t {
    answer(|l| {
        let loaded = l.machine()?;
        // SAFETY: an int out-parameter (this fn's contract).
        unsafe { put(out, loaded.machine.cuda_driver_version) }
    })
}

// The exported functions never call each other: a caller exporting the same
// names would take the call.

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(
    cudaDriverVersion: *mut c_int,
) -> nvmlReturn_t {
    // SAFETY: an int out-parameter (module contract).
    unsafe { cuda_driver_version(cudaDriverVersion) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(
    cudaDriverVersion: *mut c_int,
) -> nvmlReturn_t {
    // SAFETY: an int out-parameter (module contract).
    unsafe { cuda_driver_version(cudaDriverVersion) }
}

// ---- Handles ---------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(deviceCount: *mut c_uint) -> nvmlReturn_t {
    answer(|l| {
        let count = l.device_count()?;
        // SAFETY: an unsigned int out-parameter (module contract).
        unsafe { put(deviceCount, count) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    answer(|l| {
        let h = l.card_by_index(index)?;
        // SAFETY: a handle out-parameter (module contract).
        unsafe { put(device, device_t(h)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    answer(|l| {
        l.machine()?;
        // SAFETY: a NUL-terminated string (module contract).
        let uuid = unsafe { get_str(uuid) }?;
        let h = l.device_by_uuid(uuid)?;
        // SAFETY: a handle out-parameter (module contract).
        unsafe { put(device, device_t(h)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    pciBusId: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    answer(|l| {
        l.machine()?;
        // SAFETY: a NUL-terminated string (module contract).
        let bus_id = unsafe { get_str(pciBusId) }?;
        let h = l.card_by_pci_bus_id(bus_id)?;
        // SAFETY: a handle out-parameter (module contract).
        unsafe { put(device, device_t(h)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    migDevice: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    answer(|l| {
        let h = l.mig_by_index(handle(device), index)?;
        // SAFETY: a handle out-parameter (module contract).
        unsafe { put(migDevice, device_t(h)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    migDevice: nvmlDevice_t,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    answer(|l| {
        let h = l.card_of_mig(handle(migDevice))?;
        // SAFETY: a handle out-parameter (module contract).
        unsafe { put(device, device_t(h)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: nvmlDevice_t,
    isMigDevice: *mut c_uint,
) -> nvmlReturn_t {
    answer(|l| {
        let is_mig = matches!(l.device(handle(device))?, Device::Mig { .. });
        // SAFETY: an unsigned int out-parameter (module contract).
        unsafe { put(isMigDevice, c_uint::from(is_mig)) }
    })
}

// ---- What a device is ------------------------------------------------------

/// Answers a question about a device with a value written to `out`.
///
/// # Safety
/// `out` is null or valid for a write of `T`.
unsafe fn device_answer<T>(
    device: nvmlDevice_t,
    out: *mut T,
    question: impl FnOnce(Device<'static>) -> Result<T, Code>,
) -> nvmlReturn_t {
    answer(|l| {
        let value = question(l.device(handle(device))?)?;
        // SAFETY: the caller's out-parameter of type T (this fn's contract).
        unsafe { put(out, value) }
    })
}

/// Answers a question about a device with a string written to `out`.
///
/// # Safety
/// `out` is null or valid for writes of `length` bytes.
unsafe fn device_string(
    device: nvmlDevice_t,
    out: *mut c_char,
    length: c_uint,
    question: impl FnOnce(Device<'static>) -> &'static str,
) -> nvmlReturn_t {
    answer(|l| {
        let value = question(l.device(handle(device))?);
        // SAFETY: the caller's buffer of `length` bytes (this fn's contract).
        unsafe { put_str(out, length, value) }
    })
}

fn card_only<T>(
    value: impl FnOnce(usize, &'static crate::machine::Card) -> T,
) -> impl FnOnce(Device<'static>) -> Result<T, Code> {
    move |device| match device {
        Device::Card { index, card } => Ok(value(index, card)),
        Device::Mig { .. } => Err(NOT_SUPPORTED),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(
    device: nvmlDevice_t,
    index: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: an unsigned int out-parameter (module contract).
    unsafe { device_answer(device, index, card_only(|i, _| i as c_uint)) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: nvmlDevice_t,
    minorNumber: *mut c_uint,
) -> nvmlReturn_t {
    // /dev/nvidiaN, N the card's index; a MIG device answers its card's.
    // SAFETY: an unsigned int out-parameter (module contract).
    unsafe {
        device_answer(device, minorNumber, |d| {
            Ok(match d {
                Device::Card { index, .. } => index as c_uint,
                Device::Mig { card_index, .. } => card_index as c_uint,
            })
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller's buffer of `length` bytes (module contract).
    unsafe {
        device_string(device, uuid, length, |d| match d {
            Device::Card { card, .. } => &card.uuid,
            Device::Mig { mig, .. } => &mig.uuid,
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: the caller's buffer of `length` bytes (module contract).
    unsafe {
        device_string(device, name, length, |d| match d {
            Device::Card { card, .. } => &card.name,
            Device::Mig { mig, .. } => &mig.name,
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBrand(
    device: nvmlDevice_t,
    type_: *mut nvmlBrandType_t,
) -> nvmlReturn_t {
    // SAFETY: an enum out-parameter (module contract).
    unsafe { device_answer(device, type_, |d| Ok(d.card().brand)) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetArchitecture(
    device: nvmlDevice_t,
    arch: *mut nvmlDeviceArchitecture_t,
) -> nvmlReturn_t {
    // SAFETY: an enum out-parameter (module contract).
    unsafe { device_answer(device, arch, |d| Ok(d.card().architecture)) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    answer(|l| {
        let (ma, mi) = l.device(handle(device))?.card().compute_capability;
        if major.is_null() || minor.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: two int out-parameters (module contract).
        unsafe {
            put(major, ma)?;
            put(minor, mi)
        }
    })
}

fn memory_bytes(device: Device<'_>) -> u64 {
    let mib = match device {
        Device::Card { card, .. } => card.memory_mib,
        Device::Mig { mig, .. } => mig.attributes.memory_mib,
    };
    mib << 20
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    // Nothing runs on the mock's cards: all of the memory is free.
    // SAFETY: an nvmlMemory_t out-parameter (module contract).
    unsafe {
        device_answer(device, memory, |d| {
            let total = memory_bytes(d);
            Ok(nvmlMemory_t {
                total,
                free: total,
                used: 0,
            })
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    answer(|l| {
        let total = memory_bytes(l.device(handle(device))?);
        if memory.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: non-null, an nvmlMemory_v2_t the caller versioned (module
        // contract); its version is read before the struct is written.
        unsafe {
            if (*memory).version != MEMORY_V2 {
                return Err(ARGUMENT_VERSION_MISMATCH);
            }
            put(
                memory,
                nvmlMemory_v2_t {
                    version: MEMORY_V2,
                    total,
                    reserved: 0,
                    free: total,
                    used: 0,
                },
            )
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    // A MIG device answers its card's.
    // SAFETY: an nvmlPciInfo_t out-parameter (module contract).
    unsafe {
        device_answer(device, pci, |d| {
            let p = &d.card().pci;
            Ok(nvmlPciInfo_t {
                busIdLegacy: c_array(&p.bus_id_legacy),
                domain: p.domain,
                bus: p.bus,
                device: p.device,
                pciDeviceId: NVIDIA_PCI_VENDOR,
                pciSubSystemId: 0,
                busId: c_array(&p.bus_id),
            })
        })
    }
}

// ---- Topology and NVLink ---------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTopologyCommonAncestor(
    device1: nvmlDevice_t,
    device2: nvmlDevice_t,
    pathInfo: *mut nvmlGpuTopologyLevel_t,
) -> nvmlReturn_t {
    answer(|l| {
        let level = l.common_ancestor(handle(device1), handle(device2))?;
        // SAFETY: an enum out-parameter (module contract).
        unsafe { put(pathInfo, level) }
    })
}

/// A question about an NVLink, which is never there: the device and the
/// link are checked, then the out-parameter (never written).
fn nvlink(device: nvmlDevice_t, link: c_uint, out_is_null: bool) -> nvmlReturn_t {
    answer(|l| {
        let Err(code) = l.nvlink(handle(device), link);
        Err(if code == NOT_SUPPORTED && out_is_null {
            INVALID_ARGUMENT
        } else {
            code
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: nvmlDevice_t,
    link: c_uint,
    isActive: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    nvlink(device, link, isActive.is_null())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    device: nvmlDevice_t,
    link: c_uint,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    nvlink(device, link, pci.is_null())
}

// ---- MIG -------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    currentMode: *mut c_uint,
    pendingMode: *mut c_uint,
) -> nvmlReturn_t {
    answer(|l| {
        let mode = match &l.device(handle(device))? {
            Device::Mig { .. } => return Err(NOT_SUPPORTED),
            Device::Card { card, .. } => match card.mig {
                Mig::Unsupported => return Err(NOT_SUPPORTED),
                Mig::Disabled => sys::NVML_DEVICE_MIG_DISABLE,
                Mig::Enabled(_) => sys::NVML_DEVICE_MIG_ENABLE,
            },
        };
        if currentMode.is_null() || pendingMode.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: two unsigned int out-parameters (module contract).
        unsafe {
            put(currentMode, mode)?;
            put(pendingMode, mode)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: an unsigned int out-parameter (module contract).
    unsafe {
        device_answer(device, count, |d| match d {
            Device::Card { card, .. } if card.mig != Mig::Unsupported => {
                Ok(crate::machine::MIG_SLOTS)
            }
            _ => Err(NOT_SUPPORTED),
        })
    }
}

fn mig_only<T>(
    value: impl FnOnce(&'static crate::machine::MigSlot) -> T,
) -> impl FnOnce(Device<'static>) -> Result<T, Code> {
    move |device| match device {
        Device::Mig { mig, .. } => Ok(value(mig)),
        Device::Card { .. } => Err(NOT_SUPPORTED),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: an unsigned int out-parameter (module contract).
    unsafe { device_answer(device, id, mig_only(|m| m.gpu_instance_id)) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: an unsigned int out-parameter (module contract).
    unsafe { device_answer(device, id, mig_only(|m| m.compute_instance_id)) }
}

/// As NVML: for MIG devices only.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAttributes_v2(
    device: nvmlDevice_t,
    attributes: *mut nvmlDeviceAttributes_t,
) -> nvmlReturn_t {
    // SAFETY: an nvmlDeviceAttributes_t out-parameter (module contract).
    unsafe {
        device_answer(
            device,
            attributes,
            mig_only(|m| {
                let a = &m.attributes;
                nvmlDeviceAttributes_t {
                    multiprocessorCount: a.multiprocessors,
                    sharedCopyEngineCount: a.copy_engines,
                    sharedDecoderCount: a.decoders,
                    sharedEncoderCount: a.encoders,
                    sharedJpegCount: a.jpeg_engines,
                    sharedOfaCount: a.ofa_engines,
                    gpuInstanceSliceCount: a.gpu_instance_slices,
                    computeInstanceSliceCount: a.compute_instance_slices,
                    memorySizeMB: a.memory_mib,
                }
            }),
        )
    }
}

// ---- GPU and compute instances ---------------------------------------------
//
// Each MIG device is one GPU instance holding one compute instance that
// spans it, with the device's attributes; their profiles are those of a
// seven-slice card (`machine::gpu_instance_profile`). The fixture places no
// instances: a GPU instance's placement is zeros, a compute instance's is
// the whole of its GPU instance.

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_t,
) -> nvmlReturn_t {
    answer(|l| {
        let (mig, p) = l.gpu_instance_profile(handle(device), profile)?;
        let a = &mig.attributes;
        let value = nvmlGpuInstanceProfileInfo_t {
            id: p.id,
            isP2pSupported: 0,
            sliceCount: a.gpu_instance_slices,
            instanceCount: p.instances,
            multiprocessorCount: a.multiprocessors,
            copyEngineCount: a.copy_engines,
            decoderCount: a.decoders,
            encoderCount: a.encoders,
            jpegCount: a.jpeg_engines,
            ofaCount: a.ofa_engines,
            memorySizeMB: a.memory_mib,
        };
        // SAFETY: an nvmlGpuInstanceProfileInfo_t out-parameter (module
        // contract).
        unsafe { put(info, value) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: nvmlDevice_t,
    id: c_uint,
    gpuInstance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    answer(|l| {
        let h = l.gpu_instance_by_id(handle(device), id)?;
        // SAFETY: a handle out-parameter (module contract).
        unsafe { put(gpuInstance, h as *mut nvmlGpuInstance_st) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    gpuInstance: nvmlGpuInstance_t,
    info: *mut nvmlGpuInstanceInfo_t,
) -> nvmlReturn_t {
    answer(|l| {
        let instance = l.gpu_instance(gpuInstance as usize)?;
        let profile = gpu_instance_profile(instance.mig.attributes.gpu_instance_slices)
            .ok_or(NOT_SUPPORTED)?;
        let value = nvmlGpuInstanceInfo_t {
            device: device_t(instance.card),
            id: instance.mig.gpu_instance_id,
            profileId: profile.id,
            placement: nvmlGpuInstancePlacement_t { start: 0, size: 0 },
        };
        // SAFETY: an nvmlGpuInstanceInfo_t out-parameter (module contract).
        unsafe { put(info, value) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    gpuInstance: nvmlGpuInstance_t,
    profile: c_uint,
    engProfile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_t,
) -> nvmlReturn_t {
    answer(|l| {
        let instance = l.gpu_instance(gpuInstance as usize)?;
        if profile >= sys::NVML_COMPUTE_INSTANCE_PROFILE_COUNT
            || engProfile >= sys::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT
        {
            return Err(INVALID_ARGUMENT);
        }
        // Only the profile spanning the GPU instance, the fixture's.
        let a = &instance.mig.attributes;
        if compute_instance_profile(a.compute_instance_slices) != Some(profile) {
            return Err(NOT_SUPPORTED);
        }
        let value = nvmlComputeInstanceProfileInfo_t {
            id: profile,
            sliceCount: a.compute_instance_slices,
            instanceCount: 1,
            multiprocessorCount: a.multiprocessors,
            sharedCopyEngineCount: a.copy_engines,
            sharedDecoderCount: a.decoders,
            sharedEncoderCount: a.encoders,
            sharedJpegCount: a.jpeg_engines,
            sharedOfaCount: a.ofa_engines,
        };
        // SAFETY: an nvmlComputeInstanceProfileInfo_t out-parameter (module
        // contract).
        unsafe { put(info, value) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceById(
    gpuInstance: nvmlGpuInstance_t,
    id: c_uint,
    computeInstance: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    answer(|l| {
        let h = l.compute_instance_by_id(gpuInstance as usize, id)?;
        // SAFETY: a handle out-parameter (module contract).
        unsafe { put(computeInstance, h as *mut nvmlComputeInstance_st) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo_v2(
    computeInstance: nvmlComputeInstance_t,
    info: *mut nvmlComputeInstanceInfo_t,
) -> nvmlReturn_t {
    answer(|l| {
        let instance = l.compute_instance(computeInstance as usize)?;
        let a = &instance.mig.attributes;
        let profile = compute_instance_profile(a.compute_instance_slices).ok_or(NOT_SUPPORTED)?;
        let value = nvmlComputeInstanceInfo_t {
            device: device_t(instance.card),
            gpuInstance: instance.gpu_instance as *mut nvmlGpuInstance_st,
            id: instance.mig.compute_instance_id,
            profileId: profile,
            placement: nvmlComputeInstancePlacement_t {
                start: 0,
                size: a.compute_instance_slices,
            },
        };
        // SAFETY: an nvmlComputeInstanceInfo_t out-parameter (module
        // contract).
        unsafe { put(info, value) }
    })
}

// ---- Events ----------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    answer(|l| {
        if set.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let h = l.create_set()?;
        // SAFETY: non-null, an event set out-parameter (module contract).
        unsafe { put(set, h as *mut nvmlEventSet_st) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    answer(|l| l.free_set(set as usize))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    eventTypes: *mut c_ulonglong,
) -> nvmlReturn_t {
    // SAFETY: an unsigned long long out-parameter (module contract).
    unsafe { device_answer(device, eventTypes, card_only(|_, _| SUPPORTED_EVENTS)) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    eventTypes: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    answer(|l| l.register(handle(device), eventTypes, set as usize))
}

/// Waits up to `timeoutms` for an event, reading the fault file every
/// [`WAIT_POLL`]; the lock is not held while it sleeps.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeoutms: c_uint,
) -> nvmlReturn_t {
    if data.is_null() {
        return INVALID_ARGUMENT;
    }
    let deadline = Instant::now() + Duration::from_millis(timeoutms.into());
    loop {
        match library().next_event(set as usize) {
            Ok(Some(event)) => {
                let event = nvmlEventData_t {
                    device: device_t(event.device),
                    eventType: event.event_type,
                    eventData: event.event_data,
                    gpuInstanceId: event.gpu_instance_id,
                    computeInstanceId: event.compute_instance_id,
                };
                // SAFETY: non-null, an nvmlEventData_t out-parameter (module
                // contract).
                return match unsafe { put(data, event) } {
                    Ok(()) => SUCCESS,
                    Err(code) => code,
                };
            }
            Ok(None) => {}
            Err(code) => return code,
        }
        let now = Instant::now();
        if now >= deadline {
            return TIMEOUT;
        }
        std::thread::sleep(WAIT_POLL.min(deadline - now));
    }
}

/// Each exported function has the type bindgen gave its nvml.h declaration
/// (nvml-wrapper-sys's `NvmlLib` field): a mismatch does not compile.
fn signatures_are_nvml_h(lib: &sys::NvmlLib) {
    fn same<T, E>(_: &Result<T, E>, _: T) {}
    same(&lib.nvmlInit_v2, nvmlInit_v2);
    same(&lib.nvmlInitWithFlags, nvmlInitWithFlags);
    same(&lib.nvmlShutdown, nvmlShutdown);
    same(&lib.nvmlErrorString, nvmlErrorString);
    same(&lib.nvmlSystemGetDriverVersion, nvmlSystemGetDriverVersion);
    same(&lib.nvmlSystemGetNVMLVersion, nvmlSystemGetNVMLVersion);
    same(
        &lib.nvmlSystemGetCudaDriverVersion,
        nvmlSystemGetCudaDriverVersion,
    );
    same(
        &lib.nvmlSystemGetCudaDriverVersion_v2,
        nvmlSystemGetCudaDriverVersion_v2,
    );
    same(&lib.nvmlDeviceGetCount_v2, nvmlDeviceGetCount_v2);
    same(
        &lib.nvmlDeviceGetHandleByIndex_v2,
        nvmlDeviceGetHandleByIndex_v2,
    );
    same(&lib.nvmlDeviceGetHandleByUUID, nvmlDeviceGetHandleByUUID);
    same(
        &lib.nvmlDeviceGetHandleByPciBusId_v2,
        nvmlDeviceGetHandleByPciBusId_v2,
    );
    same(
        &lib.nvmlDeviceGetMigDeviceHandleByIndex,
        nvmlDeviceGetMigDeviceHandleByIndex,
    );
    same(
        &lib.nvmlDeviceGetDeviceHandleFromMigDeviceHandle,
        nvmlDeviceGetDeviceHandleFromMigDeviceHandle,
    );
    same(
        &lib.nvmlDeviceIsMigDeviceHandle,
        nvmlDeviceIsMigDeviceHandle,
    );
    same(&lib.nvmlDeviceGetIndex, nvmlDeviceGetIndex);
    same(&lib.nvmlDeviceGetMinorNumber, nvmlDeviceGetMinorNumber);
    same(&lib.nvmlDeviceGetUUID, nvmlDeviceGetUUID);
    same(&lib.nvmlDeviceGetName, nvmlDeviceGetName);
    same(&lib.nvmlDeviceGetBrand, nvmlDeviceGetBrand);
    same(&lib.nvmlDeviceGetArchitecture, nvmlDeviceGetArchitecture);
    same(
        &lib.nvmlDeviceGetCudaComputeCapability,
        nvmlDeviceGetCudaComputeCapability,
    );
    same(&lib.nvmlDeviceGetMemoryInfo, nvmlDeviceGetMemoryInfo);
    same(&lib.nvmlDeviceGetMemoryInfo_v2, nvmlDeviceGetMemoryInfo_v2);
    same(&lib.nvmlDeviceGetPciInfo_v3, nvmlDeviceGetPciInfo_v3);
    same(
        &lib.nvmlDeviceGetTopologyCommonAncestor,
        nvmlDeviceGetTopologyCommonAncestor,
    );
    same(&lib.nvmlDeviceGetNvLinkState, nvmlDeviceGetNvLinkState);
    same(
        &lib.nvmlDeviceGetNvLinkRemotePciInfo_v2,
        nvmlDeviceGetNvLinkRemotePciInfo_v2,
    );
    same(&lib.nvmlDeviceGetMigMode, nvmlDeviceGetMigMode);
    same(
        &lib.nvmlDeviceGetMaxMigDeviceCount,
        nvmlDeviceGetMaxMigDeviceCount,
    );
    same(&lib.nvmlDeviceGetGpuInstanceId, nvmlDeviceGetGpuInstanceId);
    same(
        &lib.nvmlDeviceGetComputeInstanceId,
        nvmlDeviceGetComputeInstanceId,
    );
    same(&lib.nvmlDeviceGetAttributes_v2, nvmlDeviceGetAttributes_v2);
    same(
        &lib.nvmlDeviceGetGpuInstanceProfileInfo,
        nvmlDeviceGetGpuInstanceProfileInfo,
    );
    same(
        &lib.nvmlDeviceGetGpuInstanceById,
        nvmlDeviceGetGpuInstanceById,
    );
    same(&lib.nvmlGpuInstanceGetInfo, nvmlGpuInstanceGetInfo);
    same(
        &lib.nvmlGpuInstanceGetComputeInstanceProfileInfo,
        nvmlGpuInstanceGetComputeInstanceProfileInfo,
    );
    same(
        &lib.nvmlGpuInstanceGetComputeInstanceById,
        nvmlGpuInstanceGetComputeInstanceById,
    );
    same(
        &lib.nvmlComputeInstanceGetInfo_v2,
        nvmlComputeInstanceGetInfo_v2,
    );
    same(&lib.nvmlEventSetCreate, nvmlEventSetCreate);
    same(&lib.nvmlEventSetFree, nvmlEventSetFree);
    same(
        &lib.nvmlDeviceGetSupportedEventTypes,
        nvmlDeviceGetSupportedEventTypes,
    );
    same(&lib.nvmlDeviceRegisterEvents, nvmlDeviceRegisterEvents);
    same(&lib.nvmlEventSetWait_v2, nvmlEventSetWait_v2);
}

/// Kept compiled (and the check with it) though nothing calls it.
const _: fn(&sys::NvmlLib) = signatures_are_nvml_h;
