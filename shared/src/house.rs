//! The library's shape, checked: no two files import each other, however indirectly, and no
//! file imports from a floor above its own ([`FLOORS`]). A circle between files is how a house
//! loses its floors (the error type reaching for the store, the store for a service); these
//! tests name the first circle or upward import a change makes, file by file.
//!
//! The floors are modules of one crate, not crates, on purpose: the store's functions and the
//! minting of contexts are `pub(crate)`, which is what keeps an adapter from calling the store
//! or building a context with every right (the compile-fail proofs in `sealed.rs`). As crates,
//! the store would have to make them `pub` to the domain, and every adapter could reach them.
//! So the compiler guards the door between the library and its adapters, and this test guards
//! the floors inside.
//!
//! It reads the sources as text: every `crate::a::b` and `super::a` path outside comments is
//! an arrow from its file to the file that defines the longest part of that path that is a
//! module. A folder module's own files (`oauth.rs` and `oauth/tokens.rs`) are one room: a
//! parent and its direct children may use each other.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every source file of the library, by module path (`services::oauth::tokens`).
fn modules(root: &Path) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("a source folder") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path.strip_prefix(root).expect("inside").with_extension("");
            let mut parts: Vec<String> =
                relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
            if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
                parts.pop();
            }
            // Test modules in files of their own are tests, not rooms of the house.
            if parts.last().is_some_and(|p| p == "tests" || p.ends_with("_tests")) {
                continue;
            }
            out.insert(parts.join("::"), path);
        }
    }
    out
}

/// The module paths a source names, outside comments, resolved against `this` (its own
/// module path) for `super::`.
fn named_paths(source: &str, this: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in source.lines() {
        let code = line.trim_start();
        // A file's tests come last, after `#[cfg(test)]`; they are not the house.
        if code == "#[cfg(test)]" {
            break;
        }
        if code.starts_with("//") {
            continue;
        }
        for (prefix, base) in [("crate::", String::new()), ("super::", parent_of(this))] {
            let mut rest = code;
            while let Some(at) = rest.find(prefix) {
                let before = rest[..at].chars().last();
                rest = &rest[at + prefix.len()..];
                if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                    continue;
                }
                let path: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                    .collect();
                let path = path.trim_end_matches(':');
                let full = match (base.is_empty(), path.is_empty()) {
                    (true, _) => path.to_owned(),
                    (false, true) => base.clone(),
                    (false, false) => format!("{base}::{path}"),
                };
                out.push(full);
            }
        }
    }
    out
}

/// The module `super` names from a file: its parent module (a folder's `mod.rs` is the module
/// itself, so `super` is one up from it either way).
fn parent_of(this: &str) -> String {
    match this.rsplit_once("::") {
        Some((parent, _)) => parent.to_owned(),
        None => String::new(),
    }
}

/// The module a path lands in: its longest prefix that is a file of the library.
fn landing(path: &str, known: &BTreeMap<String, PathBuf>) -> Option<String> {
    let parts: Vec<&str> = path.split("::").collect();
    (1..=parts.len()).rev().map(|n| parts[..n].join("::")).find(|m| known.contains_key(m))
}

fn parent_and_child(a: &str, b: &str) -> bool {
    let direct =
        |parent: &str, child: &str| child.rsplit_once("::").is_some_and(|(p, _)| p == parent);
    direct(a, b) || direct(b, a)
}

/// The arrows between files of the library.
fn arrows(root: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let known = modules(root);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, path) in &known {
        let source = std::fs::read_to_string(path).expect("readable");
        let targets = graph.entry(module.clone()).or_default();
        for named in named_paths(&source, module) {
            if let Some(to) = landing(&named, &known)
                && to != *module
                && !parent_and_child(module, &to)
                && !to.is_empty()
            {
                targets.insert(to);
            }
        }
    }
    graph
}

/// A circle in the graph, if there is one, as the files around it.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        marks: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let at = path.iter().position(|n| n == node).unwrap_or(0);
                let mut ring = path[at..].to_vec();
                ring.push(node.to_owned());
                return Some(ring);
            }
            None => {}
        }
        marks.insert(node.to_owned(), Mark::Open);
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(ring) = visit(next, graph, marks, path) {
                return Some(ring);
            }
        }
        path.pop();
        marks.insert(node.to_owned(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        if let Some(ring) = visit(node, graph, &mut marks, &mut Vec::new()) {
            return Some(ring);
        }
    }
    None
}

