//! Compiles the kubelet's plugin protos (proto/kubelet/) with protox, so a
//! fresh machine needs nothing but cargo.

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "pluginregistration/v1/api.proto",
    "dra/v1/api.proto",
    "dra-health/v1alpha1/api.proto",
    "deviceplugin/v1beta1/api.proto",
    "podresources/v1/api.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto/kubelet");
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={}", root.join(proto).display());
    }
    let descriptors = protox::compile(PROTOS, [&root])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
