//! The mock NVML read the way the node agent reads NVML:
//! `switchyard_gpu::nvml::Nvml`, nvml-wrapper dlopening `libnvidia-ml.so.1`
//! (the built library, linked under that name into a folder put first on
//! `LD_LIBRARY_PATH`).
//!
//! Each case runs in a child process, this test binary run again for its
//! `child` test alone: the machine comes from the environment and the
//! library keeps it for the process's life.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};
use switchyard_gpu::{GpuSource, HealthChange, Machine};
use switchyard_nvml_mock::faults::Fault;
use switchyard_nvml_mock::{FAULTS_ENV, MACHINE_ENV, SONAME};

/// Set in a child: what it does, `reader` or `abi`.
const ROLE_ENV: &str = "NVML_MOCK_TEST_ROLE";
/// Set in a reader: the health changes to wait for (0: none).
const CHANGES_ENV: &str = "NVML_MOCK_TEST_CHANGES";
/// Set in a reader: fault lines to append once the health watch is waiting
/// (at its first probe, which comes after it registered for events).
const INJECT_ENV: &str = "NVML_MOCK_TEST_INJECT";
/// How the child's report line starts on its stdout.
const REPORT: &str = "nvml-mock-report: ";
/// How long a child may take: a health case waits out one of the watch's
/// 5-second slices.
const DEADLINE: Duration = Duration::from_secs(60);

/// The child's side, which does nothing unless [`run`] runs it: reads the
/// machine through NVML or calls the C functions, then prints what it saw.
#[test]
fn child() {
    let report = match std::env::var(ROLE_ENV).as_deref() {
        Ok("reader") => read_through_switchyard_gpu(),
        Ok("abi") => call_the_c_functions(),
        _ => return,
    };
    println!("{REPORT}{report}");
}

/// The machine as `switchyard_gpu::nvml::Nvml` reads it and, if asked, the
/// health changes its watch reports, applied.
fn read_through_switchyard_gpu() -> Value {
    let wanted: usize = std::env::var(CHANGES_ENV).unwrap().parse().unwrap();
    let nvml = match switchyard_gpu::nvml::Nvml::init() {
        Ok(nvml) => nvml,
        Err(e) => return json!({"error": e.to_string()}),
    };
    let mut machine = nvml.machine().unwrap();
    let mut seen = Vec::new();
    let mut inject = std::env::var(INJECT_ENV).ok();
    if wanted > 0 {
        nvml.watch_health(&mut |change: HealthChange| {
            if change.is_probe() {
                if let Some(lines) = inject.take() {
                    let path = std::env::var_os(FAULTS_ENV).unwrap();
                    let mut file = std::fs::OpenOptions::new()
                        .append(true)
                        .create(true)
                        .open(path)
                        .unwrap();
                    file.write_all(lines.as_bytes()).unwrap();
                }
                return true;
            }
            machine.apply(&change);
            seen.push(json!([change.uuid, change.healthy, change.reason]));
            seen.len() < wanted
        })
        .unwrap();
    }
    let after = nvml.machine().map_err(|e| e.to_string()).err();
    json!({"machine": machine, "changes": seen, "errorAfter": after})
}