/// The library's floors, from the ground up, by top-level module: a file may import from its
/// own floor and the floors below, never from one above.
const FLOORS: &[(&str, &[&str])] = &[
    // Pure: types, rules and forms, no SQL and no I/O.
    (
        "kernel",
        &[
            "canon", "money", "seal", "signing", "text", "effect", "rights", "error", "cursor",
            "handle", "time", "secret", "input", "ctx", "policies",
        ],
    ),
    // The wires every service shares: the NATS bus and telemetry.
    ("wires", &["bus", "telemetry"]),
    // Every SQL statement and row type.
    ("store", &["datastore"]),
    // What the store's rows become for readers, and the entry checks of a request.
    ("views", &["views", "auth"]),
    // The services, by bounded context.
    ("domain", &["services"]),
    // Assembling a process: settings, and the test fixtures.
    ("assembly", &["config", "testing"]),
];

/// The floor of a module path, by its top-level module (`None`: outside the floors, such as
/// this test).
fn floor_of(module: &str) -> Option<usize> {
    let top = module.split("::").next().unwrap_or_default();
    FLOORS.iter().position(|(_, rooms)| rooms.contains(&top))
}

/// The arrows that run up a floor: `(from, to)`.
fn upward(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<(String, String)> {
    graph
        .iter()
        .flat_map(|(from, tos)| tos.iter().map(move |to| (from, to)))
        .filter(|(from, to)| match (floor_of(from), floor_of(to)) {
            (Some(a), Some(b)) => b > a,
            _ => false,
        })
        .map(|(from, to)| (from.clone(), to.clone()))
        .collect()
}

#[test]
fn every_file_of_the_library_stands_on_a_floor_and_imports_nothing_above_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = arrows(&root);
    let lost: Vec<&String> = graph
        .keys()
        .filter(|m| floor_of(m).is_none() && !["", "house", "sealed"].contains(&m.as_str()))
        .collect();
    assert!(lost.is_empty(), "modules on no floor (name one in FLOORS): {lost:?}");
    let up = upward(&graph);
    assert!(up.is_empty(), "imports from a floor above: {up:?}");
}

#[test]
fn the_check_sees_an_import_from_above() {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    graph.entry("error".into()).or_default().insert("rights::catalog".into());
    graph.entry("datastore::bookings".into()).or_default().insert("ctx".into());
    assert!(upward(&graph).is_empty());
    graph.entry("datastore::bookings".into()).or_default().insert("services::audit".into());
    assert_eq!(
        upward(&graph),
        vec![("datastore::bookings".to_owned(), "services::audit".to_owned())]
    );
}

#[test]
fn no_two_files_of_the_library_import_each_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = arrows(&root);
    let edges: usize = graph.values().map(BTreeSet::len).sum();
    assert!(
        graph.len() > 60 && edges > 150,
        "the scan found the house: {} files, {edges} arrows",
        graph.len()
    );
    if let Some(ring) = circle(&graph) {
        panic!("an import circle: {}", ring.join(" -> "));
    }
}

#[test]
fn the_check_sees_a_circle_when_there_is_one() {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    graph.entry("error".into()).or_default().insert("datastore".into());
    graph.entry("datastore".into()).or_default().insert("services::audit".into());
    graph.entry("services::audit".into()).or_default().insert("error".into());
    let ring = circle(&graph).expect("a circle");
    assert_eq!(ring.first(), ring.last(), "{ring:?}");
    assert_eq!(ring.len(), 4, "{ring:?}");
    graph.get_mut("services::audit").expect("node").clear();
    assert_eq!(circle(&graph), None);
    // Paths resolve to the longest module that is a file, and `super` to the parent.
    let known: BTreeMap<String, PathBuf> = ["services", "services::oauth", "error"]
        .iter()
        .map(|m| ((*m).to_owned(), PathBuf::new()))
        .collect();
    assert_eq!(
        landing("services::oauth::AuthorizeRequest", &known).as_deref(),
        Some("services::oauth")
    );
    let named = named_paths(
        "use super::tokens::x;\n// crate::error in a comment\nlet e = crate::error::Error::Internal;",
        "services::oauth::client_auth",
    );
    assert_eq!(
        named,
        vec!["services::oauth::tokens::x".to_owned(), "error::Error::Internal".to_owned()]
    );
}
