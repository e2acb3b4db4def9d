//! A reader for the subset of OpenSSH's allowed_signers format that hostd trusts.
//!
//! Supported: comment and blank lines; one line per key of the form
//! `principal[,principal…] [options] ssh-ed25519 <base64> [comment]`; the options
//! `namespaces="…"`, `valid-after="…Z"` and `valid-before="…Z"`.
//!
//! Anything else (principal patterns, `cert-authority`, other key types, unknown options,
//! times without `Z`) makes the whole file invalid. OpenSSH skips a line it cannot use and
//! reads on; hostd refuses the file instead, so a typo can never quietly widen or narrow trust.
//! Where the file is valid, [`AllowedSigners::check`] gives the verdict `ssh-keygen -Y verify`
//! gives.

use std::path::Path;

use ssh_key::{Algorithm, PublicKey, SshSig};
use thiserror::Error;

use crate::ident::{IdentError, Principal, truncate_for_message};
use crate::time::{TimeError, parse_ssh_time};

/// Largest allowed_signers file read.
pub const MAX_FILE_BYTES: usize = 1024 * 1024;

/// One trusted key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignerEntry {
    /// 1-based line number in the file.
    pub line: usize,
    pub principals: Vec<Principal>,
    /// `None` means any namespace.
    pub namespaces: Option<Vec<String>>,
    /// Unix seconds, inclusive.
    pub valid_after: Option<u64>,
    /// Unix seconds, inclusive.
    pub valid_before: Option<u64>,
    pub key: PublicKey,
}

/// What is wrong with one line.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LineProblem {
    #[error("the line has no key after its principals")]
    MissingKey,
    #[error("quoted principals are not supported")]
    QuotedPrincipals,
    #[error("principal {principal:?} {source}")]
    BadPrincipal {
        principal: String,
        source: IdentError,
    },
    #[error("option {0:?} is not supported (only namespaces=, valid-after= and valid-before=)")]
    UnsupportedOption(String),
    #[error("option {0:?} appears more than once")]
    DuplicateOption(String),
    #[error("the value of option {0:?} must be in double quotes")]
    UnquotedValue(String),
    #[error("an option value has no closing quote")]
    UnterminatedQuote,
    #[error("namespace {0:?} is not supported: patterns and empty names are refused")]
    BadNamespace(String),
    #[error("{0}")]
    BadTime(#[from] TimeError),
    #[error("key type {0:?} is not supported; only ssh-ed25519 keys are trusted")]
    UnsupportedKeyType(String),
    #[error("the key cannot be decoded: {0}")]
    BadKey(String),
}

/// Why an allowed_signers file is refused.
#[derive(Debug, Error)]
pub enum SignersFileError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is {size} bytes; at most {max} are read")]
    TooLarge { path: String, size: u64, max: usize },
    #[error("{path} is not UTF-8 text")]
    NotText { path: String },
    #[error("line {line}: {problem}")]
    Line { line: usize, problem: LineProblem },
}

/// Why a signature is not accepted by the file.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CheckError {
    #[error("the signing key is not in allowed_signers")]
    KeyNotFound,
    #[error("the signing key is not allowed for principal {0:?}")]
    PrincipalNotAllowed(String),
    #[error("the signing key is not allowed to sign in namespace {0:?}")]
    NamespaceNotAllowed(String),
    #[error("the signing key's entry is not valid at this time (valid-after/valid-before)")]
    OutsideValidity,
    #[error("the signature does not verify: {0}")]
    BadSignature(String),
}

/// A parsed allowed_signers file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedSigners {
    entries: Vec<SignerEntry>,
}

impl AllowedSigners {
    /// Reads and parses a file, refusing files over [`MAX_FILE_BYTES`].
    pub fn load(path: &Path) -> Result<Self, SignersFileError> {
        use std::io::Read;
        let shown = path.display().to_string();
        let file = std::fs::File::open(path).map_err(|source| SignersFileError::Read {
            path: shown.clone(),
            source,
        })?;
        let mut bytes = Vec::new();
        file.take(MAX_FILE_BYTES as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|source| SignersFileError::Read {
                path: shown.clone(),
                source,
            })?;
        if bytes.len() > MAX_FILE_BYTES {
            return Err(SignersFileError::TooLarge {
                path: shown,
                size: bytes.len() as u64,
                max: MAX_FILE_BYTES,
            });
        }
        let text =
            String::from_utf8(bytes).map_err(|_| SignersFileError::NotText { path: shown })?;
        Self::parse(&text)
    }

