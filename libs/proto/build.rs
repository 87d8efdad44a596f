//! Compiles `proto/` with protox (pure Rust), so a fresh machine needs nothing but cargo.

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "switchyard/v1/envelope.proto",
    "switchyard/v1/events.proto",
    "switchyard/v1/commands.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Read when the script runs, not baked in when it is compiled: a build
    // script binary may be reused by a clone at another path.
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={}", root.join(proto).display());
    }
    let descriptors = protox::compile(PROTOS, [&root])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptor_path = out.join("switchyard_descriptor.bin");
    std::fs::write(
        &descriptor_path,
        prost::Message::encode_to_vec(&descriptors),
    )?;

    // Ordered maps: the encoding of a map field must not depend on hash seeds,
    // or replaying a log would not give byte-identical decisions.
    prost_build::Config::new()
        .btree_map(["."])
        .bytes([".switchyard.v1.Envelope.payload"])
        // Keep DomainEvent small: the rollback's nested images live on the heap.
        .boxed(".switchyard.v1.RollbackStarted.node_restore")
        .boxed(".switchyard.v1.RollbackStarted.workload_restore")
        .boxed(".switchyard.v1.RollbackStarted.undone_group_change")
        .boxed(".switchyard.v1.WorkloadObserved.owner")
        .boxed(".switchyard.v1.BackendConfigured.nvidia_operator")
        // Two placements, with their tolerations.
        .boxed(".switchyard.v1.DomainEvent.kind.workload_rewritten")
        // Effects carry these and are keyed by value where they are executed.
        .type_attribute(".switchyard.v1.Taint", "#[derive(PartialOrd, Ord)]")
        .type_attribute(".switchyard.v1.WorkloadRef", "#[derive(PartialOrd, Ord)]")
        .type_attribute(
            ".switchyard.v1.WorkloadPlacement",
            "#[derive(Eq, PartialOrd, Ord)]",
        )
        .type_attribute(
            ".switchyard.v1.ResourceList",
            "#[derive(Eq, PartialOrd, Ord)]",
        )
        .type_attribute(
            ".switchyard.v1.Tolerations",
            "#[derive(Eq, PartialOrd, Ord)]",
        )
        .type_attribute(".switchyard.v1.Toleration", "#[derive(PartialOrd, Ord)]")
        .type_attribute(
            ".switchyard.v1.CompiledVariant",
            "#[derive(PartialOrd, Ord)]",
        )
        .compile_fds(descriptors)?;
    pbjson_build::Builder::new()
        .register_descriptors(&std::fs::read(&descriptor_path)?)?
        .btree_map(["."])
        .preserve_proto_field_names()
        .build(&[".switchyard"])?;
    Ok(())
}