/// What the C functions answer where nvml-wrapper's reader does not ask:
/// short buffers, wrong struct versions, MIG handles, the wait's timeout.
fn call_the_c_functions() -> Value {
    use nvml_wrapper_sys::bindings::*;
    use std::ffi::{CStr, c_char, c_uint};
    use std::ptr::null_mut;

    // SAFETY: the library is the mock, loaded by the name NVML's users load
    // it by; every call below passes what nvml.h asks for: live
    // out-parameters of the declared types and buffers of the lengths given.
    unsafe {
        let lib = NvmlLib::new(SONAME).unwrap();
        let text = |buffer: &[c_char]| {
            CStr::from_ptr(buffer.as_ptr())
                .to_str()
                .unwrap()
                .to_string()
        };
        let init = lib.nvmlInit_v2.as_ref().unwrap()();
        let mut card: nvmlDevice_t = null_mut();
        lib.nvmlDeviceGetHandleByIndex_v2.as_ref().unwrap()(0, &mut card);
        let mut short = [0 as c_char; 10];
        let uuid_short = lib.nvmlDeviceGetUUID.as_ref().unwrap()(card, short.as_mut_ptr(), 10);
        let mut attributes: nvmlDeviceAttributes_t = std::mem::zeroed();
        let card_attributes =
            lib.nvmlDeviceGetAttributes_v2.as_ref().unwrap()(card, &mut attributes);

        let mut mig: nvmlDevice_t = null_mut();
        let mig_by_index =
            lib.nvmlDeviceGetMigDeviceHandleByIndex.as_ref().unwrap()(card, 0, &mut mig);
        let mut is_mig: c_uint = 0;
        lib.nvmlDeviceIsMigDeviceHandle.as_ref().unwrap()(mig, &mut is_mig);
        let mut parent: nvmlDevice_t = null_mut();
        lib.nvmlDeviceGetDeviceHandleFromMigDeviceHandle
            .as_ref()
            .unwrap()(mig, &mut parent);
        let mut name = [0 as c_char; NVML_DEVICE_NAME_V2_BUFFER_SIZE as usize];
        lib.nvmlDeviceGetName.as_ref().unwrap()(mig, name.as_mut_ptr(), name.len() as u32);
        let mut uuid = [0 as c_char; NVML_DEVICE_UUID_V2_BUFFER_SIZE as usize];
        lib.nvmlDeviceGetUUID.as_ref().unwrap()(mig, uuid.as_mut_ptr(), uuid.len() as u32);
        let mut by_uuid: nvmlDevice_t = null_mut();
        lib.nvmlDeviceGetHandleByUUID.as_ref().unwrap()(uuid.as_ptr(), &mut by_uuid);
        let (mut gi, mut ci): (c_uint, c_uint) = (99, 99);
        lib.nvmlDeviceGetGpuInstanceId.as_ref().unwrap()(mig, &mut gi);
        lib.nvmlDeviceGetComputeInstanceId.as_ref().unwrap()(mig, &mut ci);
        lib.nvmlDeviceGetAttributes_v2.as_ref().unwrap()(mig, &mut attributes);

        // The way go-nvlib names a MIG device's profile (GPU Feature
        // Discovery and NVIDIA's device plugin with the mixed strategy):
        // its GPU and compute instances' info, matched against the
        // profiles' info.
        let mut gpu_instance: nvmlGpuInstance_t = null_mut();
        let gi_by_id =
            lib.nvmlDeviceGetGpuInstanceById.as_ref().unwrap()(card, gi, &mut gpu_instance);
        let mut gi_info: nvmlGpuInstanceInfo_t = std::mem::zeroed();
        let gi_info_code = lib.nvmlGpuInstanceGetInfo.as_ref().unwrap()(gpu_instance, &mut gi_info);
        let gi_profile = lib.nvmlDeviceGetGpuInstanceProfileInfo.as_ref().unwrap();
        let mut gi_profiles = Vec::new();
        for profile in [
            NVML_GPU_INSTANCE_PROFILE_1_SLICE,
            NVML_GPU_INSTANCE_PROFILE_7_SLICE,
            NVML_GPU_INSTANCE_PROFILE_COUNT,
        ] {
            let mut info: nvmlGpuInstanceProfileInfo_t = std::mem::zeroed();
            let code = gi_profile(card, profile, &mut info);
            gi_profiles.push(json!([
                code,
                info.id,
                info.sliceCount,
                info.instanceCount,
                info.memorySizeMB
            ]));
        }
        let mut compute_instance: nvmlComputeInstance_t = null_mut();
        let ci_by_id = lib.nvmlGpuInstanceGetComputeInstanceById.as_ref().unwrap()(
            gpu_instance,
            ci,
            &mut compute_instance,
        );
        let mut ci_info: nvmlComputeInstanceInfo_t = std::mem::zeroed();
        let ci_info_code =
            lib.nvmlComputeInstanceGetInfo_v2.as_ref().unwrap()(compute_instance, &mut ci_info);
        let ci_profile = lib
            .nvmlGpuInstanceGetComputeInstanceProfileInfo
            .as_ref()
            .unwrap();
        let mut ci_profiles = Vec::new();
        for (profile, engines) in [
            (NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, 0),
            (NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE, 0),
            (NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, 1),
        ] {
            let mut info: nvmlComputeInstanceProfileInfo_t = std::mem::zeroed();
            let code = ci_profile(gpu_instance, profile, engines, &mut info);
            ci_profiles.push(json!([
                code,
                info.id,
                info.sliceCount,
                info.multiprocessorCount
            ]));
        }
        let gi_of_mig = lib.nvmlGpuInstanceGetInfo.as_ref().unwrap()(mig.cast(), &mut gi_info);

        let mut memory: nvmlMemory_v2_t = std::mem::zeroed();
        let memory_unversioned =
            lib.nvmlDeviceGetMemoryInfo_v2.as_ref().unwrap()(card, &mut memory);
        memory.version = (std::mem::size_of::<nvmlMemory_v2_t>() | (2 << 24)) as u32;
        let memory_v2 = lib.nvmlDeviceGetMemoryInfo_v2.as_ref().unwrap()(card, &mut memory);
        let mut pci: nvmlPciInfo_t = std::mem::zeroed();
        lib.nvmlDeviceGetPciInfo_v3.as_ref().unwrap()(card, &mut pci);

        // What NVIDIA's device plugin asks for a preferred allocation.
        let mut card4: nvmlDevice_t = null_mut();
        lib.nvmlDeviceGetHandleByIndex_v2.as_ref().unwrap()(4, &mut card4);
        let mut card7: nvmlDevice_t = null_mut();
        lib.nvmlDeviceGetHandleByIndex_v2.as_ref().unwrap()(7, &mut card7);
        let ancestor = lib.nvmlDeviceGetTopologyCommonAncestor.as_ref().unwrap();
        let mut levels = Vec::new();
        for (a, b) in [(card, card4), (card4, card7), (card7, card7), (mig, card)] {
            let mut level: nvmlGpuTopologyLevel_t = 99;
            let code = ancestor(a, b, &mut level);
            levels.push([code, level]);
        }
        let ancestor_null = ancestor(card, card4, null_mut());
        let mut state: nvmlEnableState_t = 99;
        let mut nvlink_states = Vec::new();
        for link in [0, NVML_NVLINK_MAX_LINKS - 1, NVML_NVLINK_MAX_LINKS] {
            nvlink_states.push(lib.nvmlDeviceGetNvLinkState.as_ref().unwrap()(
                card4, link, &mut state,
            ));
        }
        let nvlink_state_null =
            lib.nvmlDeviceGetNvLinkState.as_ref().unwrap()(card4, 0, null_mut());
        let mut remote: nvmlPciInfo_t = std::mem::zeroed();
        let nvlink_remote =
            lib.nvmlDeviceGetNvLinkRemotePciInfo_v2.as_ref().unwrap()(card4, 0, &mut remote);

        let mut set: nvmlEventSet_t = null_mut();
        lib.nvmlEventSetCreate.as_ref().unwrap()(&mut set);
        let mut data: nvmlEventData_t = std::mem::zeroed();
        let started = std::time::Instant::now();
        let wait = lib.nvmlEventSetWait_v2.as_ref().unwrap()(set, &mut data, 300);
        let waited_ms = started.elapsed().as_millis();
        let free = lib.nvmlEventSetFree.as_ref().unwrap()(set);
        let lost = CStr::from_ptr(lib.nvmlErrorString.as_ref().unwrap()(
            nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST,
        ));
        let shutdown = lib.nvmlShutdown.as_ref().unwrap()();
        let mut count: c_uint = 0;
        let count_after = lib.nvmlDeviceGetCount_v2.as_ref().unwrap()(&mut count);
        json!({
            "init": init,
            "uuidShort": uuid_short,
            "cardAttributes": card_attributes,
            "migByIndex": mig_by_index,
            "isMig": is_mig,
            "parentIsCard": parent == card,
            "byUuidIsMig": by_uuid == mig,
            "migName": text(&name),
            "instances": [gi, ci],
            "migAttributes": [attributes.gpuInstanceSliceCount, attributes.multiprocessorCount, attributes.memorySizeMB],
            "giById": gi_by_id,
            "giInfo": [gi_info_code, gi_info.device == card, gi_info.id, gi_info.profileId],
            "giProfiles": gi_profiles,
            "ciById": ci_by_id,
            "ciInfo": [ci_info_code, ci_info.device == card, ci_info.gpuInstance == gpu_instance, ci_info.id, ci_info.profileId, ci_info.placement.size],
            "ciProfiles": ci_profiles,
            "giOfMig": gi_of_mig,
            "memoryUnversioned": memory_unversioned,
            "memoryV2": [memory_v2, memory.total, memory.free],
            "pci": [text(&pci.busId), text(&pci.busIdLegacy), pci.domain, pci.bus, pci.device],
            "commonAncestor": levels,
            "commonAncestorNull": ancestor_null,
            "nvlinkState": nvlink_states,
            "nvlinkStateUntouched": state,
            "nvlinkStateNull": nvlink_state_null,
            "nvlinkRemotePci": nvlink_remote,
            "wait": wait,
            "waitedMs": waited_ms,
            "free": free,
            "lost": lost.to_str().unwrap(),
            "shutdown": shutdown,
            "countAfter": count_after,
        })
    }
}