    /// Parses the text of a file.
    pub fn parse(text: &str) -> Result<Self, SignersFileError> {
        let mut entries = Vec::new();
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let entry = parse_line(line, trimmed)
                .map_err(|problem| SignersFileError::Line { line, problem })?;
            entries.push(entry);
        }
        Ok(Self { entries })
    }

    /// The entries in file order.
    pub fn entries(&self) -> &[SignerEntry] {
        &self.entries
    }

    /// Whether `key` may sign as `principal` in `namespace` at `now` (Unix seconds).
    /// Returns the first entry that allows it, or the most specific reason none does.
    pub fn check(
        &self,
        key: &PublicKey,
        principal: &str,
        namespace: &str,
        now: u64,
    ) -> Result<&SignerEntry, CheckError> {
        let mut best = CheckError::KeyNotFound;
        let rank = |e: &CheckError| match e {
            CheckError::KeyNotFound => 0,
            CheckError::PrincipalNotAllowed(_) => 1,
            CheckError::NamespaceNotAllowed(_) => 2,
            CheckError::OutsideValidity => 3,
            CheckError::BadSignature(_) => 4,
        };
        for entry in &self.entries {
            let verdict = entry.allows(key, principal, namespace, now);
            match verdict {
                Ok(()) => return Ok(entry),
                Err(e) if rank(&e) > rank(&best) => best = e,
                Err(_) => {}
            }
        }
        Err(best)
    }

    /// What `ssh-keygen -Y verify -f FILE -I principal -n namespace` decides: the signature
    /// must verify over `message` in `namespace`, and its key must be allowed.
    pub fn verify(
        &self,
        principal: &str,
        namespace: &str,
        message: &[u8],
        signature: &SshSig,
        now: u64,
    ) -> Result<&SignerEntry, CheckError> {
        let key = PublicKey::from(signature.public_key().clone());
        key.verify(namespace, message, signature)
            .map_err(|e| CheckError::BadSignature(e.to_string()))?;
        self.check(&key, principal, namespace, now)
    }

    /// The principals `key` may sign as in `namespace` at `now`.
    pub fn principals_for(&self, key: &PublicKey, namespace: &str, now: u64) -> Vec<&Principal> {
        self.entries
            .iter()
            .filter(|e| {
                e.key.key_data() == key.key_data()
                    && e.namespace_allowed(namespace)
                    && e.time_allowed(now)
            })
            .flat_map(|e| e.principals.iter())
            .collect()
    }
}

impl SignerEntry {
    fn namespace_allowed(&self, namespace: &str) -> bool {
        self.namespaces
            .as_ref()
            .is_none_or(|list| list.iter().any(|n| n == namespace))
    }

    fn time_allowed(&self, now: u64) -> bool {
        self.valid_after.is_none_or(|t| now >= t) && self.valid_before.is_none_or(|t| now <= t)
    }

    fn allows(
        &self,
        key: &PublicKey,
        principal: &str,
        namespace: &str,
        now: u64,
    ) -> Result<(), CheckError> {
        if self.key.key_data() != key.key_data() {
            return Err(CheckError::KeyNotFound);
        }
        if !self.principals.iter().any(|p| p.as_str() == principal) {
            return Err(CheckError::PrincipalNotAllowed(truncate_for_message(
                principal,
            )));
        }
        if !self.namespace_allowed(namespace) {
            return Err(CheckError::NamespaceNotAllowed(truncate_for_message(
                namespace,
            )));
        }
        if !self.time_allowed(now) {
            return Err(CheckError::OutsideValidity);
        }
        Ok(())
    }
}

