//! `hostd enrol`: authorises one coordinator on this host.
//!
//! Its SSH login key goes into root's `authorized_keys` behind the forced command, and its
//! operation-signing key into `allowed_signers` for the clawfleet namespace only. Both edits
//! are additive and idempotent: other lines are kept byte for byte, an existing entry for the
//! same key with different options is refused rather than rewritten (an operator put it there
//! on purpose), and a second run changes nothing. Files are replaced atomically, so sshd and
//! hostd never read half a file.

use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use clawfleet_protocol::atomic_file::{self, AtomicFileError, Attributes};
use clawfleet_protocol::ident::IdentError;
use clawfleet_protocol::ssh_key::{Algorithm, PublicKey};
use clawfleet_protocol::{AllowedSigners, Fingerprint, Principal, SIGNATURE_NAMESPACE};
use thiserror::Error;

/// Root's authorized_keys, where the coordinator's SSH login key goes.
pub const DEFAULT_AUTHORIZED_KEYS: &str = "/root/.ssh/authorized_keys";
/// The operation signers hostd trusts.
pub const DEFAULT_ALLOWED_SIGNERS: &str = "/etc/clawfleet/allowed_signers";
/// The host key whose fingerprint the coordinator pins.
pub const DEFAULT_HOST_KEY: &str = "/etc/ssh/ssh_host_ed25519_key.pub";
/// What the coordinator's SSH key may run.
pub const DEFAULT_FORCED_COMMAND: &str = "/usr/sbin/hostd serve";

/// Largest authorized_keys or host key file read; anything bigger is not something to edit.
const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// What to enrol, and where. [`EnrolRequest::new`] fills in the standard paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnrolRequest {
    /// The coordinator's SSH login public key, one OpenSSH line (`ssh-ed25519 AAAA… [comment]`).
    pub ssh_key: String,
    /// The coordinator's operation-signing public key, one OpenSSH line.
    pub signing_key: String,
    /// The principal envelopes name as their issuer (the coordinator's issuer key id).
    pub principal: String,
    pub authorized_keys: PathBuf,
    pub allowed_signers: PathBuf,
    pub host_key: PathBuf,
    pub forced_command: String,
    /// Log in as this dedicated user through sudo instead of as root
    /// (`crate::login_user`); then its authorized_keys and forced command are used.
    pub login_user: Option<crate::login_user::LoginUserRequest>,
}

impl EnrolRequest {
    /// A request with the default paths and forced command.
    pub fn new(
        ssh_key: impl Into<String>,
        signing_key: impl Into<String>,
        principal: impl Into<String>,
    ) -> Self {
        Self {
            ssh_key: ssh_key.into(),
            signing_key: signing_key.into(),
            principal: principal.into(),
            authorized_keys: PathBuf::from(DEFAULT_AUTHORIZED_KEYS),
            allowed_signers: PathBuf::from(DEFAULT_ALLOWED_SIGNERS),
            host_key: PathBuf::from(DEFAULT_HOST_KEY),
            forced_command: DEFAULT_FORCED_COMMAND.into(),
            login_user: None,
        }
    }
}

/// What happened to one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FileChange {
    /// The entry was already there.
    Unchanged,
    /// The entry was appended to an existing file.
    Added,
    /// The file did not exist and was created with the entry.
    Created,
    /// The entry an earlier enrol wrote was replaced by today's (its forced command now
    /// names the key).
    Updated,
}

impl FileChange {
    pub fn changed(self) -> bool {
        self != FileChange::Unchanged
    }
}

/// The result of a successful enrolment.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EnrolOutcome {
    /// The host key fingerprint (`SHA256:…`) the coordinator must pin for this host.
    pub host_key_fingerprint: Fingerprint,
    pub authorized_keys: FileChange,
    pub allowed_signers: FileChange,
    /// The login user set up for `--login-user`, if one was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub login_user: Option<crate::login_user::LoginUserOutcome>,
}

impl EnrolOutcome {
    /// Whether anything on disk changed.
    pub fn changed(&self) -> bool {
        self.authorized_keys.changed()
            || self.allowed_signers.changed()
            || self
                .login_user
                .as_ref()
                .is_some_and(|l| l.user.changed() || l.sudoers.changed())
    }
}