/// The built library, linked as `libnvidia-ml.so.1` into a folder of its own.
fn library_dir() -> tempfile::TempDir {
    // Integration tests run from the folder cargo builds the crate's
    // libraries into.
    let built = std::env::current_exe()
        .unwrap()
        .with_file_name("libswitchyard_nvml_mock.so");
    assert!(
        built.is_file(),
        "{} is missing: cargo builds it with this test",
        built.display()
    );
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(&built, dir.path().join(SONAME)).unwrap();
    dir
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/fixtures")
        .join(name)
}

fn fixture_machine(path: &Path) -> Machine {
    switchyard_gpu::Fixture::load(path)
        .unwrap()
        .machine()
        .unwrap()
}

struct Child {
    report: Value,
    stderr: String,
}

/// Runs the `child` test in a process of its own, on the mock library, with
/// `env`; its report and stderr, or a panic past [`DEADLINE`].
fn run(env: &[(&str, OsString)]) -> Child {
    let libraries = library_dir();
    let mut path = OsString::from(libraries.path());
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        path.push(":");
        path.push(old);
    }
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", "child", "--nocapture", "--test-threads", "1"])
        .env("LD_LIBRARY_PATH", path)
        .env_remove(MACHINE_ENV)
        .env_remove(FAULTS_ENV)
        .env_remove(INJECT_ENV)
        .env(ROLE_ENV, "reader")
        .env(CHANGES_ENV, "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let (done, outputs) = mpsc::channel();
    let err_done = done.clone();
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        let _ = done.send((true, s));
    });
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        let _ = err_done.send((false, s));
    });
    // Both pipes close when the child exits.
    let (mut out, mut err) = (String::new(), String::new());
    for _ in 0..2 {
        match outputs.recv_timeout(DEADLINE) {
            Ok((true, s)) => out = s,
            Ok((false, s)) => err = s,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the child ran past {DEADLINE:?}; stdout so far:\n{out}\nstderr:\n{err}");
            }
        }
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "the child failed: {status}\n{out}\n{err}");
    let report = out
        .lines()
        .find_map(|l| l.split_once(REPORT).map(|(_, report)| report))
        .unwrap_or_else(|| panic!("no report from the child:\n{out}\n{err}"));
    Child {
        report: serde_json::from_str(report).unwrap(),
        stderr: err,
    }
}

