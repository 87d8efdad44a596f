//! `switchyard man`: a man page per command and subcommand, from the clap
//! definitions (`crate::reference`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use crate::output::write_stdout;

#[derive(Args, Debug)]
pub struct ManArgs {
    /// Write the pages into this directory (made if missing; pages of the
    /// same name are replaced).
    #[arg(long)]
    pub out: PathBuf,
}

/// Writes the pages and prints the path of each.
pub fn man(args: ManArgs, trees: &[clap::Command]) -> anyhow::Result<ExitCode> {
    let dir = &args.out;
    if dir.exists() && !dir.is_dir() {
        anyhow::bail!(
            "--out {}: expected a directory, found a file",
            dir.display()
        );
    }
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let mut written = String::new();
    for (file, roff) in crate::reference::man_pages(trees)? {
        let path = dir.join(file);
        std::fs::write(&path, roff).with_context(|| format!("write {}", path.display()))?;
        written += &format!("{}\n", path.display());
    }
    write_stdout(&written)?;
    Ok(ExitCode::SUCCESS)
}
