//! The clawfleet coordinator: the service over the desired state (kept by `clawfleet-store`),
//! the deployment worker, the HTTP API, and the dispatch to the SSH backend that pushes signed
//! operations to hostd and to the Kubernetes backend for cluster Namespaces.

pub mod api;
pub mod backend;
pub mod backends;
pub mod client;
pub mod codes;
pub mod config;
pub mod console;
pub mod control;
pub mod drift;
pub mod evidence;
pub mod fault;
pub mod foreground;
pub mod metrics;
pub mod model;
pub mod render;
pub mod service;
pub mod targets;
pub mod tokens;
pub mod worker;

// The state store (store/) and the SSH backend (ssh-backend/) are crates of their own; these
// keep `crate::store`, `crate::clock`, `crate::ssh` and `crate::backoff` under their old names.
pub use clawfleet_ssh_backend as ssh;
pub use clawfleet_ssh_backend::backoff;
pub use clawfleet_store as store;
pub use clawfleet_store::clock;

/// The import graph between the crate's top-level modules has no cycle.
///
/// How it is checked: every file under a top-level module (its file or directory) is read up to its
/// first `#[cfg(test)]`, line comments dropped, and each `crate::Y` it names (also inside
/// `use crate::{Y, …}`) is an edge X → Y. A depth-first walk over that graph fails naming
/// the first cycle it finds. (Test modules may reach anywhere; they are not part of the
/// layering.)
#[cfg(test)]
mod module_graph {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    fn read_tree(path: &Path, out: &mut String) {
        if path.is_dir() {
            let mut entries: Vec<_> = std::fs::read_dir(path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
                .filter_map(|e| e.ok().map(|e| e.path()))
                .collect();
            entries.sort();
            for p in entries {
                read_tree(&p, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            for line in code.lines() {
                out.push_str(line.split("//").next().unwrap_or_default());
                out.push('\n');
            }
        }
    }

    /// Module → the modules it names.
    fn graph() -> BTreeMap<String, BTreeSet<String>> {
        // Tests run in the package's directory.
        let src = Path::new("src");
        let mut text_of = BTreeMap::new();
        for entry in std::fs::read_dir(src).unwrap_or_else(|e| panic!("{src:?}: {e}")) {
            let path = entry.map(|e| e.path()).unwrap_or_default();
            let name = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            if matches!(name.as_str(), "lib" | "main") {
                continue;
            }
            let mut text = String::new();
            read_tree(&path, &mut text);
            text_of.insert(name, text);
        }
        let names: BTreeSet<String> = text_of.keys().cloned().collect();
        let mut graph = BTreeMap::new();
        for (name, text) in &text_of {
            let mut deps = BTreeSet::new();
            for (i, _) in text.match_indices("crate::") {
                let rest = &text[i + "crate::".len()..];
                let named: Vec<&str> = match rest.strip_prefix('{') {
                    Some(group) => group
                        .split('}')
                        .next()
                        .unwrap_or_default()
                        .split(',')
                        .map(|p| p.trim().split("::").next().unwrap_or_default())
                        .collect(),
                    None => vec![
                        rest.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                            .next()
                            .unwrap_or_default(),
                    ],
                };
                for n in named {
                    if n != name && names.contains(n) {
                        deps.insert(n.to_owned());
                    }
                }
            }
            graph.insert(name.clone(), deps);
        }
        graph
    }

    /// The first cycle of the graph, as a path that ends where it starts.
    fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
        fn visit(
            node: &str,
            graph: &BTreeMap<String, BTreeSet<String>>,
            path: &mut Vec<String>,
            done: &mut BTreeSet<String>,
        ) -> Option<Vec<String>> {
            if let Some(i) = path.iter().position(|p| p == node) {
                let mut found = path[i..].to_vec();
                found.push(node.to_owned());
                return Some(found);
            }
            if done.contains(node) {
                return None;
            }
            path.push(node.to_owned());
            for next in graph.get(node).into_iter().flatten() {
                if let Some(c) = visit(next, graph, path, done) {
                    return Some(c);
                }
            }
            path.pop();
            done.insert(node.to_owned());
            None
        }
        let mut done = BTreeSet::new();
        graph
            .keys()
            .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
    }

    #[test]
    fn no_import_cycle_between_the_crates_modules() {
        let graph = graph();
        assert!(graph.len() > 15, "too few modules: {graph:?}");
        assert!(
            graph["worker"].contains("backend"),
            "edges are not read: {graph:?}"
        );
        if let Some(c) = cycle(&graph) {
            panic!("an import cycle between modules: {}", c.join(" -> "));
        }
    }

    #[test]
    fn a_cycle_is_found() {
        let mut g = BTreeMap::new();
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        g.insert("a".to_owned(), set(&["b"]));
        g.insert("b".to_owned(), set(&["c"]));
        g.insert("c".to_owned(), set(&["a"]));
        g.insert("d".to_owned(), set(&["a"]));
        assert_eq!(
            cycle(&g),
            Some(
                vec!["a", "b", "c", "a"]
                    .into_iter()
                    .map(String::from)
                    .collect()
            )
        );
        g.insert("c".to_owned(), set(&[]));
        assert_eq!(cycle(&g), None);
    }
}