fn machine_of(report: &Value) -> Machine {
    serde_json::from_value(report["machine"].clone()).unwrap_or_else(|e| panic!("{e}: {report:#}"))
}

#[test]
fn each_fixture_reads_back_through_nvml_as_the_same_machine() {
    for name in ["h100-8x.yaml", "a100-8x-mig.yaml", "mixed.yaml"] {
        let path = fixture(name);
        let expected = fixture_machine(&path);
        // NVML tells an unhealthy card through the health watch: wait for
        // as many changes as the fixture has unhealthy cards.
        let unhealthy = expected.gpus.iter().filter(|g| !g.healthy).count();
        let child = run(&[
            (MACHINE_ENV, path.clone().into()),
            (CHANGES_ENV, unhealthy.to_string().into()),
        ]);
        assert_eq!(
            machine_of(&child.report),
            expected,
            "{name}: {:#}\n{}",
            child.report,
            child.stderr
        );
    }
}

#[test]
fn an_inconsistent_fixture_is_refused_at_init_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(fixture("mixed.yaml")).unwrap();
    let cases = [
        // Held to what NVML can report by the mock.
        (
            text.replacen("brand: Nvidia", "brand: NVIDIA", 1),
            "gpus[0].brand",
        ),
        (
            text.replacen("profile: 7g.40gb", "profile: 7g.80gb", 1),
            "gpus[0].migDevices[0].profile",
        ),
        // Refused by switchyard_gpu::Fixture::load.
        (text.replacen("index: 1", "index: 0", 1), "gpus[1].index"),
    ];
    for (i, (yaml, field)) in cases.into_iter().enumerate() {
        assert_ne!(yaml, text, "case {i} changes the fixture");
        let path = dir.path().join(format!("case-{i}.yaml"));
        std::fs::write(&path, yaml).unwrap();
        let child = run(&[(MACHINE_ENV, path.into())]);
        let error = child.report["error"].as_str().unwrap_or_default();
        assert!(error.contains("nvmlInit"), "{:#}", child.report);
        assert!(
            child.stderr.contains("nvmlInit refused") && child.stderr.contains(field),
            "stderr does not name {field}:\n{}",
            child.stderr
        );
    }
}

