//! The crate's layering, checked on its sources.
//!
//! The pure half (package, spec, expr, signature and the types they share) must
//! build without OpenCL so the coordinator and the `starling` CLI can validate
//! packages without linking `opencl3`; the runtime half sits on top of it behind
//! the `runtime` feature. This guard reads `src/lib.rs` for the modules and which
//! of them the feature gates, reads every module's `crate::` references, and
//! fails when a pure module names `opencl3` (or another runtime-only
//! dependency) or a runtime module, or when the imports between modules form a
//! cycle. It runs with and without default features.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The modules that must stay pure whatever else changes.
const PURE: &[&str] = &["package", "spec", "expr", "signature"];

/// The one module allowed `unsafe` (docs/design/engine.md, `opencl/`).
const UNSAFE_MODULE: &str = "exec";

/// A module declared in `lib.rs`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Module {
    name: String,
    /// Declared under `#[cfg(feature = "runtime")]`.
    runtime: bool,
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path:?}: {e}"))
}

/// The code of a source with `//` comments (doc comments too) removed, so
/// prose and doc links do not count as uses. A `//` inside a string literal
/// cuts the rest of that line, which can only hide code from the guard, never
/// invent a use; the crate has no such line that matters.
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

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The modules `lib.rs` declares, in order, and whether `runtime` gates each.
fn declared_modules(lib: &str) -> Vec<Module> {
    let mut modules = Vec::new();
    let mut gated = false;
    for line in code_without_comments(lib).lines() {
        let line = line.trim();
        if line.starts_with("#[cfg(") {
            gated = line.contains("feature = \"runtime\"");
            continue;
        }
        if line.starts_with("#[") {
            // Another attribute between the `cfg` and its `mod` keeps the gate.
            continue;
        }
        let declaration = line
            .strip_prefix("pub mod ")
            .or_else(|| line.strip_prefix("pub(crate) mod "))
            .or_else(|| line.strip_prefix("mod "));
        if let Some(rest) = declaration {
            let name = rest.trim_end_matches(';').trim();
            assert!(
                name.chars().all(is_ident_char),
                "lib.rs: cannot read the module declaration `{line}`; declare one \
                 module per line as `mod name;` (extend this guard for inline modules)"
            );
            modules.push(Module {
                name: name.to_owned(),
                runtime: gated,
            });
        }
        if !line.is_empty() {
            gated = false;
        }
    }
    modules
}

/// The first path segment of every `crate::` reference in `code`:
/// `use crate::a::B`, `crate::b::f()`, `use crate::{c, d::E}`.
fn crate_references(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = code;
    let mut offset = 0;
    while let Some(at) = rest.find("crate::") {
        let start = offset + at;
        let before = code[..start].chars().next_back();
        let after = &code[start + "crate::".len()..];
        offset = start + "crate::".len();
        rest = &code[offset..];
        // `$crate::` in a macro, or a name ending in `crate`, is not ours.
        if before.is_some_and(|c| is_ident_char(c) || c == '$') {
            continue;
        }
        if let Some(group) = after.strip_prefix('{') {
            let mut depth = 0usize;
            let mut item = String::new();
            let mut items = Vec::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => items.push(std::mem::take(&mut item)),
                    _ => {}
                }
                if depth == 0 && c != ',' {
                    item.push(c);
                }
            }
            items.push(item);
            for item in items {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| is_ident_char(*c))
                    .collect();
                if !name.is_empty() {
                    found.push(name);
                }
            }
        } else {
            let name: String = after.chars().take_while(|c| is_ident_char(*c)).collect();
            if !name.is_empty() {
                found.push(name);
            }
        }
    }
    found
}

/// Whether `code` uses the crate `name` (a path through it or an
/// `extern crate`), matched as a whole word.
fn uses_crate(code: &str, name: &str) -> bool {
    code.match_indices(name).any(|(at, _)| {
        let before = code[..at].chars().next_back();
        let after = &code[at + name.len()..];
        !before.is_some_and(|c| is_ident_char(c) || c == ':')
            && (after.starts_with("::") || code[..at].trim_end().ends_with("extern crate"))
    })
}

/// The dependencies `Cargo.toml` marks `optional = true` (only `runtime` turns
/// them on), with `-` as `_` as Rust code names them.
fn optional_dependencies(manifest: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut in_dependencies = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_dependencies = line == "[dependencies]";
            continue;
        }
        if in_dependencies && line.contains("optional = true") {
            if let Some((name, _)) = line.split_once('=') {
                names.push(name.trim().replace('-', "_"));
            }
        }
    }
    names
}

/// A cycle in `graph`, as the modules along it with the first repeated at the
/// end, or `None` when the graph is acyclic.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        done: &mut BTreeSet<String>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|on_path| on_path == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, done, path) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut done, &mut Vec::new()))
}

/// Every module's code (comments removed), by module name.
fn module_code(modules: &[Module]) -> BTreeMap<String, String> {
    modules
        .iter()
        .map(|module| {
            let path = src_dir().join(format!("{}.rs", module.name));
            assert!(
                path.is_file(),
                "module `{}` is not src/{}.rs; extend this guard for directory modules",
                module.name,
                module.name
            );
            (module.name.clone(), code_without_comments(&read(&path)))
        })
        .collect()
}

