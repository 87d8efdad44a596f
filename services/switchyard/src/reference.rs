//! The command reference, rendered from the clap definitions (the trees
//! [`crate::cli::trees`] lists) and never written by hand: Markdown for the book (docs/reference/commands.md, which
//! `tests/cli_reference.rs` keeps equal to [`markdown`]) and a man page per
//! command (`switchyard man`).
//!
//! Two trees: `switchyard`'s, and `switchyard-node-agent`'s (its `discover`
//! runs on a node without a cluster). Each `switchyard-<service>` binary
//! takes the flags of `switchyard serve <service>`.

use std::fmt::Write as _;

use anyhow::Context;
use clap::Command;

/// The column help is wrapped at, whatever terminal renders it (clap wraps
/// only with its `wrap_help` feature, which this workspace leaves off).
const WIDTH: usize = 100;

/// How docs/reference/commands.md is regenerated.
pub const BLESS: &str = "SWITCHYARD_BLESS=1 cargo test -p switchyard --test cli_reference";

/// A command tree, built: each subcommand knows its path (`switchyard log
/// show`) and its page name (`switchyard-log-show`). Environment variables
/// are named without their values, so that the shell rendering it does not
/// change the reference.
fn built(cmd: Command) -> Command {
    let mut cmd = cmd.term_width(WIDTH);
    cmd.build();
    hide_env_values(cmd)
}

fn hide_env_values(cmd: Command) -> Command {
    cmd.mut_args(|arg| arg.hide_env_values(true))
        .mut_subcommands(hide_env_values)
}

/// Every command of the tree, parents first, in the order help lists them;
/// hidden ones and clap's generated `help` subcommand left out.
fn walk<'a>(cmd: &'a Command, out: &mut Vec<&'a Command>) {
    out.push(cmd);
    for sub in cmd
        .get_subcommands()
        .filter(|sub| !sub.is_hide_set() && sub.get_name() != "help")
    {
        walk(sub, out);
    }
}

fn all(cmd: &Command) -> Vec<&Command> {
    let mut out = Vec::new();
    walk(cmd, &mut out);
    out
}

/// A built command's path as typed: `switchyard log show`.
fn path(cmd: &Command) -> &str {
    cmd.get_bin_name().unwrap_or_else(|| cmd.get_name())
}

/// The path of every command and subcommand (`switchyard`, `switchyard log`,
/// `switchyard log show`, ...), parents first.
pub fn command_paths(trees: &[Command]) -> Vec<String> {
    trees
        .iter()
        .cloned()
        .map(built)
        .collect::<Vec<_>>()
        .iter()
        .flat_map(|tree| all(tree).into_iter().map(|cmd| path(cmd).to_owned()))
        .collect()
}

/// The whole command tree as Markdown: a heading per command path, its
/// about text, and its `--help` as a text block. The same definitions give
/// the same bytes, whatever the terminal or the environment.
pub fn markdown(trees: &[Command]) -> String {
    let trees: Vec<Command> = trees.iter().cloned().map(built).collect();
    let mut md = String::from("# Command reference\n\n");
    let _ = writeln!(
        md,
        "<!-- Generated from the clap definitions by `{BLESS}`; do not edit. -->\n"
    );
    md.push_str(
        "Every `switchyard` command and subcommand with its `--help`, generated from the \
         command's definitions (`switchyard man --out DIR` writes the same as man pages). \
         Each service binary `switchyard-<service>` takes the flags of `switchyard serve \
         <service>`; `switchyard-node-agent` follows `switchyard`'s commands.\n",
    );
    for cmd in trees.iter().flat_map(all) {
        let _ = write!(md, "\n## {}\n\n", path(cmd));
        if let Some(about) = cmd.get_about() {
            let _ = write!(md, "{}\n\n", about.to_string().trim());
        }
        // Display drops the styling: plain text, no ANSI escapes.
        let help = cmd.clone().render_long_help().to_string();
        md.push_str("```text\n");
        for line in help.trim_end().lines() {
            md.push_str(line.trim_end());
            md.push('\n');
        }
        md.push_str("```\n");
    }
    md
}

/// A man page (section 1) per command and subcommand: the file name
/// (`switchyard-log-show.1`) and its roff.
pub fn man_pages(trees: &[Command]) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    // No `help` subcommand: its page would be the `--help` of its parent.
    let roots: Vec<Command> = trees
        .iter()
        .map(|tree| built(tree.clone().disable_help_subcommand(true)))
        .collect();
    let source = format!("switchyard {}", env!("CARGO_PKG_VERSION"));
    let mut pages = Vec::new();
    for cmd in roots.iter().flat_map(all) {
        // The version on every page, not only the root's (no date: the
        // same build writes the same pages).
        let man = clap_mangen::Man::new(cmd.clone()).source(source.clone());
        let file = man.get_filename();
        let mut roff = Vec::new();
        man.render(&mut roff)
            .with_context(|| format!("render the man page {file}"))?;
        pages.push((file, roff));
    }
    Ok(pages)
}