#[test]
fn without_a_machine_nvml_is_missing_and_the_variable_is_named() {
    let child = run(&[]);
    let error = child.report["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("NVML is not available on this machine"),
        "{:#}",
        child.report
    );
    assert!(child.stderr.contains(MACHINE_ENV), "{}", child.stderr);
}

/// The health watch on the A100 fixture, with `faults` appended once it
/// waits; the first health change it reports and the machine read after.
fn watch(faults: &[Fault]) -> (Value, Value) {
    let dir = tempfile::tempdir().unwrap();
    let lines: String = faults.iter().map(|f| format!("{f}\n")).collect();
    let child = run(&[
        (MACHINE_ENV, fixture("a100-8x-mig.yaml").into()),
        (FAULTS_ENV, dir.path().join("faults").into()),
        (CHANGES_ENV, "1".into()),
        (INJECT_ENV, lines.into()),
    ]);
    (
        child.report["changes"][0].clone(),
        child.report["errorAfter"].clone(),
    )
}

fn card(index: usize) -> String {
    fixture_machine(&fixture("a100-8x-mig.yaml")).gpus[index]
        .uuid
        .clone()
}

#[test]
fn a_lost_card_is_an_unhealthy_change_and_its_calls_fail() {
    let (change, after) = watch(&[Fault::Lost { uuid: card(5) }]);
    // The watch asks each card again and names the one that is lost.
    assert_eq!(
        change,
        json!([card(5), false, "GPU lost (fallen off the bus)"])
    );
    let after = after.as_str().unwrap_or_default();
    assert!(after.contains("fell off the bus"), "{after}");
}

