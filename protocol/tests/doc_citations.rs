//! Every doc comment in the repository that cites a source or Markdown file (`*.rs`, `*.md`)
//! cites one that exists in it: a citation is a path relative to the repository, a crate or
//! the citing file's directory, so it must be the end of some file's path here. Files outside
//! the repository (design notes, other projects' docs) are not cited by path.

use std::path::{Path, PathBuf};

/// Directories that hold no source of ours.
const SKIP_DIRS: &[&str] = &["target", ".git", "node_modules"];
/// OpenClaw's workspace files: names of files on a host, not citations.
const NOT_CITATIONS: &[&str] = &[
    "AGENTS.md",
    "SOUL.md",
    "TOOLS.md",
    "IDENTITY.md",
    "USER.md",
    "HEARTBEAT.md",
    "BOOTSTRAP.md",
    "MEMORY.md",
];

fn walk(dir: &Path, root: &Path, out: &mut Vec<String>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let entry = entry.unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let kind = entry
            .file_type()
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if kind.is_dir() {
            if !SKIP_DIRS.contains(&name.as_str()) {
                walk(&path, root, out);
            }
        } else if kind.is_file() {
            let rel = path.strip_prefix(root).unwrap_or(&path);
            out.push(rel.to_string_lossy().into_owned());
        }
    }
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/')
}

/// The file paths a doc comment line cites.
fn citations(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if !is_path_char(chars[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && is_path_char(chars[i]) {
            i += 1;
        }
        let token: String = chars[start..i].iter().collect();
        let token = token.trim_end_matches(['.', '/']);
        let before: String = chars[start.saturating_sub(3)..start].iter().collect();
        let base = token.rsplit('/').next().unwrap_or(token);
        if (token.ends_with(".rs") || token.ends_with(".md"))
            && !base.starts_with('.')
            && !token.starts_with('/')
            && before != "://"
            && !NOT_CITATIONS.contains(&token)
        {
            out.push(token.trim_start_matches("./").to_owned());
        }
    }
    out
}

#[test]
fn doc_comments_cite_only_files_that_exist() {
    let root: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the protocol crate is in the repository")
        .to_path_buf();
    let mut files = Vec::new();
    walk(&root, &root, &mut files);
    assert!(
        files.iter().any(|f| f == "protocol/src/lib.rs"),
        "the walk missed the repository: {}",
        root.display()
    );
    let exists = |cited: &str| {
        files
            .iter()
            .any(|f| f == cited || f.ends_with(&format!("/{cited}")))
    };
    let mut missing = Vec::new();
    for file in files.iter().filter(|f| f.ends_with(".rs")) {
        let text =
            std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        for (n, line) in text.lines().enumerate() {
            let t = line.trim_start();
            if !(t.starts_with("//!") || t.starts_with("///")) {
                continue;
            }
            for cited in citations(t) {
                if !exists(&cited) {
                    missing.push(format!("{file}:{}: {cited}", n + 1));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "doc comments cite files that are not in the repository:\n{}",
        missing.join("\n")
    );
}

#[test]
fn citations_are_found_and_urls_and_host_files_are_not() {
    assert_eq!(
        citations("/// kept by the store (`store/sqlite/rollouts.rs`), see README.md."),
        ["store/sqlite/rollouts.rs", "README.md"]
    );
    assert!(citations("//! https://example.invalid/docs/x.md and /etc/x/y.rs").is_empty());
    assert!(citations("/// the workspace's AGENTS.md and SOUL.md").is_empty());
    assert!(citations("/// served.json and openclaw.json").is_empty());
    assert!(citations("//! every `*.rs` file").is_empty());
}
