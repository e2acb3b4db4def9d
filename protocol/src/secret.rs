//! Secrets: named values of a Namespace (a model provider's API key, a bot token) that an
//! Agent's configuration refers to and the gateway reads from a file.
//!
//! The one definition of what a secret's name and value may be, of its fingerprint, of how a
//! configuration refers to one, of the provider the coordinator renders for the gateway, and
//! of the fixed path the gateway reads it from. The coordinator, hostd and the Kubernetes
//! backend all take these from here.

use thiserror::Error;

pub use crate::ident::{SecretFingerprint, SecretName};

/// Longest secret name: `clawfleet-` (10) + 48 ≤ 64, OpenClaw's longest provider name.
pub const NAME_MAX: usize = 48;
/// Largest secret value in bytes.
pub const VALUE_MAX: usize = 64 * 1024;
/// The provider an Agent's configuration names to refer to a clawfleet secret:
/// `{"source": "file", "provider": "clawfleet", "id": "<name>"}`.
pub const REFERENCE_PROVIDER: &str = "clawfleet";
/// The source of a reference.
pub const REFERENCE_SOURCE: &str = "file";
/// The directory the gateway reads secrets from, inside its unit or Pod.
pub const DIRECTORY: &str = "/run/clawfleet/secrets";
/// The id a rendered reference names in its single-value file provider.
pub const SINGLE_VALUE_ID: &str = "value";

/// The provider the coordinator renders for the gateway per bound secret.
pub fn provider_name(name: &SecretName) -> String {
    format!("clawfleet-{name}")
}

/// The fixed path of a secret's file as the gateway sees it.
pub fn path(name: &SecretName) -> String {
    format!("{DIRECTORY}/{name}")
}

/// Why a value cannot be a secret's value.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ValueError {
    #[error("is empty; a secret value has 1 to {VALUE_MAX} bytes")]
    Empty,
    #[error("is {0} bytes; a secret value has at most {VALUE_MAX} bytes")]
    TooLarge(usize),
    #[error("is not valid UTF-8 (at byte {0})")]
    NotUtf8(usize),
    #[error("contains a NUL byte at byte {0}")]
    Nul(usize),
    #[error(
        "ends with a newline, which OpenClaw's single-value file provider drops when it reads \
         the file; send the value without it"
    )]
    TrailingNewline,
}

/// Checks a value: 1 byte to 64 KiB, valid UTF-8, no NUL, not ending in `\n` (OpenClaw's
/// single-value file provider drops one trailing `\n` or `\r\n`, so such a value would
/// resolve to other bytes than its fingerprint names). Never echoes the value.
pub fn check_value(value: &[u8]) -> Result<(), ValueError> {
    if value.is_empty() {
        return Err(ValueError::Empty);
    }
    if value.len() > VALUE_MAX {
        return Err(ValueError::TooLarge(value.len()));
    }
    if let Err(e) = std::str::from_utf8(value) {
        return Err(ValueError::NotUtf8(e.valid_up_to()));
    }
    if let Some(i) = value.iter().position(|b| *b == 0) {
        return Err(ValueError::Nul(i));
    }
    if value.ends_with(b"\n") {
        return Err(ValueError::TrailingNewline);
    }
    Ok(())
}

/// The value a file or standard input holds, as OpenClaw's single-value file provider reads
/// it: without one trailing `\n` or `\r\n`. `occ secret set` sends this.
pub fn strip_one_newline(input: &[u8]) -> &[u8] {
    input
        .strip_suffix(b"\r\n")
        .or_else(|| input.strip_suffix(b"\n"))
        .unwrap_or(input)
}

/// The credential-surface ids OpenClaw may know a concrete path by, most specific first: the
/// path itself, then with one, then two inner segments as `*` (its ids put `*` where the user
/// chose a key: `models.providers.*.apiKey`, `channels.*.accounts.*.botToken`). Its
/// `secrets.resolve` refuses an id it does not know, so they are tried in turn. None when a
/// segment holds a `.` or `*` (the id could not name it).
pub fn surface_ids(path: &[String]) -> Vec<String> {
    if path.is_empty() || path.iter().any(|s| s.contains(['.', '*']) || s.is_empty()) {
        return Vec::new();
    }
    let with_stars = |stars: &[usize]| {
        path.iter()
            .enumerate()
            .map(|(i, s)| if stars.contains(&i) { "*" } else { s.as_str() })
            .collect::<Vec<_>>()
            .join(".")
    };
    let inner = 1..path.len().saturating_sub(1);
    let mut ids = vec![with_stars(&[])];
    ids.extend(inner.clone().map(|i| with_stars(&[i])));
    for i in inner.clone() {
        ids.extend((i + 1..inner.end).map(|j| with_stars(&[i, j])));
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn surface_ids_put_stars_on_inner_segments_most_specific_first() {
        let p = |s: &str| s.split('.').map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(
            surface_ids(&p("models.providers.acme.apiKey")),
            vec![
                "models.providers.acme.apiKey",
                "models.*.acme.apiKey",
                "models.providers.*.apiKey",
                "models.*.*.apiKey",
            ]
        );
        assert!(
            surface_ids(&p("channels.telegram.accounts.main.botToken"))
                .contains(&"channels.telegram.accounts.*.botToken".to_owned())
        );
        assert_eq!(surface_ids(&p("a.b")), vec!["a.b"]);
        assert!(surface_ids(&["a".to_owned(), "b.c".to_owned()]).is_empty());
        assert!(surface_ids(&[]).is_empty());
    }

    #[test]
    fn names_follow_the_contract() {
        for ok in ["a", "slack-bot", "a1", &"a".repeat(48)] {
            assert!(SecretName::new(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "A",
            "1a",
            "a-",
            "a_b",
            "a.b",
            "-a",
            &"a".repeat(49),
            "a/b",
        ] {
            assert!(SecretName::new(bad).is_err(), "{bad}");
        }
        let n = SecretName::new("slack-bot").unwrap();
        assert_eq!(provider_name(&n), "clawfleet-slack-bot");
        assert_eq!(path(&n), "/run/clawfleet/secrets/slack-bot");
    }

    #[test]
    fn values_and_fingerprints_follow_the_contract() {
        assert_eq!(check_value(b""), Err(ValueError::Empty));
        assert_eq!(check_value(b"a\0b"), Err(ValueError::Nul(1)));
        assert_eq!(check_value(b"a\xffb"), Err(ValueError::NotUtf8(1)));
        assert_eq!(
            check_value(&vec![b'a'; VALUE_MAX + 1]),
            Err(ValueError::TooLarge(VALUE_MAX + 1))
        );
        assert!(check_value(&vec![b'a'; VALUE_MAX]).is_ok());
        assert!(check_value(b" token with spaces\r").is_ok());
        assert_eq!(check_value(b"token\n"), Err(ValueError::TrailingNewline));
        assert_eq!(
            strip_one_newline(b"-----BEGIN-----\nx\n-----END-----\r\n"),
            b"-----BEGIN-----\nx\n-----END-----"
        );
        assert_eq!(strip_one_newline(b"a\n\n"), b"a\n");
        assert_eq!(strip_one_newline(b"a"), b"a");
        // The exact bytes, nothing trimmed.
        assert_eq!(
            SecretFingerprint::of(b"").as_str(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_ne!(SecretFingerprint::of(b"x"), SecretFingerprint::of(b"x\n"));
        assert!(SecretFingerprint::new(SecretFingerprint::of(b"x").as_str()).is_ok());
        assert!(SecretFingerprint::new("sha256:ABC").is_err());
    }
}