#[test]
fn a_critical_xid_makes_its_card_unhealthy() {
    let (change, after) = watch(&[Fault::Xid {
        uuid: card(2),
        xid: 79,
    }]);
    assert_eq!(change, json!([card(2), false, "XID 79"]));
    assert_eq!(after, Value::Null, "the card still answers");
}

#[test]
fn an_application_xid_leaves_its_card_healthy() {
    // XID 13 on card 0, then a critical one on card 1: the first change the
    // watch reports is card 1's.
    let (change, _) = watch(&[
        Fault::Xid {
            uuid: card(0),
            xid: 13,
        },
        Fault::Xid {
            uuid: card(1),
            xid: 79,
        },
    ]);
    assert_eq!(change, json!([card(1), false, "XID 79"]));
}

#[test]
fn the_library_exports_what_nvml_wrapper_loads() {
    let libraries = library_dir();
    // SAFETY: loading the mock runs no initialiser of its own; nothing is
    // called through the symbols.
    let lib =
        unsafe { nvml_wrapper_sys::bindings::NvmlLib::new(libraries.path().join(SONAME)) }.unwrap();
    let exported = [
        ("nvmlInit_v2", lib.nvmlInit_v2.is_ok()),
        ("nvmlInitWithFlags", lib.nvmlInitWithFlags.is_ok()),
        ("nvmlShutdown", lib.nvmlShutdown.is_ok()),
        ("nvmlErrorString", lib.nvmlErrorString.is_ok()),
        (
            "nvmlSystemGetDriverVersion",
            lib.nvmlSystemGetDriverVersion.is_ok(),
        ),
        (
            "nvmlSystemGetNVMLVersion",
            lib.nvmlSystemGetNVMLVersion.is_ok(),
        ),
        (
            "nvmlSystemGetCudaDriverVersion",
            lib.nvmlSystemGetCudaDriverVersion.is_ok(),
        ),
        (
            "nvmlSystemGetCudaDriverVersion_v2",
            lib.nvmlSystemGetCudaDriverVersion_v2.is_ok(),
        ),
        ("nvmlDeviceGetCount_v2", lib.nvmlDeviceGetCount_v2.is_ok()),
        (
            "nvmlDeviceGetHandleByIndex_v2",
            lib.nvmlDeviceGetHandleByIndex_v2.is_ok(),
        ),
        (
            "nvmlDeviceGetHandleByUUID",
            lib.nvmlDeviceGetHandleByUUID.is_ok(),
        ),
        (
            "nvmlDeviceGetHandleByPciBusId_v2",
            lib.nvmlDeviceGetHandleByPciBusId_v2.is_ok(),
        ),
        ("nvmlDeviceGetIndex", lib.nvmlDeviceGetIndex.is_ok()),
        ("nvmlDeviceGetUUID", lib.nvmlDeviceGetUUID.is_ok()),
        ("nvmlDeviceGetName", lib.nvmlDeviceGetName.is_ok()),
        ("nvmlDeviceGetBrand", lib.nvmlDeviceGetBrand.is_ok()),
        (
            "nvmlDeviceGetArchitecture",
            lib.nvmlDeviceGetArchitecture.is_ok(),
        ),
        (
            "nvmlDeviceGetCudaComputeCapability",
            lib.nvmlDeviceGetCudaComputeCapability.is_ok(),
        ),
        (
            "nvmlDeviceGetMemoryInfo",
            lib.nvmlDeviceGetMemoryInfo.is_ok(),
        ),
        (
            "nvmlDeviceGetMemoryInfo_v2",
            lib.nvmlDeviceGetMemoryInfo_v2.is_ok(),
        ),
        (
            "nvmlDeviceGetPciInfo_v3",
            lib.nvmlDeviceGetPciInfo_v3.is_ok(),
        ),
        (
            "nvmlDeviceGetMinorNumber",
            lib.nvmlDeviceGetMinorNumber.is_ok(),
        ),
        (
            "nvmlDeviceGetTopologyCommonAncestor",
            lib.nvmlDeviceGetTopologyCommonAncestor.is_ok(),
        ),
        (
            "nvmlDeviceGetNvLinkState",
            lib.nvmlDeviceGetNvLinkState.is_ok(),
        ),
        (
            "nvmlDeviceGetNvLinkRemotePciInfo_v2",
            lib.nvmlDeviceGetNvLinkRemotePciInfo_v2.is_ok(),
        ),
        ("nvmlDeviceGetMigMode", lib.nvmlDeviceGetMigMode.is_ok()),
        (
            "nvmlDeviceGetMaxMigDeviceCount",
            lib.nvmlDeviceGetMaxMigDeviceCount.is_ok(),
        ),
        (
            "nvmlDeviceGetMigDeviceHandleByIndex",
            lib.nvmlDeviceGetMigDeviceHandleByIndex.is_ok(),
        ),
        (
            "nvmlDeviceIsMigDeviceHandle",
            lib.nvmlDeviceIsMigDeviceHandle.is_ok(),
        ),
        (
            "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
            lib.nvmlDeviceGetDeviceHandleFromMigDeviceHandle.is_ok(),
        ),
        (
            "nvmlDeviceGetGpuInstanceId",
            lib.nvmlDeviceGetGpuInstanceId.is_ok(),
        ),
        (
            "nvmlDeviceGetComputeInstanceId",
            lib.nvmlDeviceGetComputeInstanceId.is_ok(),
        ),
        (
            "nvmlDeviceGetAttributes_v2",
            lib.nvmlDeviceGetAttributes_v2.is_ok(),
        ),
        (
            "nvmlDeviceGetGpuInstanceProfileInfo",
            lib.nvmlDeviceGetGpuInstanceProfileInfo.is_ok(),
        ),
        (
            "nvmlDeviceGetGpuInstanceById",
            lib.nvmlDeviceGetGpuInstanceById.is_ok(),
        ),
        ("nvmlGpuInstanceGetInfo", lib.nvmlGpuInstanceGetInfo.is_ok()),
        (
            "nvmlGpuInstanceGetComputeInstanceProfileInfo",
            lib.nvmlGpuInstanceGetComputeInstanceProfileInfo.is_ok(),
        ),
        (
            "nvmlGpuInstanceGetComputeInstanceById",
            lib.nvmlGpuInstanceGetComputeInstanceById.is_ok(),
        ),
        (
            "nvmlComputeInstanceGetInfo_v2",
            lib.nvmlComputeInstanceGetInfo_v2.is_ok(),
        ),
        ("nvmlEventSetCreate", lib.nvmlEventSetCreate.is_ok()),
        (
            "nvmlDeviceRegisterEvents",
            lib.nvmlDeviceRegisterEvents.is_ok(),
        ),
        (
            "nvmlDeviceGetSupportedEventTypes",
            lib.nvmlDeviceGetSupportedEventTypes.is_ok(),
        ),
        ("nvmlEventSetWait_v2", lib.nvmlEventSetWait_v2.is_ok()),
        ("nvmlEventSetFree", lib.nvmlEventSetFree.is_ok()),
    ];
    let missing: Vec<&str> = exported
        .iter()
        .filter(|(_, ok)| !ok)
        .map(|(name, _)| *name)
        .collect();
    assert!(missing.is_empty(), "not exported: {missing:?}");
}

