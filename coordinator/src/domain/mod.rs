//! The coordinator's rules as pure functions: no runtime, database, HTTP or
//! MQTT crate, and no clock. The modules around it (the store, ingest) read
//! state, call these, and apply the answer, so the rules can be tested as
//! tables without any I/O.
//!
//! `reconcile`: what an agent's event does to its task. `delivery`: when an
//! unacknowledged assignment is sent again. `liveness`: whose work goes back
//! to the queue when nodes fall silent or stay away. `attempts`: which
//! attempts on online nodes end (past their wall time, or unknown to their
//! node) and which a node is told to stop. `reports`: whether a report comes
//! from the node whose topic it is on (signature, channel, replay marks).
//! `budget`: how many messages each node may send on each channel.

pub mod attempts;
pub mod budget;
pub mod delivery;
pub mod liveness;
pub mod reconcile;
pub mod reports;

pub use reconcile::{
    reconcile, EventFacts, NodeAfter, Reconciliation, ResultUpdate, TaskFacts, TaskUpdate,
};

#[cfg(test)]
mod tests {
    /// The crates the domain may not name: its rules must not reach for a
    /// runtime, a database, HTTP or MQTT.
    const FORBIDDEN_CRATES: &[&str] = &["tokio", "sqlx", "axum", "rumqttc", "reqwest"];

    /// Paths that read the clock or the outside world.
    const FORBIDDEN_PATHS: &[&str] = &["std::time", "std::fs", "std::net", "SystemTime"];

    /// Every source file of the module, by name. A new file must be listed
    /// here; `every_source_file_is_checked` fails until it is.
    const SOURCES: &[(&str, &str)] = &[
        ("attempts.rs", include_str!("attempts.rs")),
        ("delivery.rs", include_str!("delivery.rs")),
        ("liveness.rs", include_str!("liveness.rs")),
        ("budget.rs", include_str!("budget.rs")),
        ("mod.rs", include_str!("mod.rs")),
        ("reconcile.rs", include_str!("reconcile.rs")),
        ("reports.rs", include_str!("reports.rs")),
    ];

    /// The code of a line: without string literals (so this guard's own
    /// lists pass) and without its `//` comment (doc comments too).
    fn code(line: &str) -> String {
        let mut code = String::new();
        let mut in_string = false;
        let mut escaped = false;
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            if in_string {
                match (escaped, c) {
                    (false, '\\') => escaped = true,
                    (false, '"') => in_string = false,
                    _ => escaped = false,
                }
                continue;
            }
            match c {
                '"' => in_string = true,
                '/' if chars.peek() == Some(&'/') => break,
                _ => code.push(c),
            }
        }
        code
    }

    /// What a source names that it may not, with line numbers: a forbidden
    /// crate as a segment of a `use` path, or as the root of a path (`name::`)
    /// anywhere in code; a forbidden path anywhere in code. Only the library
    /// code counts: the scan ends at the tests module (`#[cfg(test)]`), whose
    /// tests may read files.
    fn violations(source: &str) -> Vec<(usize, String)> {
        let mut found = Vec::new();
        for (number, line) in source.lines().enumerate() {
            let code = code(line);
            let trimmed = code.trim_start();
            if trimmed.starts_with("#[cfg(test)]") {
                break;
            }
            let is_use = trimmed.starts_with("use ")
                || trimmed.starts_with("pub use ")
                || trimmed.starts_with("pub(crate) use ")
                || trimmed.starts_with("extern crate ");
            let segments: Vec<&str> = code
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .collect();
            for name in FORBIDDEN_CRATES {
                let rooted = format!("{name}::");
                if (is_use && segments.contains(name)) || code.contains(&rooted) {
                    found.push((number + 1, (*name).to_owned()));
                }
            }
            for path in FORBIDDEN_PATHS {
                if code.contains(path) {
                    found.push((number + 1, (*path).to_owned()));
                }
            }
        }
        found
    }

    #[test]
    fn domain_names_no_runtime_database_http_mqtt_or_clock() {
        let mut report = Vec::new();
        for (file, source) in SOURCES {
            for (line, name) in violations(source) {
                report.push(format!("src/domain/{file}:{line}: {name}"));
            }
        }
        assert!(
            report.is_empty(),
            "the domain must stay pure:\n{}",
            report.join("\n")
        );
    }

    #[test]
    fn every_source_file_is_checked() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/domain");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .unwrap_or_else(|error| panic!("read {dir:?}: {error}"))
            .filter_map(|entry| entry.ok())
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".rs"))
            .collect();
        on_disk.sort();
        let mut listed: Vec<String> = SOURCES.iter().map(|(name, _)| (*name).to_owned()).collect();
        listed.sort();
        assert_eq!(on_disk, listed, "list every file of src/domain in SOURCES");
    }

    #[test]
    fn the_guard_catches_uses_and_ignores_comments_strings_and_tests() {
        let source = [
            "//! No tokio here.",
            "use tokio::sync::Mutex;",
            "use crate::{x, sqlx};",
            "fn f() {",
            "    // axum:: in a comment is fine, and so is \"rumqttc::\" in a string",
            "    let _ = reqwest::get(\"x\");",
            "    let _ = std::time::Instant::now(); // rumqttc::",
            "    let tokio_like = \"a \\\" tokio::\";",
            "}",
            "#[cfg(test)]",
            "mod tests { use tokio::test; }",
        ]
        .join("\n");
        assert_eq!(
            violations(&source),
            vec![
                (2, "tokio".to_owned()),
                (3, "sqlx".to_owned()),
                (6, "reqwest".to_owned()),
                (7, "std::time".to_owned()),
            ]
        );
    }
}
