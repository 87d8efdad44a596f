//! The book's shell examples run: every ```console block of the chapters
//! listed here is a trycmd case — each `$ ` line is run from the
//! repository's root with the workspace's binaries, and what it prints and
//! its exit status (`? N`) must be what the book shows (`...` elides lines).
//! A console block in a chapter not listed fails the test, so no example
//! escapes it.

use std::path::{Path, PathBuf};

use switchyard_testkit::bins::binary;

/// The chapters with console examples, relative to the repository's root.
const CHAPTERS: [&str; 2] = ["docs/reference/allocator.md", "docs/getting-started.md"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the repository's root")
}

/// Every Markdown file under `dir`.
fn markdown(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read the book's directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            markdown(&path, found);
        } else if path.extension().is_some_and(|e| e == "md") {
            found.push(path);
        }
    }
}

#[test]
fn every_console_example_of_the_book_prints_what_the_book_shows() {
    let root = repo();
    let mut chapters = Vec::new();
    markdown(&root.join("docs"), &mut chapters);
    chapters.push(root.join("README.md"));
    for chapter in &chapters {
        let text = std::fs::read_to_string(chapter).expect("a chapter");
        let relative = chapter.strip_prefix(&root).unwrap().to_str().unwrap();
        assert_eq!(
            text.contains("```console"),
            CHAPTERS.contains(&relative),
            "{relative}: a chapter with console examples is listed in CHAPTERS, and only those"
        );
    }
    // trycmd runs a Markdown case from the process's working directory.
    std::env::set_current_dir(&root).expect("run from the repository's root");
    let cases = trycmd::TestCases::new();
    cases
        .register_bin("switchyard", binary("switchyard"))
        .register_bin("switchyard-node-agent", binary("switchyard-node-agent"));
    for chapter in CHAPTERS {
        cases.case(chapter);
    }
}
