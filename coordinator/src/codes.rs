//! Every stable code: the coordinator's own table ([`Code`]: API refusals, work outcomes and
//! transport failures, each with its class and HTTP status) lives in `clawfleet-api`
//! (`api/src/codes.rs`), with [`AnyCode`], which is either one of them or a target's
//! (the protocol's `FailureCode`, passed through unchanged). Code travels typed until it is
//! stored or answered. `/openapi.json` lists both sets; `codes_are_only_written_here` in
//! this file's tests refuses a code literal anywhere in `coordinator/src`, and
//! `every_code_is_produced_by_a_test_or_listed` a code no test produces.

pub use clawfleet_api::codes::{AnyCode, Code, CodeClass};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_parse_back_and_do_not_collide_with_the_protocols() {
        // The same condition as the protocol's code of the same text, found by the
        // coordinator before it asks a host.
        const SHARED: &[Code] = &[Code::NamespaceNotEmpty];
        let mut seen = std::collections::HashSet::new();
        for c in Code::ALL {
            assert!(seen.insert(c.as_str()), "{c} twice");
            assert_eq!(Code::parse(c.as_str()), Some(*c));
            let in_protocol = clawfleet_protocol::failure::FailureCode::ALL
                .iter()
                .any(|f| f.as_str() == c.as_str());
            assert_eq!(
                in_protocol,
                SHARED.contains(c),
                "{c}: a protocol code too, but not listed as the same condition"
            );
        }
    }

    /// Codes no test produces, each with the reason; a new code must come with a test that
    /// produces it.
    const NOT_YET_TESTED: &[&str] = &[
        // reserved: emitted only if the compiled-in `render::HARNESS_VERSION` were not a valid
        // `HarnessVersion` (`render::revision_spec`), and every deploy in the tests sends it.
        // An Agent names no harness of its own, and another harness selected in a
        // configuration is refused as CONFIGURATION_REFUSED when it is rendered, so no request
        // or stored state can produce it.
        "INVALID_HARNESS",
    ];

    /// Every code is named by a test (`tests/`, a test module in `src/` or in the store and
    /// SSH backend crates, or the store suite), or listed in [`NOT_YET_TESTED`]; a listed code
    /// that a test now names must leave the list.
    #[test]
    fn every_code_is_produced_by_a_test_or_listed() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        // The store suite (`store/src/suite.rs`) is test code as a whole.
        let mut text = std::fs::read_to_string(root.join("../store/src/suite.rs")).unwrap();
        let mut stack = vec![
            root.join("tests"),
            root.join("src"),
            root.join("../store/src"),
            root.join("../ssh-backend/src"),
        ];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("codes.rs")
                {
                    let t = std::fs::read_to_string(&path).unwrap();
                    if path.starts_with(root.join("tests")) {
                        text.push_str(&t);
                    } else if let Some(i) = t.find("#[cfg(test)]") {
                        text.push_str(&t[i..]);
                    }
                }
            }
        }
        for c in Code::ALL {
            let named = text.contains(&format!("\"{}\"", c.as_str()))
                || text.contains(&format!("Code::{c:?}"));
            let listed = NOT_YET_TESTED.contains(&c.as_str());
            assert!(
                named || listed,
                "{}: no test produces it; add one (or list it in NOT_YET_TESTED)",
                c.as_str()
            );
            assert!(
                !(named && listed),
                "{}: a test names it now; remove it from NOT_YET_TESTED",
                c.as_str()
            );
        }
    }

    /// No `"SCREAMING_CODE"` literal outside this file, except environment variable names.
    #[test]
    fn codes_are_only_written_here() {
        const NOT_CODES: &[&str] = &[
            "CARGO_PKG_VERSION",
            "OCC_CONFIG_PATH",
            "OCC_LOG",
            "OCC_TOKEN",
            "NO_COLOR",
            "OCC_TOKEN_FILE",
            "OCC_FAULT_STOP_BEFORE",
            "PGPASSWORD",
            "OPENCLAW_GATEWAY_PASSWORD",
            "OPENAI_API_KEY",
        ];
        // This crate's sources and those of the store and the SSH backend (the store suite
        // is test code and names codes as the store keeps them).
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut stack = vec![
            root.join("src"),
            root.join("../store/src"),
            root.join("../ssh-backend/src"),
        ];
        let mut found = Vec::new();
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                if path.extension().is_none_or(|e| e != "rs")
                    || path.ends_with("codes.rs")
                    || path.ends_with("store/src/suite.rs")
                {
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                for (n, line) in text.lines().enumerate() {
                    for lit in line.split('"').skip(1).step_by(2) {
                        let is_code = lit.len() > 3
                            && lit.contains('_')
                            && lit.starts_with(|c: char| c.is_ascii_uppercase())
                            && lit
                                .chars()
                                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
                        if is_code && !NOT_CODES.contains(&lit) {
                            found.push(format!("{}:{}: {lit}", path.display(), n + 1));
                        }
                    }
                }
            }
        }
        assert!(
            found.is_empty(),
            "code literals outside codes.rs:\n{}",
            found.join("\n")
        );
    }
}