/// Splits off the next field: up to unquoted whitespace.
fn next_field(rest: &str) -> Result<(&str, &str), LineProblem> {
    let mut in_quotes = false;
    for (i, c) in rest.char_indices() {
        match c {
            '"' => in_quotes = !in_quotes,
            c if c.is_whitespace() && !in_quotes => {
                return Ok((&rest[..i], rest[i..].trim_start()));
            }
            _ => {}
        }
    }
    if in_quotes {
        return Err(LineProblem::UnterminatedQuote);
    }
    Ok((rest, ""))
}

fn looks_like_key_type(field: &str) -> bool {
    field.starts_with("ssh-")
        || field.starts_with("ecdsa-")
        || field.starts_with("sk-")
        || field.contains("@openssh.com")
}

fn parse_line(line: usize, text: &str) -> Result<SignerEntry, LineProblem> {
    let (principals_field, rest) = next_field(text)?;
    if principals_field.starts_with('"') {
        return Err(LineProblem::QuotedPrincipals);
    }
    let principals = principals_field
        .split(',')
        .map(|p| {
            Principal::new(p).map_err(|source| LineProblem::BadPrincipal {
                principal: truncate_for_message(p),
                source,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if rest.is_empty() {
        return Err(LineProblem::MissingKey);
    }
    let (first, after_first) = next_field(rest)?;
    let (options, key_text) = if looks_like_key_type(first) {
        (None, rest)
    } else {
        (Some(first), after_first)
    };
    let mut entry = SignerEntry {
        line,
        principals,
        namespaces: None,
        valid_after: None,
        valid_before: None,
        key: parse_key(key_text)?,
    };
    if let Some(options) = options {
        parse_options(options, &mut entry)?;
    }
    Ok(entry)
}

fn parse_key(text: &str) -> Result<PublicKey, LineProblem> {
    let (key_type, rest) = next_field(text)?;
    if key_type.is_empty() {
        return Err(LineProblem::MissingKey);
    }
    if key_type != "ssh-ed25519" {
        return Err(LineProblem::UnsupportedKeyType(truncate_for_message(
            key_type,
        )));
    }
    let (base64, _comment) = next_field(rest)?;
    if base64.is_empty() {
        return Err(LineProblem::MissingKey);
    }
    let key = PublicKey::from_openssh(&format!("{key_type} {base64}"))
        .map_err(|e| LineProblem::BadKey(e.to_string()))?;
    if key.algorithm() != Algorithm::Ed25519 {
        return Err(LineProblem::UnsupportedKeyType(key.algorithm().to_string()));
    }
    Ok(key)
}

/// Splits `a,b="x,y",c` on commas outside quotes.
fn split_options(text: &str) -> Result<Vec<&str>, LineProblem> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut in_quotes = false;
    for (i, c) in text.char_indices() {
        match c {
            '"' => in_quotes = !in_quotes,
            ',' if !in_quotes => {
                out.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if in_quotes {
        return Err(LineProblem::UnterminatedQuote);
    }
    out.push(&text[start..]);
    Ok(out)
}

fn parse_options(text: &str, entry: &mut SignerEntry) -> Result<(), LineProblem> {
    for option in split_options(text)? {
        let (name, value) = match option.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (option, None),
        };
        let lower = name.to_ascii_lowercase();
        let quoted = |value: Option<&str>| -> Result<String, LineProblem> {
            let v = value.ok_or_else(|| LineProblem::UnquotedValue(lower.clone()))?;
            v.strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .filter(|v| !v.contains('"'))
                .map(str::to_owned)
                .ok_or_else(|| LineProblem::UnquotedValue(lower.clone()))
        };
        match lower.as_str() {
            "namespaces" => {
                if entry.namespaces.is_some() {
                    return Err(LineProblem::DuplicateOption(lower));
                }
                let list = quoted(value)?;
                let names = list
                    .split(',')
                    .map(|n| {
                        let ok = !n.is_empty()
                            && n.chars().all(|c| {
                                c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@')
                            });
                        if ok {
                            Ok(n.to_owned())
                        } else {
                            Err(LineProblem::BadNamespace(truncate_for_message(n)))
                        }
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                entry.namespaces = Some(names);
            }
            "valid-after" => {
                if entry.valid_after.is_some() {
                    return Err(LineProblem::DuplicateOption(lower));
                }
                entry.valid_after = Some(parse_ssh_time(&quoted(value)?)?);
            }
            "valid-before" => {
                if entry.valid_before.is_some() {
                    return Err(LineProblem::DuplicateOption(lower));
                }
                entry.valid_before = Some(parse_ssh_time(&quoted(value)?)?);
            }
            _ => {
                return Err(LineProblem::UnsupportedOption(truncate_for_message(name)));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGtlzZ3MFfuteL1oS3yr1Yx72/TNBkiGm1NN+JwrXN+M";

    fn line_problem(text: &str) -> LineProblem {
        match AllowedSigners::parse(text) {
            Err(SignersFileError::Line { problem, .. }) => problem,
            other => panic!("expected a line problem for {text:?}, got {other:?}"),
        }
    }

    #[test]
    fn parses_the_subset() {
        let text = format!(
            "# comment\n\nocc@a,occ@b {KEY} my comment\nops namespaces=\"clawfleet-operation,x\",valid-after=\"20250101Z\",VALID-BEFORE=\"203001010000Z\" {KEY}\n"
        );
        let signers = AllowedSigners::parse(&text).unwrap();
        let e = signers.entries();
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].line, 3);
        assert_eq!(e[0].principals.len(), 2);
        assert_eq!(e[0].namespaces, None);
        assert_eq!(
            e[1].namespaces,
            Some(vec!["clawfleet-operation".to_owned(), "x".to_owned()])
        );
        assert_eq!(e[1].valid_after, Some(1_735_689_600));
        assert_eq!(e[1].valid_before, Some(1_893_456_000));
    }

    #[test]
    fn refuses_everything_outside_the_subset() {
        assert!(matches!(
            line_problem(&format!("a cert-authority {KEY}")),
            LineProblem::UnsupportedOption(o) if o == "cert-authority"
        ));
        assert!(matches!(
            line_problem(&format!("a foo=\"bar\" {KEY}")),
            LineProblem::UnsupportedOption(_)
        ));
        assert!(matches!(
            line_problem(&format!("a* {KEY}")),
            LineProblem::BadPrincipal { .. }
        ));
        assert!(matches!(
            line_problem(&format!("\"a b\" {KEY}")),
            LineProblem::QuotedPrincipals
        ));
        assert!(matches!(
            line_problem(&format!("a namespaces=\"x*\" {KEY}")),
            LineProblem::BadNamespace(_)
        ));
        assert!(matches!(
            line_problem(&format!("a namespaces=x {KEY}")),
            LineProblem::UnquotedValue(_)
        ));
        assert!(matches!(
            line_problem(&format!("a valid-after=\"20250101\" {KEY}")),
            LineProblem::BadTime(TimeError::NotUtc(_))
        ));
        assert!(matches!(
            line_problem(&format!("a valid-after=\"1Z\",valid-after=\"2Z\" {KEY}")),
            LineProblem::BadTime(_)
        ));
        assert!(matches!(
            line_problem(&format!(
                "a valid-after=\"20250101Z\",valid-after=\"20250101Z\" {KEY}"
            )),
            LineProblem::DuplicateOption(_)
        ));
        assert!(matches!(
            line_problem("a ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQ"),
            LineProblem::UnsupportedKeyType(_)
        ));
        assert!(matches!(
            line_problem("a ssh-ed25519 AAAAnotbase64!!"),
            LineProblem::BadKey(_)
        ));
        assert!(matches!(line_problem("a"), LineProblem::MissingKey));
        assert!(matches!(
            line_problem("a namespaces=\"x"),
            LineProblem::UnterminatedQuote
        ));
    }

    #[test]
    fn a_bad_line_invalidates_the_file_even_after_good_ones() {
        let text = format!("good {KEY}\nbad cert-authority {KEY}\n");
        match AllowedSigners::parse(&text) {
            Err(SignersFileError::Line { line: 2, .. }) => {}
            other => panic!("{other:?}"),
        }
    }
}