/// Why enrolment refused or failed. Nothing is changed when any of these is returned.
#[derive(Debug, Error)]
pub enum EnrolError {
    #[error("the principal {principal:?} is not valid: it {source}")]
    InvalidPrincipal {
        principal: String,
        source: IdentError,
    },
    #[error("the coordinator {which} key is not a valid OpenSSH public key line: {detail}")]
    InvalidKey { which: &'static str, detail: String },
    #[error("the coordinator {which} key is of type {found:?}; only ssh-ed25519 keys are accepted")]
    UnsupportedKeyType { which: &'static str, found: String },
    #[error(
        "the forced command must be an absolute path with arguments, without quotes, backslashes or control characters"
    )]
    InvalidForcedCommand,
    #[error("cannot read the host key {path}: {detail}")]
    HostKey { path: String, detail: String },
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is larger than {max} bytes, so it is not edited")]
    TooLarge { path: String, max: u64 },
    #[error("{path} is not a regular file (a symlink or something else), so it is not replaced")]
    NotRegularFile { path: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    /// Names the path and the step that failed; the file is as it was.
    #[error(transparent)]
    Replace(#[from] AtomicFileError),
    #[error(transparent)]
    LoginUser(#[from] crate::login_user::LoginUserError),
    #[error(
        "{path} line {line} already authorises this SSH key with other options; remove or fix that line by hand, enrol does not rewrite it"
    )]
    SshKeyOptionsConflict { path: String, line: usize },
    #[error(
        "{path} line {line} already trusts this signing key for other principals ({principals}); remove that line by hand to enrol it as {principal:?}"
    )]
    SignerPrincipalConflict {
        path: String,
        line: usize,
        principals: String,
        principal: String,
    },
    #[error(
        "{path} line {line} already trusts this signing key with other options; remove or fix that line by hand, enrol does not rewrite it"
    )]
    SignerOptionsConflict { path: String, line: usize },
    #[error("{path} is not a valid allowed_signers file ({detail}); fix it before enrolling")]
    ExistingSignersInvalid { path: String, detail: String },
    #[error(
        "{path} did not read back as a valid allowed_signers file ({detail}); the change was rolled back"
    )]
    WrittenSignersInvalid { path: String, detail: String },
}

/// A validated Ed25519 key and its canonical `ssh-ed25519 <base64>` text.
struct Key {
    key: PublicKey,
    /// `ssh-ed25519 <base64>` without comment: what entries are compared on.
    data: String,
    /// The base64 blob alone.
    blob: String,
}

fn parse_key(which: &'static str, text: &str) -> Result<Key, EnrolError> {
    let text = text.trim();
    if text.contains(['\n', '\r']) {
        return Err(EnrolError::InvalidKey {
            which,
            detail: "more than one line".into(),
        });
    }
    let kind = text.split_ascii_whitespace().next().unwrap_or_default();
    if kind != Algorithm::Ed25519.as_str() {
        return Err(EnrolError::UnsupportedKeyType {
            which,
            found: shorten(kind),
        });
    }
    let key = PublicKey::from_openssh(text).map_err(|e| EnrolError::InvalidKey {
        which,
        detail: e.to_string(),
    })?;
    if key.algorithm() != Algorithm::Ed25519 {
        return Err(EnrolError::UnsupportedKeyType {
            which,
            found: key.algorithm().to_string(),
        });
    }
    let mut bare = key.clone();
    bare.set_comment("");
    let data = bare.to_openssh().map_err(|e| EnrolError::InvalidKey {
        which,
        detail: e.to_string(),
    })?;
    let data = data.trim().to_owned();
    let blob = data
        .split_ascii_whitespace()
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    Ok(Key { key, data, blob })
}

/// Untrusted text for a message: printable, at most 40 characters.
fn shorten(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .take(40)
        .collect()
}

/// The comment of the key line as given, if it is safe to write after the key.
fn safe_comment(key: &PublicKey) -> Option<&str> {
    let c = key.comment().as_str().ok()?.trim();
    (!c.is_empty() && c.len() <= 200 && c.chars().all(|ch| ch.is_ascii_graphic() || ch == ' '))
        .then_some(c)
}

fn check_forced_command(command: &str) -> Result<(), EnrolError> {
    let ok = command.starts_with('/')
        && command.len() <= 1024
        && !command
            .chars()
            .any(|c| c.is_control() || c == '"' || c == '\\');
    if ok {
        Ok(())
    } else {
        Err(EnrolError::InvalidForcedCommand)
    }
}

fn shown(path: &Path) -> String {
    path.display().to_string()
}

/// The file's bytes and metadata, or `None` if it does not exist. Refuses symlinks and other
/// non-regular files (they would be replaced by the rename), and files over `max` bytes.
fn read_existing(path: &Path, max: u64) -> Result<Option<(Vec<u8>, fs::Metadata)>, EnrolError> {
    read_file(path, max, false)
}

/// Reads a file up to `max` bytes; `follow` allows a symlink (only for files never replaced).
fn read_file(
    path: &Path,
    max: u64,
    follow: bool,
) -> Result<Option<(Vec<u8>, fs::Metadata)>, EnrolError> {
    let stat = if follow {
        fs::metadata
    } else {
        fs::symlink_metadata
    };
    let meta = match stat(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(EnrolError::Read {
                path: shown(path),
                source,
            });
        }
    };
    if !meta.file_type().is_file() {
        return Err(EnrolError::NotRegularFile { path: shown(path) });
    }
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|f| f.take(max + 1).read_to_end(&mut bytes))
        .map_err(|source| EnrolError::Read {
            path: shown(path),
            source,
        })?;
    if bytes.len() as u64 > max {
        return Err(EnrolError::TooLarge {
            path: shown(path),
            max,
        });
    }
    Ok(Some((bytes, meta)))
}

