//! `switchyard keys new`: a signing key for a service or an operator.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};

#[derive(Subcommand, Debug)]
pub enum KeysCommand {
    /// Make a new NKey (ed25519) for an identity: its seed goes to a file
    /// only its owner reads (--signing-key of a service), its public key is
    /// printed as the keyring line to publish (the chart's keyring). To
    /// rotate, make a new key and list it before the old one.
    New(NewArgs),
}

#[derive(Args, Debug)]
pub struct NewArgs {
    /// Whose key: a service's name (inventory, stack-assigner, ...) or an
    /// operator's identity.
    #[arg(long)]
    pub identity: String,
    /// Where the seed goes; the file must not exist yet.
    #[arg(long)]
    pub seed_file: PathBuf,
}

pub fn run(command: KeysCommand) -> anyhow::Result<ExitCode> {
    match command {
        KeysCommand::New(args) => new(args),
    }
}

fn new(args: NewArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(!args.identity.is_empty(), "--identity: expected a name");
    let key = nkeys::KeyPair::new_user();
    let seed = key.seed().context("the new key's seed")?;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options
        .open(&args.seed_file)
        .with_context(|| format!("create {} (it must not exist)", args.seed_file.display()))?;
    file.write_all(format!("{seed}\n").as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("write {}", args.seed_file.display()))?;
    println!("{}: [{}]", args.identity, key.public_key());
    Ok(ExitCode::SUCCESS)
}
