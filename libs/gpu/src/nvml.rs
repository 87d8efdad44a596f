//! The machine as NVML reports it (`nvml-wrapper`). Every call blocks: on an
//! async runtime, read the machine inside `spawn_blocking`.

use nvml_wrapper::Device;
use nvml_wrapper::error::NvmlError;

use crate::{Gpu, GpuSource, Machine, MigDevice, SourceError};

/// NVML, initialised once.
pub struct Nvml {
    nvml: nvml_wrapper::Nvml,
}

fn failed(call: &str) -> impl FnOnce(NvmlError) -> SourceError + '_ {
    move |e| SourceError::Nvml {
        call: call.to_string(),
        message: e.to_string(),
    }
}

impl Nvml {
    /// Loads `libnvidia-ml.so.1` and initialises NVML; says how to run
    /// without a GPU when the library is missing.
    pub fn init() -> Result<Nvml, SourceError> {
        match nvml_wrapper::Nvml::init() {
            Ok(nvml) => Ok(Nvml { nvml }),
            Err(e @ (NvmlError::LibloadingError(_) | NvmlError::FailedToLoadSymbol(_))) => {
                Err(SourceError::NvmlMissing(e.to_string()))
            }
            Err(e @ NvmlError::DriverNotLoaded) => Err(SourceError::NvmlMissing(e.to_string())),
            Err(e) => Err(failed("nvmlInit")(e)),
        }
    }
}

/// `{slices}g.{memory}gb` as NVIDIA names profiles: the instance's share of
/// the card's memory rounded up to eighths, times the card's memory in GiB
/// (rounded up), rounded.
pub fn profile(gpu_instance_slices: u32, memory_mib: u64, card_memory_mib: u64) -> String {
    let eighths = (memory_mib * 8).div_ceil(card_memory_mib.max(1));
    let card_gib = card_memory_mib.div_ceil(1024);
    // round(eighths / 8 * card_gib)
    let gb = (eighths * card_gib * 2 + 8) / 16;
    format!("{gpu_instance_slices}g.{gb}gb")
}

fn mig_device(
    index: u32,
    device: &Device<'_>,
    card_memory_mib: u64,
) -> Result<MigDevice, SourceError> {
    let attributes = device
        .attributes()
        .map_err(failed("nvmlDeviceGetAttributes"))?;
    Ok(MigDevice {
        index,
        uuid: device.uuid().map_err(failed("nvmlDeviceGetUUID"))?,
        profile: profile(
            attributes.gpu_instance_slice_count,
            attributes.memory_size_mb,
            card_memory_mib,
        ),
        multiprocessors: attributes.multiprocessor_count,
        copy_engines: attributes.shared_copy_engine_count,
        decoders: attributes.shared_decoder_count,
        encoders: attributes.shared_encoder_count,
        jpeg_engines: attributes.shared_jpeg_count,
        ofa_engines: attributes.shared_ofa_count,
        memory_mib: attributes.memory_size_mb,
    })
}

impl GpuSource for Nvml {
    fn watch_health(
        &self,
        sink: &mut dyn FnMut(crate::HealthChange) -> bool,
    ) -> Result<(), SourceError> {
        self.watch_critical_xids(sink)
    }

    fn machine(&self) -> Result<Machine, SourceError> {
        let nvml = &self.nvml;
        let cuda = nvml
            .sys_cuda_driver_version()
            .map_err(failed("nvmlSystemGetCudaDriverVersion"))?;
        let mut gpus = Vec::new();
        let count = nvml.device_count().map_err(failed("nvmlDeviceGetCount"))?;
        for i in 0..count {
            let device = nvml
                .device_by_index(i)
                .map_err(failed("nvmlDeviceGetHandleByIndex"))?;
            let capability = device
                .cuda_compute_capability()
                .map_err(failed("nvmlDeviceGetCudaComputeCapability"))?;
            // Cards without MIG answer NotSupported.
            let mig = match device.mig_mode() {
                Ok(mode) => Some(mode.current == 1),
                Err(NvmlError::NotSupported) => None,
                Err(e) => return Err(failed("nvmlDeviceGetMigMode")(e)),
            };
            let memory_mib = device
                .memory_info()
                .map_err(failed("nvmlDeviceGetMemoryInfo"))?
                .total
                / (1024 * 1024);
            let mut mig_devices = Vec::new();
            if mig == Some(true) {
                let max = device
                    .mig_device_count()
                    .map_err(failed("nvmlDeviceGetMaxMigDeviceCount"))?;
                for m in 0..max {
                    match device.mig_device_by_index(m) {
                        Ok(handle) => mig_devices.push(mig_device(m, &handle, memory_mib)?),
                        // Unused slots answer NotFound.
                        Err(NvmlError::NotFound) => continue,
                        Err(e) => return Err(failed("nvmlDeviceGetMigDeviceHandleByIndex")(e)),
                    }
                }
            }
            gpus.push(Gpu {
                index: device.index().map_err(failed("nvmlDeviceGetIndex"))?,
                uuid: device.uuid().map_err(failed("nvmlDeviceGetUUID"))?,
                product_name: device.name().map_err(failed("nvmlDeviceGetName"))?,
                brand: format!(
                    "{:?}",
                    device.brand().map_err(failed("nvmlDeviceGetBrand"))?
                ),
                architecture: device
                    .architecture()
                    .map_err(failed("nvmlDeviceGetArchitecture"))?
                    .to_string(),
                compute_capability: format!("{}.{}", capability.major, capability.minor),
                memory_mib,
                pci_bus_id: device
                    .pci_info()
                    .map_err(failed("nvmlDeviceGetPciInfo"))?
                    .bus_id,
                mig_capable: mig.is_some(),
                mig_enabled: mig == Some(true),
                mig_devices,
                healthy: true,
            });
        }
        Ok(Machine {
            driver_version: nvml
                .sys_driver_version()
                .map_err(failed("nvmlSystemGetDriverVersion"))?,
            cuda_driver_version: format!("{}.{}", cuda / 1000, (cuda % 1000) / 10),
            gpus,
        })
    }
}