/// The first three fields of an authorized_keys line, splitting on blanks outside double
/// quotes (option values such as `command="a b"` contain blanks).
fn key_line_fields(line: &str) -> Vec<&str> {
    let mut fields = Vec::new();
    let mut start = None;
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in line.char_indices() {
        if fields.len() == 3 {
            break;
        }
        match start {
            None if c == ' ' || c == '\t' => {}
            None => {
                start = Some(i);
                quoted = c == '"';
                escaped = false;
            }
            Some(s) => {
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == '"' {
                    quoted = !quoted;
                } else if (c == ' ' || c == '\t') && !quoted {
                    fields.push(&line[s..i]);
                    start = None;
                }
            }
        }
    }
    if let (Some(s), true) = (start, fields.len() < 3) {
        fields.push(&line[s..]);
    }
    fields
}

/// Lines of a file as text for matching, with 1-based numbers. Bytes are never rewritten
/// from this view; it only decides whether to append.
fn text_lines(bytes: &[u8]) -> impl Iterator<Item = (usize, String)> + '_ {
    bytes.split(|&b| b == b'\n').enumerate().map(|(i, l)| {
        let l = String::from_utf8_lossy(l);
        (i + 1, l.trim_end_matches('\r').to_owned())
    })
}

/// Whether an authorized_keys file has the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyEntry {
    Absent,
    /// With exactly the options enrol writes.
    Present,
    /// With the options an earlier enrol wrote (its forced command without `--key`, or with
    /// `--key <id>`, which `hostd serve` misread when the id began with `-`) on this 1-based
    /// line, which enrol replaces.
    Earlier(usize),
}

/// Whether root's authorized_keys already has the key with exactly `options` (or one of
/// `earlier`, what earlier enrols wrote); refuses if it has the key with anything else.
fn authorized_keys_has(
    path: &Path,
    bytes: &[u8],
    key: &Key,
    options: &str,
    earlier: &[String],
) -> Result<KeyEntry, EnrolError> {
    let mut found = KeyEntry::Absent;
    for (number, line) in text_lines(bytes) {
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let fields = key_line_fields(trimmed);
        let (line_options, kind, blob) = match fields.as_slice() {
            [kind, blob, ..] if *blob == key.blob => ("", *kind, *blob),
            [opts, kind, blob, ..] if *blob == key.blob => (*opts, *kind, *blob),
            _ => continue,
        };
        if format!("{kind} {blob}") != key.data {
            continue;
        }
        if line_options == options {
            found = KeyEntry::Present;
        } else if earlier.iter().any(|e| e == line_options) && found == KeyEntry::Absent {
            found = KeyEntry::Earlier(number);
        } else {
            return Err(EnrolError::SshKeyOptionsConflict {
                path: shown(path),
                line: number,
            });
        }
    }
    Ok(found)
}

/// Whether allowed_signers already trusts the key exactly as enrol would write it; refuses
/// if it trusts the key for other principals or with other options.
fn allowed_signers_has(
    path: &Path,
    signers: &AllowedSigners,
    key: &Key,
    principal: &Principal,
) -> Result<bool, EnrolError> {
    let mut found = false;
    for entry in signers.entries() {
        if entry.key.key_data() != key.key.key_data() {
            continue;
        }
        if !entry.principals.contains(principal) {
            return Err(EnrolError::SignerPrincipalConflict {
                path: shown(path),
                line: entry.line,
                principals: entry
                    .principals
                    .iter()
                    .map(|p| p.as_str())
                    .collect::<Vec<_>>()
                    .join(","),
                principal: principal.to_string(),
            });
        }
        let exact = entry.principals.len() == 1
            && entry.namespaces.as_deref() == Some(&[SIGNATURE_NAMESPACE.to_owned()][..])
            && entry.valid_after.is_none()
            && entry.valid_before.is_none();
        if !exact {
            return Err(EnrolError::SignerOptionsConflict {
                path: shown(path),
                line: entry.line,
            });
        }
        found = true;
    }
    Ok(found)
}

/// `existing` plus `line`, keeping every existing byte; a missing final newline is added
/// so the new line starts on its own.
fn appended(existing: &[u8], line: &str) -> Vec<u8> {
    let mut out = existing.to_vec();
    if !out.is_empty() && !out.ends_with(b"\n") {
        out.push(b'\n');
    }
    out.extend_from_slice(line.as_bytes());
    out.push(b'\n');
    out
}

/// `existing` with its 1-based line `number` replaced by `line`, every other byte kept.
fn replaced(existing: &[u8], number: usize, line: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(existing.len() + line.len());
    for (i, l) in existing.split(|&b| b == b'\n').enumerate() {
        if i > 0 {
            out.push(b'\n');
        }
        if i + 1 == number {
            out.extend_from_slice(line.as_bytes());
        } else {
            out.extend_from_slice(l);
        }
    }
    out
}

/// Creates the parent directory with `mode` if it is missing.
fn ensure_parent(path: &Path, mode: u32) -> Result<(), EnrolError> {
    let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) else {
        return Ok(());
    };
    if parent.is_dir() {
        return Ok(());
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(parent)
        .map_err(|source| EnrolError::Write {
            path: shown(parent),
            source,
        })
}

/// Replaces `path` with `contents` atomically (`clawfleet_protocol::atomic_file`: a
/// temporary sibling, fsync, rename, fsync of the directory). The new file gets the old
/// file's mode and owner, or `new_mode` (owned by the caller, root in production) when there
/// was none.
fn write_atomic(
    path: &Path,
    contents: &[u8],
    previous: Option<&fs::Metadata>,
    new_mode: u32,
) -> Result<(), EnrolError> {
    let attributes = previous.map_or(Attributes::mode(new_mode), Attributes::of);
    Ok(atomic_file::write_atomic(path, contents, attributes)?)
}

