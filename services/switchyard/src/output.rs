//! How commands print: a table for people or JSON for machines.

use std::io::Write;

use anyhow::Context;
use clap::ValueEnum;

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

/// Writes `text` to stdout; a closed pipe (`| head`) is not an error.
pub fn write_stdout(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        Err(err) if err.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(err).context("write to stdout")
        }
        _ => Ok(()),
    }
}

/// The output of commands that report on the cluster, as kubectl's `-o`.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Format {
    #[default]
    Table,
    Json,
    Yaml,
    /// A merge patch: what `move --dry-run` would change.
    Patch,
}

/// Prints `value` as JSON (one pretty object) or YAML and returns true; for
/// a table it prints nothing and returns false (the command renders it).
pub fn write_structured<T: serde::Serialize>(format: Format, value: &T) -> anyhow::Result<bool> {
    let text = match format {
        Format::Table => return Ok(false),
        Format::Json => format!("{}\n", serde_json::to_string_pretty(value)?),
        Format::Yaml => serde_yaml_ng::to_string(value)?,
        Format::Patch => anyhow::bail!("-o patch: only `switchyard move --dry-run` prints a patch"),
    };
    write_stdout(&text)?;
    Ok(true)
}