#[test]
fn the_c_functions_answer_as_nvml_h_says() {
    let child = run(&[
        (ROLE_ENV, "abi".into()),
        (MACHINE_ENV, fixture("a100-8x-mig.yaml").into()),
    ]);
    let r = &child.report;
    assert_eq!(r["init"], 0, "{r:#}\n{}", child.stderr);
    assert_eq!(r["uuidShort"], 7, "NVML_ERROR_INSUFFICIENT_SIZE");
    assert_eq!(
        r["cardAttributes"], 3,
        "NVML_ERROR_NOT_SUPPORTED: MIG devices only"
    );
    assert_eq!(r["migByIndex"], 0);
    assert_eq!(r["isMig"], 1);
    assert_eq!(r["parentIsCard"], true);
    assert_eq!(r["byUuidIsMig"], true);
    assert_eq!(r["migName"], "NVIDIA A100-SXM4-40GB MIG 1g.5gb");
    assert_eq!(r["instances"], json!([0, 0]));
    assert_eq!(r["migAttributes"], json!([1, 14, 4864]));
    assert_eq!(r["giById"], 0);
    assert_eq!(r["giInfo"], json!([0, true, 0, 19]), "1g.5gb's id is 19");
    assert_eq!(
        r["giProfiles"],
        json!([[0, 19, 1, 7, 4864], [3, 0, 0, 0, 0], [2, 0, 0, 0, 0]]),
        "1g.5gb; no 7g on the card (NOT_SUPPORTED); past the count (INVALID_ARGUMENT)"
    );
    assert_eq!(r["ciById"], 0);
    assert_eq!(r["ciInfo"], json!([0, true, true, 0, 0, 1]));
    assert_eq!(
        r["ciProfiles"],
        json!([[0, 0, 1, 14], [3, 0, 0, 0], [2, 0, 0, 0]]),
        "the compute instance spans its GPU instance; one engine profile"
    );
    assert_eq!(r["giOfMig"], 2, "a MIG device is no GPU instance handle");
    assert_eq!(
        r["memoryUnversioned"], 25,
        "NVML_ERROR_ARGUMENT_VERSION_MISMATCH"
    );
    let total = 40960u64 << 20;
    assert_eq!(r["memoryV2"], json!([0, total, total]));
    assert_eq!(
        r["pci"],
        json!(["00000000:07:00.0", "0000:07:00.0", 0, 7, 0])
    );
    // Cards 0 and 4 (buses 07 and 87) behind two CPUs, 4 and 7 (87, BD)
    // behind one; a MIG device has no place of its own.
    assert_eq!(
        r["commonAncestor"],
        json!([[0, 50], [0, 40], [0, 0], [3, 99]]),
        "SYSTEM, NODE, INTERNAL, NVML_ERROR_NOT_SUPPORTED"
    );
    assert_eq!(r["commonAncestorNull"], 2, "NVML_ERROR_INVALID_ARGUMENT");
    assert_eq!(
        r["nvlinkState"],
        json!([3, 3, 2]),
        "no NVLinks; link 18 is past NVML_NVLINK_MAX_LINKS"
    );
    assert_eq!(r["nvlinkStateUntouched"], 99);
    assert_eq!(r["nvlinkStateNull"], 2);
    assert_eq!(r["nvlinkRemotePci"], 3);
    assert_eq!(r["wait"], 10, "NVML_ERROR_TIMEOUT");
    let waited = r["waitedMs"].as_u64().unwrap();
    assert!((300..5000).contains(&waited), "waited {waited} ms of 300");
    assert_eq!(r["free"], 0);
    assert_eq!(r["lost"], "GPU is lost");
    assert_eq!(r["shutdown"], 0);
    assert_eq!(r["countAfter"], 1, "NVML_ERROR_UNINITIALIZED");
}
