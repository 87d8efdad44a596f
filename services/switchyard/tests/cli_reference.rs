//! The command reference is generated, never copied by hand:
//! docs/reference/commands.md is what `switchyard::reference::markdown(&switchyard::cli::trees())`
//! renders from the clap definitions (`SWITCHYARD_BLESS=1` rewrites it), and
//! `switchyard man --out DIR` writes a man page per command.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use switchyard::reference::BLESS;

const REFERENCE: &str = "docs/reference/commands.md";

fn reference_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(REFERENCE)
}

#[test]
fn commands_md_is_generated_from_the_cli() {
    let rendered = switchyard::reference::markdown(&switchyard::cli::trees());
    let path = reference_path();
    if std::env::var_os("SWITCHYARD_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &rendered)
            .unwrap_or_else(|e| panic!("SWITCHYARD_BLESS=1: write {}: {e}", path.display()));
        // Past the test harness's capture: blessing is never silent.
        let _ = writeln!(
            std::io::stderr(),
            "SWITCHYARD_BLESS=1: wrote {REFERENCE} ({} commands)",
            switchyard::reference::command_paths(&switchyard::cli::trees()).len()
        );
        return;
    }
    let committed = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("read {REFERENCE}: {e}; generate it with `{BLESS}`"));
    if committed != rendered {
        let line = committed
            .lines()
            .zip(rendered.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| committed.lines().count().min(rendered.lines().count()));
        panic!(
            "{REFERENCE} is not what the CLI's clap definitions render (first difference at \
             line {}:\n  committed: {:?}\n  rendered:  {:?}\n); regenerate it with `{BLESS}` \
             and commit the result",
            line + 1,
            committed.lines().nth(line).unwrap_or("<end of file>"),
            rendered.lines().nth(line).unwrap_or("<end of file>"),
        );
    }
}

#[test]
fn markdown_has_a_section_per_command() {
    let md = switchyard::reference::markdown(&switchyard::cli::trees());
    let paths = switchyard::reference::command_paths(&switchyard::cli::trees());
    for path in &paths {
        let heading = format!("\n## {path}\n");
        assert_eq!(md.matches(&heading).count(), 1, "one `## {path}` in:\n{md}");
    }
    for path in [
        "switchyard",
        "switchyard log show",
        "switchyard serve node-agent",
        "switchyard man",
    ] {
        assert!(paths.iter().any(|p| p == path), "{path} in {paths:?}");
    }
    assert!(!md.contains('\u{1b}'), "no ANSI escapes in the reference");
    assert!(
        md.contains("--data-dir"),
        "the flags are in the reference: {md}"
    );
}

#[test]
fn man_writes_a_page_per_command() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .arg("man")
        .arg("--out")
        .arg(dir.path())
        .output()
        .expect("run switchyard");
    assert!(
        output.status.success(),
        "switchyard man: {}",
        String::from_utf8_lossy(&output.stderr)
    );

    let mut expected: Vec<String> = switchyard::reference::command_paths(&switchyard::cli::trees())
        .iter()
        .map(|path| format!("{}.1", path.replace(' ', "-")))
        .collect();
    expected.sort();
    let mut found: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    found.sort();
    assert_eq!(found, expected, "a page per command, and nothing else");
    for page in [
        "switchyard.1",
        "switchyard-log-show.1",
        "switchyard-serve-node-agent.1",
        "switchyard-rollback-node.1",
        "switchyard-man.1",
    ] {
        assert!(found.iter().any(|f| f == page), "{page} in {found:?}");
    }
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(
        stdout.lines().count(),
        expected.len(),
        "a line per page: {stdout}"
    );

    let root = std::fs::read_to_string(dir.path().join("switchyard.1")).unwrap();
    let title = root
        .lines()
        .find(|line| {
            !line.starts_with(".ie") && !line.starts_with(".el") && !line.starts_with(".\\\"")
        })
        .unwrap_or_default();
    assert!(
        title.starts_with(".TH switchyard 1"),
        "a man page's title first: {root}"
    );
    assert!(
        root.contains("\\-\\-version"),
        "--version in switchyard.1: {root}"
    );
    assert!(
        root.contains("switchyard\\-log(1)"),
        "the subcommands' pages named: {root}"
    );

    let show = std::fs::read_to_string(dir.path().join("switchyard-log-show.1")).unwrap();
    assert!(
        show.contains("\\-\\-data\\-dir"),
        "--data-dir in switchyard-log-show.1: {show}"
    );
    assert!(
        show.contains("SWITCHYARD_DATA_DIR"),
        "its environment variable too: {show}"
    );
}

#[test]
fn man_refuses_a_file_for_out() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .arg("man")
        .arg("--out")
        .arg(file.path())
        .output()
        .expect("run switchyard");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("expected a directory, found a file"),
        "{stderr}"
    );
}
