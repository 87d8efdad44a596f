//! `switchyard crdgen`: the CustomResourceDefinitions from the Rust types.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::output::write_stdout;

#[derive(Args, Debug)]
pub struct CrdgenArgs {
    /// Write one file per CRD into this directory (e.g. deploy/helm/switchyard/crds).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub fn crdgen(args: CrdgenArgs) -> anyhow::Result<ExitCode> {
    let mut all = String::new();
    for (file, crd) in switchyard_api::crds() {
        let yaml = switchyard_api::to_yaml(&crd);
        match &args.out {
            Some(dir) => {
                std::fs::create_dir_all(dir)?;
                std::fs::write(dir.join(file), yaml)?;
            }
            None => all += &format!("---\n{yaml}"),
        }
    }
    if args.out.is_none() {
        write_stdout(&all)?;
    }
    Ok(ExitCode::SUCCESS)
}
