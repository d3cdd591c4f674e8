//! The placement engine must stay pure: no clock, no files, no sockets, no
//! printing. This guard scans the crate's library sources (examples may read the
//! clock) and fails on any use outside comments.

use std::path::{Path, PathBuf};

/// What the library may not mention outside comments.
const FORBIDDEN: &[&str] = &[
    "std::time",
    "std::fs",
    "std::net",
    "std::io",
    "std::process",
    "std::thread",
    "println!",
    "print!",
    "eprintln!",
    "eprint!",
    "dbg!",
    "thread_rng",
    "from_entropy",
    "from_os_rng",
    "OsRng",
];

/// The code of a source file with `//` comments (doc comments too) removed.
/// Block comments are not used in this crate; a `/*` fails the guard instead of
/// hiding code from it.
fn code_without_comments(source: &str) -> String {
    source
        .lines()
        .map(|line| match line.find("//") {
            Some(start) => &line[..start],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The forbidden names a source uses outside comments, with line numbers.
fn violations(source: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (number, line) in code_without_comments(source).lines().enumerate() {
        for name in FORBIDDEN.iter().chain(&["/*"]) {
            if line.contains(name) {
                found.push((number + 1, (*name).to_owned()));
            }
        }
    }
    found
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {dir:?}: {e}"));
    for entry in entries {
        let path = entry
            .unwrap_or_else(|e| panic!("entry in {dir:?}: {e}"))
            .path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn library_sources_use_no_clock_files_sockets_or_printing() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(
        files.len() >= 10,
        "expected the crate's sources under {src:?}"
    );
    let mut report = Vec::new();
    for file in &files {
        let source = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file:?}: {e}"));
        for (line, name) in violations(&source) {
            report.push(format!("{}:{line}: {name}", file.display()));
        }
    }
    assert!(
        report.is_empty(),
        "impure code in the placement crate:\n{}",
        report.join("\n")
    );
}

#[test]
fn the_guard_catches_uses_and_ignores_comments() {
    let source = "//! Reads no std::time.\nfn f() {\n    // println! here is fine\n    let t = std::time::Instant::now(); /// doc println!\n    println!(\"x\");\n}\n";
    let found = violations(source);
    assert_eq!(
        found,
        vec![(4, "std::time".to_owned()), (5, "println!".to_owned())]
    );
    assert!(violations("let x = 1; /* hidden std::fs */")
        .iter()
        .any(|(_, n)| n == "/*"));
}