/// XIDs NVIDIA's own device plugin treats as the application's fault, not
/// the card's: they do not make a card unhealthy.
const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

impl Nvml {
    /// The health loop: critical XID errors on any card, waited for in
    /// 5-second slices so that `sink` can stop it.
    pub fn watch_critical_xids(
        &self,
        sink: &mut dyn FnMut(crate::HealthChange) -> bool,
    ) -> Result<(), SourceError> {
        use nvml_wrapper::bitmasks::event::EventTypes;
        use nvml_wrapper::enums::event::XidError;
        let mut set = self
            .nvml
            .create_event_set()
            .map_err(failed("nvmlEventSetCreate"))?;
        let count = self
            .nvml
            .device_count()
            .map_err(failed("nvmlDeviceGetCount"))?;
        // The cards' UUIDs by index, to name a card that is lost later.
        let mut uuids = Vec::new();
        for i in 0..count {
            let device = self
                .nvml
                .device_by_index(i)
                .map_err(failed("nvmlDeviceGetHandleByIndex"))?;
            uuids.push(device.uuid().map_err(failed("nvmlDeviceGetUUID"))?);
            set = device
                .register_events(EventTypes::CRITICAL_XID_ERROR, set)
                .map_err(|e| SourceError::Nvml {
                    call: "nvmlDeviceRegisterEvents".into(),
                    message: e.to_string(),
                })?;
        }
        loop {
            match set.wait(5000) {
                Ok(event) => {
                    let xid = match event.event_data {
                        Some(XidError::Value(x)) => x,
                        _ => 0,
                    };
                    if APPLICATION_XIDS.contains(&xid) {
                        continue;
                    }
                    let uuid = event.device.uuid().map_err(failed("nvmlDeviceGetUUID"))?;
                    let change = crate::HealthChange {
                        uuid,
                        healthy: false,
                        reason: format!("XID {xid}"),
                    };
                    if !sink(change) {
                        return Ok(());
                    }
                }
                Err(NvmlError::Timeout) => {
                    // A no-op change asks whether the watch is still wanted.
                    if !sink(crate::HealthChange::probe()) {
                        return Ok(());
                    }
                }
                Err(NvmlError::GpuLost) => {
                    // The wait does not say which card: each card is asked
                    // again, and those that answer GPU lost are the ones.
                    // If none does, all are suspect (an empty UUID).
                    let mut lost: Vec<String> = uuids
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| {
                            let answer =
                                self.nvml.device_by_index(*i as u32).and_then(|d| d.uuid());
                            matches!(answer, Err(NvmlError::GpuLost))
                        })
                        .map(|(_, uuid)| uuid.clone())
                        .collect();
                    if lost.is_empty() {
                        lost.push(String::new());
                    }
                    for uuid in lost {
                        let change = crate::HealthChange {
                            uuid,
                            healthy: false,
                            reason: "GPU lost (fallen off the bus)".into(),
                        };
                        if !sink(change) {
                            return Ok(());
                        }
                    }
                }
                Err(e) => return Err(failed("nvmlEventSetWait")(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn profiles_are_named_as_nvidia_names_them() {
        // A100 40GB and H100 80GB MIG memory sizes as NVML reports them.
        assert_eq!(super::profile(1, 4864, 40960), "1g.5gb");
        assert_eq!(super::profile(2, 9856, 40960), "2g.10gb");
        assert_eq!(super::profile(3, 19968, 40960), "3g.20gb");
        assert_eq!(super::profile(7, 40192, 40960), "7g.40gb");
        assert_eq!(super::profile(1, 9856, 81559), "1g.10gb");
        assert_eq!(super::profile(1, 19968, 81559), "1g.20gb");
        assert_eq!(super::profile(3, 40192, 81559), "3g.40gb");
        assert_eq!(super::profile(7, 80896, 81559), "7g.80gb");
    }
}
