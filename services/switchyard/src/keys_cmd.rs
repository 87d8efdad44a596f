//! `switchyard keys new`: a signing key for a service or an operator;
//! `switchyard keys chart`: every key a secured release needs.

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
    /// Make the keys of a secured release (the chart's `security`): a seed
    /// per service and for the log-init Job, one file each in --out (named
    /// as the chart's seeds Secret expects them), and print the values that
    /// publish their public keys. Then `kubectl create secret generic NAME
    /// --from-file=DIR` and install with the printed values.
    Chart(ChartArgs),
}

#[derive(Args, Debug)]
pub struct ChartArgs {
    /// A new directory for the seeds; it must not exist yet.
    #[arg(long)]
    pub out: PathBuf,
}

/// The identities a secured release has keys for, as the chart names them.
const CHART_IDENTITIES: [&str; 6] = [
    "inventory",
    "stack-assigner",
    "class-compiler",
    "claim-allocator",
    "alerter",
    "log-init",
];

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
        KeysCommand::Chart(args) => chart(args),
    }
}

fn chart(args: ChartArgs) -> anyhow::Result<ExitCode> {
    let mut dir = std::fs::DirBuilder::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        dir.mode(0o700);
    }
    dir.create(&args.out)
        .with_context(|| format!("create {} (it must not exist)", args.out.display()))?;
    let mut keys = Vec::new();
    for identity in CHART_IDENTITIES {
        keys.push((identity, write_seed(&args.out.join(identity))?));
    }
    println!("security:\n  enabled: true\n  services:");
    for (identity, key) in &keys[..5] {
        println!("    {identity}: [{key}]");
    }
    println!("  logInit: [{}]", keys[5].1);
    Ok(ExitCode::SUCCESS)
}

fn new(args: NewArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(!args.identity.is_empty(), "--identity: expected a name");
    let key = write_seed(&args.seed_file)?;
    println!("{}: [{key}]", args.identity);
    Ok(ExitCode::SUCCESS)
}

/// Makes a new user NKey, writes its seed to `path` (a new file only its
/// owner reads) and returns its public key.
fn write_seed(path: &std::path::Path) -> anyhow::Result<String> {
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
        .open(path)
        .with_context(|| format!("create {} (it must not exist)", path.display()))?;
    file.write_all(format!("{seed}\n").as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("write {}", path.display()))?;
    Ok(key.public_key())
}