/// The import graph: module → the modules it names through `crate::`.
/// A reference to something that is not a module (a re-export from `lib.rs`)
/// would hide an edge, so it is reported instead.
fn import_graph(
    modules: &[Module],
    code: &BTreeMap<String, String>,
) -> (BTreeMap<String, BTreeSet<String>>, Vec<String>) {
    let names: BTreeSet<&str> = modules.iter().map(|m| m.name.as_str()).collect();
    let mut graph = BTreeMap::new();
    let mut unknown = Vec::new();
    for (module, source) in code {
        let mut edges = BTreeSet::new();
        for target in crate_references(source) {
            if target == *module {
                continue;
            }
            if names.contains(target.as_str()) {
                edges.insert(target);
            } else {
                unknown.push(format!(
                    "src/{module}.rs names `crate::{target}`, which is not a module; \
                     import it from the module that defines it"
                ));
            }
        }
        graph.insert(module.clone(), edges);
    }
    (graph, unknown)
}

fn modules() -> Vec<Module> {
    let modules = declared_modules(&read(&src_dir().join("lib.rs")));
    assert!(
        modules.len() >= PURE.len() + 3,
        "expected the crate's modules in lib.rs, found {modules:?}"
    );
    modules
}

#[test]
fn pure_modules_use_no_opencl_and_no_runtime_module() {
    let modules = modules();
    let manifest = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"));
    let runtime_only = optional_dependencies(&manifest);
    assert!(
        runtime_only.iter().any(|name| name == "opencl3"),
        "opencl3 must be an optional dependency that only `runtime` enables; \
         optional ones: {runtime_only:?}"
    );
    for name in PURE {
        let module = modules
            .iter()
            .find(|m| m.name == *name)
            .unwrap_or_else(|| panic!("lib.rs no longer declares the pure module `{name}`"));
        assert!(
            !module.runtime,
            "`{name}` is pure and must build without the `runtime` feature"
        );
    }
    let runtime: BTreeSet<&str> = modules
        .iter()
        .filter(|m| m.runtime)
        .map(|m| m.name.as_str())
        .collect();
    let code = module_code(&modules);
    let mut report = Vec::new();
    for module in modules.iter().filter(|m| !m.runtime) {
        let source = &code[&module.name];
        if source.contains("opencl3") {
            report.push(format!("src/{}.rs mentions opencl3", module.name));
        }
        for dependency in &runtime_only {
            if uses_crate(source, dependency) {
                report.push(format!(
                    "src/{}.rs uses `{dependency}`, a dependency only `runtime` enables",
                    module.name
                ));
            }
        }
        for target in crate_references(source) {
            if runtime.contains(target.as_str()) {
                report.push(format!(
                    "src/{}.rs imports the runtime module `{target}`",
                    module.name
                ));
            }
        }
    }
    assert!(
        report.is_empty(),
        "the pure half of starling-opencl depends on the runtime:\n{}",
        report.join("\n")
    );
}

#[test]
fn imports_between_modules_point_one_way() {
    let modules = modules();
    let code = module_code(&modules);
    let (graph, unknown) = import_graph(&modules, &code);
    assert!(unknown.is_empty(), "{}", unknown.join("\n"));
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "the modules of starling-opencl import each other in a cycle: {}\n\
             move what both need to a module below them; the graph: {graph:#?}",
            cycle.join(" → ")
        );
    }
}

#[test]
fn only_exec_allows_unsafe() {
    let modules = modules();
    let code = module_code(&modules);
    let allowing: Vec<&String> = code
        .iter()
        .filter(|(_, source)| source.contains("allow(unsafe_code)"))
        .map(|(name, _)| name)
        .collect();
    assert_eq!(allowing, vec![UNSAFE_MODULE], "modules allowing unsafe");
}

#[test]
fn the_guard_reads_modules_references_and_cycles() {
    let lib = "//! mod docs;\npub mod a;\n#[cfg(feature = \"runtime\")]\nmod b;\n\
               #[cfg(feature = \"runtime\")]\npub mod c;\npub mod d;\n";
    assert_eq!(
        declared_modules(lib)
            .iter()
            .map(|m| (m.name.as_str(), m.runtime))
            .collect::<Vec<_>>(),
        vec![("a", false), ("b", true), ("c", true), ("d", false)]
    );

    let source = "use crate::a::X;\nuse crate::{b, c::{Y, Z}};\n// crate::hidden\n\
                  fn f() { crate::d::g(); $crate::e::h(); not_crate::f::i(); }\n";
    let code = code_without_comments(source);
    assert_eq!(crate_references(&code), vec!["a", "b", "c", "d"]);

    assert!(uses_crate("use opencl3::device::Device;", "opencl3"));
    assert!(uses_crate("extern crate tokio;", "tokio"));
    assert!(!uses_crate("Some(hex) if hex.is_empty()", "hex"));
    assert!(!uses_crate("serde::hex::x", "hex"));
    assert_eq!(
        optional_dependencies(
            "[dependencies]\na.workspace = true\nb-c = { workspace = true, optional = true }\n\
             [dev-dependencies]\nd = { version = \"1\", optional = true }\n"
        ),
        vec!["b_c"]
    );

    let graph = |edges: &[(&str, &str)]| {
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, to) in edges {
            graph
                .entry((*from).to_owned())
                .or_default()
                .insert((*to).to_owned());
            graph.entry((*to).to_owned()).or_default();
        }
        graph
    };
    assert_eq!(
        find_cycle(&graph(&[("a", "b"), ("b", "c"), ("a", "c")])),
        None
    );
    assert_eq!(
        find_cycle(&graph(&[("a", "b"), ("b", "c"), ("c", "a")])),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
}