/// Puts a file back as it was before enrol touched it.
fn restore(path: &Path, previous: Option<&(Vec<u8>, fs::Metadata)>) -> Result<(), EnrolError> {
    match previous {
        Some((bytes, meta)) => write_atomic(path, bytes, Some(meta), 0o644),
        None => fs::remove_file(path).map_err(|source| EnrolError::Write {
            path: shown(path),
            source,
        }),
    }
}

/// Authorises a coordinator on this host; see the module docs. Everything is validated and
/// every conflict detected before the first write.
pub fn enrol(req: &EnrolRequest) -> Result<EnrolOutcome, EnrolError> {
    if let Some(lu) = &req.login_user {
        crate::login_user::check_name(&lu.name)?;
    }
    let principal =
        Principal::new(req.principal.as_str()).map_err(|source| EnrolError::InvalidPrincipal {
            principal: shorten(&req.principal),
            source,
        })?;
    let ssh_key = parse_key("SSH", &req.ssh_key)?;
    let signing_key = parse_key("signing", &req.signing_key)?;
    check_forced_command(&req.forced_command)?;

    let host_key = read_file(&req.host_key, MAX_FILE_BYTES, true)?
        .ok_or_else(|| EnrolError::HostKey {
            path: shown(&req.host_key),
            detail: "it does not exist".into(),
        })
        .and_then(|(bytes, _)| {
            let text = String::from_utf8_lossy(&bytes);
            PublicKey::from_openssh(text.trim()).map_err(|e| EnrolError::HostKey {
                path: shown(&req.host_key),
                detail: e.to_string(),
            })
        })?;
    let host_key_fingerprint = Fingerprint::of(&host_key);

    // A login user instead of root: its account, home and sudoers drop-in first; its
    // authorized_keys (root-owned, readable by it) then gets the key, forced through sudo.
    let login_user = match &req.login_user {
        Some(lu) => Some(crate::login_user::set_up(lu)?),
        None => None,
    };
    // As root, the forced command names the key (`--key=<id>`: an id may begin with `-`), so
    // hostd bounds sessions per coordinator key (issue 26, N12); an earlier enrol's line
    // without it, or with `--key <id>`, is replaced. Through
    // sudo the drop-in allows exactly `hostd serve` and `hostd relay`, so a login user's
    // sessions are bounded per login user (sudo's `SUDO_USER`) instead; an earlier enrol's
    // line that forced `serve` alone is replaced.
    let (authorized_keys_path, forced_command, earlier_commands, keys_mode) = match &login_user {
        Some(l) => (
            l.authorized_keys.clone(),
            l.forced_command.clone(),
            req.login_user
                .iter()
                .map(|lu| lu.earlier_forced_command())
                .collect(),
            0o644,
        ),
        None => {
            let id = crate::session::LoginKeyId::of(&ssh_key.key);
            (
                req.authorized_keys.clone(),
                format!("{} --key={}", req.forced_command, id.as_str()),
                vec![
                    req.forced_command.clone(),
                    format!("{} --key {}", req.forced_command, id.as_str()),
                ],
                0o600,
            )
        }
    };
    check_forced_command(&forced_command)?;
    let req = &EnrolRequest {
        authorized_keys: authorized_keys_path,
        forced_command,
        ..req.clone()
    };

    // authorized_keys: decide.
    let options = format!("restrict,command=\"{}\"", req.forced_command);
    let earlier_options: Vec<String> = earlier_commands
        .iter()
        .map(|c| format!("restrict,command=\"{c}\""))
        .collect();
    let keys_before = read_existing(&req.authorized_keys, MAX_FILE_BYTES)?;
    let keys_entry = match &keys_before {
        Some((bytes, _)) => authorized_keys_has(
            &req.authorized_keys,
            bytes,
            &ssh_key,
            &options,
            &earlier_options,
        )?,
        None => KeyEntry::Absent,
    };
    let keys_line = match safe_comment(&ssh_key.key) {
        Some(c) => format!("{options} {} {c}", ssh_key.data),
        None => format!("{options} {}", ssh_key.data),
    };

    // allowed_signers: decide.
    let signers_before = read_existing(
        &req.allowed_signers,
        clawfleet_protocol::allowed_signers::MAX_FILE_BYTES as u64,
    )?;
    let signers_text = match &signers_before {
        Some((bytes, _)) => {
            String::from_utf8(bytes.clone()).map_err(|_| EnrolError::ExistingSignersInvalid {
                path: shown(&req.allowed_signers),
                detail: "it is not UTF-8 text".into(),
            })?
        }
        None => String::new(),
    };
    let signers =
        AllowedSigners::parse(&signers_text).map_err(|e| EnrolError::ExistingSignersInvalid {
            path: shown(&req.allowed_signers),
            detail: e.to_string(),
        })?;
    let signers_present =
        allowed_signers_has(&req.allowed_signers, &signers, &signing_key, &principal)?;
    let signers_line = format!(
        "{principal} namespaces=\"{SIGNATURE_NAMESPACE}\" {}",
        signing_key.data
    );

    // Write: allowed_signers first (checked by reading it back), then authorized_keys, so
    // the coordinator can only log in once its operations can be verified.
    let allowed_signers = if signers_present {
        FileChange::Unchanged
    } else {
        let new = appended(signers_text.as_bytes(), &signers_line);
        ensure_parent(&req.allowed_signers, 0o755)?;
        write_atomic(
            &req.allowed_signers,
            &new,
            signers_before.as_ref().map(|(_, m)| m),
            0o644,
        )?;
        let reread = fs::read_to_string(&req.allowed_signers)
            .map_err(|e| e.to_string())
            .and_then(|t| AllowedSigners::parse(&t).map_err(|e| e.to_string()));
        if let Err(detail) = reread {
            restore(&req.allowed_signers, signers_before.as_ref())?;
            return Err(EnrolError::WrittenSignersInvalid {
                path: shown(&req.allowed_signers),
                detail,
            });
        }
        if signers_before.is_some() {
            FileChange::Added
        } else {
            FileChange::Created
        }
    };

    let authorized_keys = if keys_entry == KeyEntry::Present {
        FileChange::Unchanged
    } else {
        let existing = keys_before.as_ref().map_or(&[][..], |(b, _)| b.as_slice());
        let contents = match keys_entry {
            KeyEntry::Earlier(number) => replaced(existing, number, &keys_line),
            _ => appended(existing, &keys_line),
        };
        let written = ensure_parent(&req.authorized_keys, 0o700).and_then(|()| {
            write_atomic(
                &req.authorized_keys,
                &contents,
                keys_before.as_ref().map(|(_, m)| m),
                keys_mode,
            )
        });
        if let Err(e) = written {
            if allowed_signers.changed() {
                // Best effort: leave no half-enrolment behind; a rerun would finish it anyway.
                let _ = restore(&req.allowed_signers, signers_before.as_ref());
            }
            return Err(e);
        }
        match (keys_entry, &keys_before) {
            (KeyEntry::Earlier(_), _) => FileChange::Updated,
            (_, Some(_)) => FileChange::Added,
            (_, None) => FileChange::Created,
        }
    };

    Ok(EnrolOutcome {
        host_key_fingerprint,
        authorized_keys,
        allowed_signers,
        login_user,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    const KEY_A: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOoiH86FPsWOHTpC6dd1O8DwZoDfXuxpuEmcPlZQdKIm key-a@test";
    const KEY_B: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB6TeR9MjGokmZivHwznNGVqnbzd9EAdEPOidCNyuf8V key-b@test";
    const KEY_C: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPmQ1+8QPtNQ2yOglYcbzhbLC2X/2jhTXO08DvU+OVaB key-c@test";
    const KEY_EC: &str = "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBF3Hs/mKPEExMNaE8wjwbZXC1hLm5EZ8x0WWEH43OwCzS7H3sVAR3m7dXREGFoEWjUcg//mI8fdAZLyzhvOxbkc= ec";
    const BARE_A: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOoiH86FPsWOHTpC6dd1O8DwZoDfXuxpuEmcPlZQdKIm";
    const BARE_B: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB6TeR9MjGokmZivHwznNGVqnbzd9EAdEPOidCNyuf8V";
    /// KEY_A's login key id: its SHA-256 fingerprint, URL-safe.
    const ID_A: &str = "UoIgluOl6daYn_xeyBwV5oTTdlvo9d5vjx6mJ2P9FDI";

    struct Env {
        dir: tempfile::TempDir,
        req: EnrolRequest,
    }

    impl Env {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let host_key = dir.path().join("ssh_host_ed25519_key.pub");
            fs::write(&host_key, format!("{KEY_C}\n")).unwrap();
            let mut req = EnrolRequest::new(KEY_A, KEY_B, "occ-issuer-1");
            req.authorized_keys = dir.path().join("root/.ssh/authorized_keys");
            req.allowed_signers = dir.path().join("etc/clawfleet/allowed_signers");
            req.host_key = host_key;
            Env { dir, req }
        }

        fn keys(&self) -> String {
            fs::read_to_string(&self.req.authorized_keys).unwrap()
        }

        fn signers(&self) -> String {
            fs::read_to_string(&self.req.allowed_signers).unwrap()
        }

        fn put_keys(&self, text: &str) {
            fs::create_dir_all(self.req.authorized_keys.parent().unwrap()).unwrap();
            fs::write(&self.req.authorized_keys, text).unwrap();
        }

        fn put_signers(&self, text: &str) {
            fs::create_dir_all(self.req.allowed_signers.parent().unwrap()).unwrap();
            fs::write(&self.req.allowed_signers, text).unwrap();
        }

        fn snapshot(&self) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
            (
                fs::read(&self.req.authorized_keys).ok(),
                fs::read(&self.req.allowed_signers).ok(),
            )
        }

        fn leftovers(&self) -> Vec<String> {
            let mut found = Vec::new();
            for d in [
                self.req.authorized_keys.parent().unwrap(),
                self.req.allowed_signers.parent().unwrap(),
            ] {
                if let Ok(rd) = fs::read_dir(d) {
                    for e in rd {
                        let n = e.unwrap().file_name().to_string_lossy().into_owned();
                        if n.contains(atomic_file::PENDING_INFIX) || n.ends_with(".tmp") {
                            found.push(n);
                        }
                    }
                }
            }
            found
        }
    }

    fn mode(p: &Path) -> u32 {
        fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn fresh_enrol_creates_both_files_and_returns_the_fingerprint() {
        let env = Env::new();
        let out = enrol(&env.req).unwrap();
        let expected = Fingerprint::of(&PublicKey::from_openssh(KEY_C).unwrap());
        assert_eq!(out.host_key_fingerprint, expected);
        assert!(out.host_key_fingerprint.as_str().starts_with("SHA256:"));
        assert_eq!(out.authorized_keys, FileChange::Created);
        assert_eq!(out.allowed_signers, FileChange::Created);
        assert!(out.changed());
        assert_eq!(
            env.keys(),
            format!(
                "restrict,command=\"/usr/sbin/hostd serve --key={ID_A}\" {BARE_A} key-a@test\n"
            )
        );
        assert_eq!(
            crate::session::LoginKeyId::of(&PublicKey::from_openssh(KEY_A).unwrap()).as_str(),
            ID_A
        );
        assert_eq!(
            env.signers(),
            format!("occ-issuer-1 namespaces=\"clawfleet-operation\" {BARE_B}\n")
        );
        assert_eq!(mode(&env.req.authorized_keys), 0o600);
        assert_eq!(mode(env.req.authorized_keys.parent().unwrap()), 0o700);
        assert_eq!(mode(&env.req.allowed_signers), 0o644);
        assert!(env.leftovers().is_empty());

        // The file hostd reads trusts exactly this key, as this principal, in our namespace.
        let signers = AllowedSigners::parse(&env.signers()).unwrap();
        let key_b = PublicKey::from_openssh(KEY_B).unwrap();
        assert!(
            signers
                .check(&key_b, "occ-issuer-1", SIGNATURE_NAMESPACE, 1)
                .is_ok()
        );
        assert!(signers.check(&key_b, "occ-issuer-1", "other", 1).is_err());
    }

    #[test]
    fn second_run_changes_nothing() {
        let env = Env::new();
        env.put_keys("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPmQ1+8QPtNQ2yOglYcbzhbLC2X/2jhTXO08DvU+OVaB operator\n");
        fs::set_permissions(&env.req.authorized_keys, fs::Permissions::from_mode(0o640)).unwrap();
        let first = enrol(&env.req).unwrap();
        assert_eq!(first.authorized_keys, FileChange::Added);
        let before = env.snapshot();
        let inode = fs::metadata(&env.req.authorized_keys).unwrap().ino();
        let second = enrol(&env.req).unwrap();
        assert_eq!(second.authorized_keys, FileChange::Unchanged);
        assert_eq!(second.allowed_signers, FileChange::Unchanged);
        assert!(!second.changed());
        assert_eq!(second.host_key_fingerprint, first.host_key_fingerprint);
        assert_eq!(env.snapshot(), before);
        assert_eq!(fs::metadata(&env.req.authorized_keys).unwrap().ino(), inode);
        // The existing file's mode was kept.
        assert_eq!(mode(&env.req.authorized_keys), 0o640);

        // The same keys with other comments (or none) are the same keys.
        let mut again = env.req.clone();
        again.ssh_key = BARE_A.into();
        again.signing_key = format!("{BARE_B} another-comment");
        assert!(!enrol(&again).unwrap().changed());
        assert_eq!(env.snapshot(), before);
    }

    #[test]
    fn other_lines_are_kept_byte_for_byte() {
        let env = Env::new();
        let keys = "# operator keys\r\n\
                    ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPmQ1+8QPtNQ2yOglYcbzhbLC2X/2jhTXO08DvU+OVaB ops@x\n\
                    \n\
                    from=\"10.0.0.0/8\",command=\"echo a b\" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB6TeR9MjGokmZivHwznNGVqnbzd9EAdEPOidCNyuf8V  two  spaces\n\
                    garbage that is not a key \u{fffd}\n\
                    ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQCxEXbaJVqjJBoL7mOZGg+T no-newline-at-end";
        env.put_keys(keys);
        let out = enrol(&env.req).unwrap();
        assert_eq!(out.authorized_keys, FileChange::Added);
        assert_eq!(
            env.keys(),
            format!(
                "{keys}\nrestrict,command=\"/usr/sbin/hostd serve --key={ID_A}\" {BARE_A} key-a@test\n"
            )
        );
    }

    /// Issue 26, N12: a line an earlier enrol wrote (forced command without `--key`) is
    /// replaced in place by one that names the key; every other byte is kept.
    #[test]
    fn an_earlier_enrols_line_gets_the_key_id() {
        let env = Env::new();
        let keys = format!(
            "# keep\nrestrict,command=\"/usr/sbin/hostd serve\" {BARE_A} old@x\nssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPmQ1+8QPtNQ2yOglYcbzhbLC2X/2jhTXO08DvU+OVaB ops@x"
        );
        env.put_keys(&keys);
        let out = enrol(&env.req).unwrap();
        assert_eq!(out.authorized_keys, FileChange::Updated);
        assert_eq!(
            env.keys(),
            format!(
                "# keep\nrestrict,command=\"/usr/sbin/hostd serve --key={ID_A}\" {BARE_A} key-a@test\nssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPmQ1+8QPtNQ2yOglYcbzhbLC2X/2jhTXO08DvU+OVaB ops@x"
            )
        );
        assert!(!enrol(&env.req).unwrap().changed());
    }

    /// A line written as `--key <id>` (which `hostd serve` refused when the id began with
    /// `-`: "unexpected argument '-V'") is replaced in place by `--key=<id>`.
    #[test]
    fn a_key_id_written_with_a_space_is_rewritten_with_an_equals_sign() {
        let env = Env::new();
        env.put_keys(&format!(
            "# keep\nrestrict,command=\"/usr/sbin/hostd serve --key {ID_A}\" {BARE_A} key-a@test\n"
        ));
        let out = enrol(&env.req).unwrap();
        assert_eq!(out.authorized_keys, FileChange::Updated);
        assert_eq!(
            env.keys(),
            format!(
                "# keep\nrestrict,command=\"/usr/sbin/hostd serve --key={ID_A}\" {BARE_A} key-a@test\n"
            )
        );
        assert!(!enrol(&env.req).unwrap().changed());
    }

    #[test]
    fn same_ssh_key_with_other_options_is_refused_without_changes() {
        for line in [
            format!("{BARE_A} plain"),
            format!("restrict {BARE_A}"),
            format!("restrict,command=\"/usr/sbin/hostd serve --debug\" {BARE_A}"),
            format!("command=\"/usr/sbin/hostd serve\",restrict {BARE_A}"),
        ] {
            let env = Env::new();
            env.put_keys(&format!("# keep\n{line}\n"));
            let before = env.snapshot();
            let err = enrol(&env.req).unwrap_err();
            assert!(
                matches!(err, EnrolError::SshKeyOptionsConflict { line: 2, .. }),
                "{line}: {err}"
            );
            assert!(err.to_string().contains("line 2"), "{err}");
            assert_eq!(env.snapshot(), before, "{line}");
            assert!(
                !env.req.allowed_signers.exists(),
                "nothing written before the refusal"
            );
        }
    }

    #[test]
    fn signing_key_under_another_principal_is_refused() {
        let env = Env::new();
        let existing = format!("someone-else namespaces=\"clawfleet-operation\" {BARE_B}\n");
        env.put_signers(&existing);
        let before = env.snapshot();
        let err = enrol(&env.req).unwrap_err();
        assert!(
            matches!(&err, EnrolError::SignerPrincipalConflict { line: 1, principals, .. } if principals == "someone-else"),
            "{err}"
        );
        assert!(err.to_string().contains("someone-else"), "{err}");
        assert_eq!(env.snapshot(), before);
        assert!(!env.req.authorized_keys.exists());
    }

    #[test]
    fn signing_key_with_other_options_is_refused() {
        for line in [
            format!("occ-issuer-1 {BARE_B}"),
            format!("occ-issuer-1 namespaces=\"file\" {BARE_B}"),
            format!("occ-issuer-1,other namespaces=\"clawfleet-operation\" {BARE_B}"),
            format!(
                "occ-issuer-1 namespaces=\"clawfleet-operation\",valid-before=\"20990101Z\" {BARE_B}"
            ),
        ] {
            let env = Env::new();
            env.put_signers(&format!("{line}\n"));
            let before = env.snapshot();
            let err = enrol(&env.req).unwrap_err();
            assert!(
                matches!(err, EnrolError::SignerOptionsConflict { line: 1, .. }),
                "{line}: {err}"
            );
            assert_eq!(env.snapshot(), before);
        }
    }

    #[test]
    fn foreign_valid_signer_entries_are_kept() {
        let env = Env::new();
        let existing = format!(
            "# other coordinator\nocc-old namespaces=\"clawfleet-operation\" {BARE_A} old\n"
        );
        env.put_signers(&existing);
        fs::set_permissions(&env.req.allowed_signers, fs::Permissions::from_mode(0o640)).unwrap();
        let out = enrol(&env.req).unwrap();
        assert_eq!(out.allowed_signers, FileChange::Added);
        assert_eq!(
            env.signers(),
            format!("{existing}occ-issuer-1 namespaces=\"clawfleet-operation\" {BARE_B}\n")
        );
        assert_eq!(mode(&env.req.allowed_signers), 0o640);
        assert_eq!(
            AllowedSigners::parse(&env.signers())
                .unwrap()
                .entries()
                .len(),
            2
        );
    }

    #[test]
    fn an_invalid_existing_allowed_signers_is_refused() {
        let env = Env::new();
        env.put_signers("cert-authority * ssh-ed25519 AAAA\n");
        let before = env.snapshot();
        let err = enrol(&env.req).unwrap_err();
        assert!(
            matches!(err, EnrolError::ExistingSignersInvalid { .. }),
            "{err}"
        );
        assert_eq!(env.snapshot(), before);
    }

    #[test]
    fn invalid_keys_are_refused() {
        for (ssh, signing) in [
            ("ssh-ed25519 AAAAnotbase64!!", KEY_B),
            (KEY_A, "ssh-ed25519"),
            (
                KEY_A,
                "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB6TeR9MjGokmZivHwzn",
            ),
            (&format!("{KEY_A}\n{KEY_C}"), KEY_B),
            (&format!("restrict {KEY_A}"), KEY_B),
            ("", KEY_B),
        ] {
            let env = Env::new();
            let mut req = env.req.clone();
            req.ssh_key = ssh.into();
            req.signing_key = signing.into();
            let err = enrol(&req).unwrap_err();
            assert!(
                matches!(
                    err,
                    EnrolError::InvalidKey { .. } | EnrolError::UnsupportedKeyType { .. }
                ),
                "{ssh:?} {signing:?}: {err}"
            );
            assert_eq!(env.snapshot(), (None, None));
        }
    }

    #[test]
    fn non_ed25519_keys_are_refused() {
        let env = Env::new();
        let mut req = env.req.clone();
        req.signing_key = KEY_EC.into();
        let err = enrol(&req).unwrap_err();
        assert!(
            matches!(&err, EnrolError::UnsupportedKeyType { which: "signing", found } if found == "ecdsa-sha2-nistp256"),
            "{err}"
        );
        assert!(err.to_string().contains("only ssh-ed25519"), "{err}");
        let mut req = env.req.clone();
        req.ssh_key = KEY_EC.into();
        assert!(matches!(
            enrol(&req).unwrap_err(),
            EnrolError::UnsupportedKeyType { which: "SSH", .. }
        ));
        assert_eq!(env.snapshot(), (None, None));
    }

    #[test]
    fn invalid_principal_forced_command_and_host_key_are_refused() {
        let env = Env::new();
        for p in ["", "a b", "*", "x\ny"] {
            let mut req = env.req.clone();
            req.principal = p.into();
            assert!(
                matches!(
                    enrol(&req).unwrap_err(),
                    EnrolError::InvalidPrincipal { .. }
                ),
                "{p:?}"
            );
        }
        for c in ["hostd serve", "/usr/sbin/hostd \"serve\"", "/x\\y", "/x\ny"] {
            let mut req = env.req.clone();
            req.forced_command = c.into();
            assert!(
                matches!(enrol(&req).unwrap_err(), EnrolError::InvalidForcedCommand),
                "{c:?}"
            );
        }
        let mut req = env.req.clone();
        req.host_key = env.dir.path().join("missing.pub");
        let err = enrol(&req).unwrap_err();
        assert!(matches!(err, EnrolError::HostKey { .. }), "{err}");
        fs::write(env.dir.path().join("bad.pub"), "not a key").unwrap();
        req.host_key = env.dir.path().join("bad.pub");
        assert!(matches!(
            enrol(&req).unwrap_err(),
            EnrolError::HostKey { .. }
        ));
        assert_eq!(env.snapshot(), (None, None));
    }

    #[test]
    fn custom_forced_command_is_used_and_matched() {
        let env = Env::new();
        let mut req = env.req.clone();
        req.forced_command = "/opt/hostd/bin/hostd serve --config /etc/x.toml".into();
        enrol(&req).unwrap();
        assert!(env.keys().starts_with(&format!(
            "restrict,command=\"/opt/hostd/bin/hostd serve --config /etc/x.toml --key={ID_A}\" ssh-ed25519 "
        )));
        assert!(!enrol(&req).unwrap().changed());
        // The default command now conflicts with the line written above.
        assert!(matches!(
            enrol(&env.req).unwrap_err(),
            EnrolError::SshKeyOptionsConflict { .. }
        ));
    }

    #[test]
    fn a_symlinked_host_key_is_read() {
        let env = Env::new();
        let link = env.dir.path().join("link.pub");
        std::os::unix::fs::symlink(&env.req.host_key, &link).unwrap();
        let mut req = env.req.clone();
        req.host_key = link;
        assert_eq!(
            enrol(&req).unwrap().host_key_fingerprint,
            Fingerprint::of(&PublicKey::from_openssh(KEY_C).unwrap())
        );
    }

    #[test]
    fn symlinked_files_are_not_replaced() {
        let env = Env::new();
        let target = env.dir.path().join("elsewhere");
        fs::write(&target, "").unwrap();
        fs::create_dir_all(env.req.authorized_keys.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&target, &env.req.authorized_keys).unwrap();
        assert!(matches!(
            enrol(&env.req).unwrap_err(),
            EnrolError::NotRegularFile { .. }
        ));
        assert!(
            fs::symlink_metadata(&env.req.authorized_keys)
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }

    #[test]
    fn quoted_fields_are_split_like_sshd() {
        assert_eq!(
            key_line_fields("from=\"a b\",command=\"x \\\" y\" ssh-ed25519 AAAA c d"),
            ["from=\"a b\",command=\"x \\\" y\"", "ssh-ed25519", "AAAA"]
        );
        assert_eq!(key_line_fields("ssh-ed25519 AAAA"), ["ssh-ed25519", "AAAA"]);
        assert_eq!(
            key_line_fields("  ssh-ed25519\tAAAA  c"),
            ["ssh-ed25519", "AAAA", "c"]
        );
    }
}
