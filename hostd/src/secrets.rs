//! An Agent's secrets on the host.
//!
//! - **In transit** they are sealed to the host's ssh-ed25519 key
//!   (`clawfleet_protocol::secrets`); hostd opens them with the private host key, which it
//!   reads as root from the path of `host_key` without `.pub`.
//! - **At rest** each value is a `systemd-creds encrypt` credential (the host's credential
//!   key, and the TPM2 where the host has one: `--with-key=auto`), `secrets/<name>.cred` in the
//!   Agent directory (root-owned 0700 directory, 0600 files), beside `secrets/manifest.json`,
//!   which names each secret's version and fingerprint and never a value. The plaintext
//!   travels to and from `systemd-creds` over pipes, never in an argument or a file.
//! - **In clear** only on tmpfs: the unit's `RuntimeDirectory=` (`/run/clawfleet-agent-<32
//!   hex>`, created by systemd owned by the Agent's account, removed by systemd whenever the
//!   unit stops and kept across its restarts), bound read-only at
//!   [`DIRECTORY`](clawfleet_protocol::secret::DIRECTORY) inside the unit; one file per secret, owned by the Agent's
//!   account, mode 0400, written under a temporary name and renamed. The unit's
//!   `ExecStartPre=+hostd secret-files …` writes them at every start (from the credentials,
//!   or from the files a restart kept, when their fingerprints still match: [`materialise`]);
//!   `put-secrets` writes them into a running unit's directory directly, so a rotation needs
//!   no restart.
//!
//! Values are never in the unit's environment, its unit file, hostd's journal of operations
//! (which keeps the sealed envelope) or its log lines (names, versions and fingerprints only).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use clawfleet_protocol::atomic_file::PendingFile;
use clawfleet_protocol::sealed::{
    MAX_SECRETS_PER_AGENT, SecretFingerprint, SecretName, SecretVersion, VALUE_MAX,
};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use zeroize::Zeroizing;

use crate::fsutil::{self, FsError, Kind};
use crate::system::Ids;

/// The at-rest directory's name inside the Agent directory.
pub const SECRETS_DIR: &str = "secrets";
/// The manifest's file name in it.
pub const MANIFEST_FILE: &str = "manifest.json";
/// Where systemd keeps runtime directories.
pub const RUN_DIR: &str = "/run";
/// The tool that seals values at rest.
pub const SYSTEMD_CREDS: &str = "systemd-creds";
/// Longest manifest read.
const MANIFEST_MAX: u64 = 64 * 1024;
/// Longest credential file read (a 64 KiB value grows by its header and the base64 of
/// `systemd-creds`'s output).
const CRED_MAX: u64 = 256 * 1024;
/// How long one `systemd-creds` call may take.
const CREDS_TIMEOUT: Duration = Duration::from_secs(20);

/// Why secrets could not be kept or written. Messages name files and secrets, never values
/// or tool output.
#[derive(Debug, Error)]
pub enum SecretsError {
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error("{path}: {message}")]
    Manifest { path: String, message: String },
    #[error("systemd-creds {action} of secret {name} failed: {detail}")]
    Creds {
        action: &'static str,
        name: String,
        detail: String,
    },
    #[error("systemd-creds is not installed on this host (it seals Agents' secrets at rest)")]
    CredsMissing,
    #[error(
        "secret {name}: the value kept at rest does not have the fingerprint the manifest records"
    )]
    Fingerprint { name: String },
    #[error("cannot write {path}: {detail}")]
    Write { path: String, detail: String },
    #[error("account {account}: {detail}")]
    Account { account: String, detail: String },
}

/// A secret's version and its value in clear.
pub type Opened = (SecretVersion, Zeroizing<Vec<u8>>);
/// Seals one value at rest (`systemd-creds encrypt`; a stand-in in tests).
pub type Encrypt = dyn Fn(&SecretName, &[u8]) -> Result<Vec<u8>, SecretsError>;
/// Opens one value kept at rest.
pub type Decrypt = dyn Fn(&SecretName, &[u8]) -> Result<Zeroizing<Vec<u8>>, SecretsError>;

/// `secrets/manifest.json`: what the Agent's secrets are, never their values.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Manifest {
    pub secrets: Vec<SecretVersion>,
}

/// The at-rest directory of an Agent.
pub fn secrets_dir(agent_dir: &Path) -> PathBuf {
    agent_dir.join(SECRETS_DIR)
}

/// The runtime directory systemd makes for a unit (`RuntimeDirectory=` is the unit's name
/// without `.service`).
pub fn runtime_dir(run_dir: &Path, unit_name: &str) -> PathBuf {
    run_dir.join(unit_name.trim_end_matches(".service"))
}

/// The lines the Agent unit carries for its secrets (`unit::render`).
pub fn unit_lines(unit_name: &str, agent_dir: &Path, account: &str) -> Vec<String> {
    let stem = unit_name.trim_end_matches(".service");
    vec![
        format!("RuntimeDirectory={stem}"),
        "RuntimeDirectoryMode=0700".to_owned(),
        // Kept across restarts (cutovers, crash restarts), removed at every stop: a restart
        // writes only what changed (`materialise`).
        "RuntimeDirectoryPreserve=restart".to_owned(),
        format!(
            "BindReadOnlyPaths={RUN_DIR}/{stem}:{}",
            clawfleet_protocol::secret::DIRECTORY
        ),
        format!(
            "ExecStartPre=+{} secret-files --agent-dir {} --runtime-dir {RUN_DIR}/{stem} --account {account}",
            crate::unit::LAUNCHER,
            agent_dir.display()
        ),
    ]
}

/// The manifest, or an empty one when the Agent has no secrets (never had, or an Agent
/// from before secrets).
pub fn read_manifest(agent_dir: &Path) -> Result<Manifest, SecretsError> {
    let path = secrets_dir(agent_dir).join(MANIFEST_FILE);
    if fsutil::kind(&path)? == Kind::Missing {
        return Ok(Manifest::default());
    }
    let bytes = fsutil::read_small(&path, MANIFEST_MAX)?;
    let manifest: Manifest =
        serde_json::from_slice(&bytes).map_err(|e| SecretsError::Manifest {
            path: path.display().to_string(),
            message: format!("not a secrets manifest: {e}"),
        })?;
    if manifest.secrets.len() > MAX_SECRETS_PER_AGENT {
        return Err(SecretsError::Manifest {
            path: path.display().to_string(),
            message: format!("more than {MAX_SECRETS_PER_AGENT} secrets"),
        });
    }
    Ok(manifest)
}

fn cred_path(agent_dir: &Path, name: &SecretName) -> PathBuf {
    secrets_dir(agent_dir).join(format!("{name}.cred"))
}

/// The set a changing `store` replaced, kept so a rotation the gateway refuses can put it
/// back (`secrets/previous/`: its manifest and credentials, root-only like the set itself).
pub const PREVIOUS_DIR: &str = "previous";

fn previous_dir(agent_dir: &Path) -> PathBuf {
    secrets_dir(agent_dir).join(PREVIOUS_DIR)
}

/// Copies the set at rest now (its credentials, then its manifest last: a copy without a
/// manifest is no copy) into `secrets/previous/`, replacing what was there.
fn keep_previous(agent_dir: &Path, had: &Manifest) -> Result<(), SecretsError> {
    let dir = secrets_dir(agent_dir);
    let previous = previous_dir(agent_dir);
    fsutil::ensure_dir(&previous, 0o700)?;
    fsutil::set_mode(&previous, 0o700)?;
    fsutil::remove_file_if_present(&previous.join(MANIFEST_FILE))?;
    for name in fsutil::list_dir(&previous)? {
        fsutil::remove_file_if_present(&previous.join(&name))?;
    }
    for v in &had.secrets {
        let file = format!("{}.cred", v.name);
        let blob = fsutil::read_small(&dir.join(&file), CRED_MAX)?;
        fsutil::write_atomic(&previous.join(&file), &blob, 0o600, |_| Ok(()))?;
    }
    let manifest = fsutil::read_small(&dir.join(MANIFEST_FILE), MANIFEST_MAX)?;
    fsutil::write_atomic(&previous.join(MANIFEST_FILE), &manifest, 0o600, |_| Ok(()))?;
    Ok(())
}

/// Puts the set a changing `store` replaced back in place (credentials, then the manifest,
/// then credentials not in it removed): after a rotation the running gateway refused, so a
/// later start reads the values it serves rather than the refused ones. `None` when no
/// replaced set is kept.
pub fn restore_previous(agent_dir: &Path) -> Result<Option<Manifest>, SecretsError> {
    let dir = secrets_dir(agent_dir);
    let previous = previous_dir(agent_dir);
    let manifest_path = previous.join(MANIFEST_FILE);
    if fsutil::kind(&manifest_path)? == Kind::Missing {
        return Ok(None);
    }
    let bytes = fsutil::read_small(&manifest_path, MANIFEST_MAX)?;
    let manifest: Manifest =
        serde_json::from_slice(&bytes).map_err(|e| SecretsError::Manifest {
            path: manifest_path.display().to_string(),
            message: format!("not a secrets manifest: {e}"),
        })?;
    for v in &manifest.secrets {
        let file = format!("{}.cred", v.name);
        let blob = fsutil::read_small(&previous.join(&file), CRED_MAX)?;
        fsutil::write_atomic(&dir.join(&file), &blob, 0o600, |_| Ok(()))?;
    }
    fsutil::write_atomic(&dir.join(MANIFEST_FILE), &bytes, 0o600, |_| Ok(()))?;
    remove_unlisted(&dir, &manifest)?;
    Ok(Some(manifest))
}

/// Removes the credentials in `dir` of secrets `manifest` does not name.
fn remove_unlisted(dir: &Path, manifest: &Manifest) -> Result<(), SecretsError> {
    for name in fsutil::list_dir(dir)? {
        let Some(stem) = name.strip_suffix(".cred") else {
            continue;
        };
        if !manifest.secrets.iter().any(|v| v.name.as_str() == stem) {
            fsutil::remove_file_if_present(&dir.join(&name))?;
        }
    }
    Ok(())
}

/// Keeps `values` as the Agent's whole set at rest: each sealed with `encrypt`, then the
/// manifest, then credentials of secrets no longer in the set are removed. A different set
/// already there is first kept as the previous one ([`restore_previous`]); if it cannot be
/// (a credential of it missing or unreadable), the new set is stored all the same, no
/// previous set is kept, and the answer says why.
pub fn store(
    agent_dir: &Path,
    values: &[(SecretVersion, Zeroizing<Vec<u8>>)],
    encrypt: &Encrypt,
) -> Result<Option<String>, SecretsError> {
    let dir = secrets_dir(agent_dir);
    fsutil::ensure_dir(&dir, 0o700)?;
    fsutil::set_mode(&dir, 0o700)?;
    let had = read_manifest(agent_dir)?;
    let mut wanted: Vec<SecretVersion> = values.iter().map(|(v, _)| v.clone()).collect();
    wanted.sort();
    let mut not_kept = None;
    if !had.secrets.is_empty()
        && had.secrets != wanted
        && let Err(e) = keep_previous(agent_dir, &had)
    {
        fsutil::remove_file_if_present(&previous_dir(agent_dir).join(MANIFEST_FILE))?;
        not_kept = Some(e.to_string());
    }
    for (v, value) in values {
        let sealed = encrypt(&v.name, value)?;
        fsutil::write_atomic(&cred_path(agent_dir, &v.name), &sealed, 0o600, |_| Ok(()))?;
    }
    let mut manifest = Manifest {
        secrets: values.iter().map(|(v, _)| v.clone()).collect(),
    };
    manifest.secrets.sort();
    let bytes = serde_json::to_vec_pretty(&manifest).map_err(|e| SecretsError::Manifest {
        path: dir.join(MANIFEST_FILE).display().to_string(),
        message: e.to_string(),
    })?;
    fsutil::write_atomic(&dir.join(MANIFEST_FILE), &bytes, 0o600, |_| Ok(()))?;
    remove_unlisted(&dir, &manifest)?;
    Ok(not_kept)
}

/// Writes the clear files into a runtime directory (each owned by `ids`, 0400, written under
/// a temporary name and renamed) and removes every other file there.
pub fn write_files(
    runtime_dir: &Path,
    ids: Ids,
    values: &[(SecretVersion, Zeroizing<Vec<u8>>)],
) -> Result<(), SecretsError> {
    fsutil::expect_kind(runtime_dir, Kind::Dir)?;
    let write_err = |path: &Path, e: &dyn std::fmt::Display| SecretsError::Write {
        path: path.display().to_string(),
        detail: e.to_string(),
    };
    for (v, value) in values {
        let target = runtime_dir.join(v.name.as_str());
        let mut pending =
            PendingFile::create(&target, 0o400).map_err(|e| write_err(&target, &e))?;
        pending
            .write_all(value)
            .and_then(|()| pending.set_owner(ids.uid, ids.gid))
            .map_err(|e| write_err(&target, &e))?;
        pending
            .rename_into_place()
            .map_err(|e| write_err(&target, &e))?;
    }
    for name in fsutil::list_dir(runtime_dir)? {
        if !values.iter().any(|(v, _)| v.name.as_str() == name) {
            let path = runtime_dir.join(&name);
            std::fs::remove_file(&path).map_err(|e| write_err(&path, &e))?;
        }
    }
    Ok(())
}

/// Reads every secret of the manifest back from its credential, checking its fingerprint.
/// A credential replaced while it was read (a `put-secrets` racing a restart) is read again.
pub fn load(agent_dir: &Path, decrypt: &Decrypt) -> Result<Vec<Opened>, SecretsError> {
    load_keeping(agent_dir, decrypt, &|_| None).map(|(values, _)| values)
}

/// What a restarted unit's runtime directory still holds of one secret, if anything.
pub type Kept<'a> = dyn Fn(&SecretVersion) -> Option<Zeroizing<Vec<u8>>> + 'a;

/// [`load`], taking each value from `kept` instead of its credential when `kept` has one
/// with the manifest's fingerprint; also returns how many were taken from `kept`.
pub fn load_keeping(
    agent_dir: &Path,
    decrypt: &Decrypt,
    kept: &Kept<'_>,
) -> Result<(Vec<Opened>, usize), SecretsError> {
    let mut last = None;
    for _ in 0..5 {
        match load_once(agent_dir, decrypt, kept) {
            Err(SecretsError::Fingerprint { name }) => {
                last = Some(name);
                std::thread::sleep(Duration::from_millis(100));
            }
            other => return other,
        }
    }
    Err(SecretsError::Fingerprint {
        name: last.unwrap_or_default(),
    })
}

fn load_once(
    agent_dir: &Path,
    decrypt: &Decrypt,
    kept: &Kept<'_>,
) -> Result<(Vec<Opened>, usize), SecretsError> {
    let manifest = read_manifest(agent_dir)?;
    let mut out = Vec::with_capacity(manifest.secrets.len());
    let mut reused = 0;
    for v in manifest.secrets {
        if let Some(value) = kept(&v).filter(|k| SecretFingerprint::of(k) == v.fingerprint) {
            reused += 1;
            out.push((v, value));
            continue;
        }
        let blob = fsutil::read_small(&cred_path(agent_dir, &v.name), CRED_MAX)?;
        let value = decrypt(&v.name, &blob)?;
        if SecretFingerprint::of(&value) != v.fingerprint {
            return Err(SecretsError::Fingerprint {
                name: v.name.to_string(),
            });
        }
        out.push((v, value));
    }
    Ok((out, reused))
}

fn find_creds() -> Option<PathBuf> {
    ["/usr/bin", "/bin", "/usr/sbin", "/sbin"]
        .iter()
        .map(|d| Path::new(d).join(SYSTEMD_CREDS))
        .find(|p| p.is_file())
}

/// Runs `systemd-creds ACTION --name=NAME - -` with `input` on its stdin; its stdout.
fn run_creds(
    action: &'static str,
    name: &SecretName,
    input: &[u8],
) -> Result<Zeroizing<Vec<u8>>, SecretsError> {
    let tool = find_creds().ok_or(SecretsError::CredsMissing)?;
    let fail = |detail: String| SecretsError::Creds {
        action,
        name: name.to_string(),
        detail,
    };
    let mut cmd = Command::new(tool);
    cmd.arg(action).arg(format!("--name={name}"));
    if action == "encrypt" {
        // The host's credential key, with the TPM2 where there is one.
        cmd.arg("--with-key=auto");
    }
    let mut child = cmd
        .arg("-")
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        // Its messages could quote input; hostd reports only the exit status.
        .stderr(Stdio::null())
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .spawn()
        .map_err(|e| fail(format!("cannot start it: {e}")))?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| fail("no stdin pipe".to_owned()))?;
    let mut stdout = child
        .stdout
        .take()
        .ok_or_else(|| fail("no stdout pipe".to_owned()))?;
    // Read on a thread while writing, so neither pipe can fill up and block the other.
    let reader = std::thread::spawn(move || {
        let mut out = Zeroizing::new(Vec::new());
        let limit = (CRED_MAX as usize).max(VALUE_MAX) as u64 + 1;
        let r = (&mut stdout).take(limit).read_to_end(&mut out);
        r.map(|_| out)
    });
    let written = stdin.write_all(input);
    drop(stdin);
    let started = std::time::Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() > CREDS_TIMEOUT => {
                if let Err(e) = child.kill() {
                    tracing::warn!("cannot kill systemd-creds: {e}");
                }
                if let Err(e) = child.wait() {
                    tracing::warn!("cannot reap systemd-creds: {e}");
                }
                return Err(fail(format!(
                    "it did not finish within {} s",
                    CREDS_TIMEOUT.as_secs()
                )));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(fail(format!("cannot wait for it: {e}"))),
        }
    };
    let out = reader
        .join()
        .map_err(|_| fail("its output reader panicked".to_owned()))?
        .map_err(|e| fail(format!("cannot read its output: {e}")))?;
    written.map_err(|e| fail(format!("cannot write its input: {e}")))?;
    if !status.success() {
        return Err(fail(format!("it exited with {status}")));
    }
    if out.len() as u64 > CRED_MAX.max(VALUE_MAX as u64) {
        return Err(fail("its output is larger than expected".to_owned()));
    }
    Ok(out)
}

/// Seals one value at rest with `systemd-creds encrypt`.
pub fn creds_encrypt(name: &SecretName, value: &[u8]) -> Result<Vec<u8>, SecretsError> {
    run_creds("encrypt", name, value).map(|out| out.to_vec())
}

/// Opens one credential with `systemd-creds decrypt` (which checks the embedded name).
pub fn creds_decrypt(name: &SecretName, blob: &[u8]) -> Result<Zeroizing<Vec<u8>>, SecretsError> {
    run_creds("decrypt", name, blob)
}

/// A secret's file in a runtime directory the Agent's account owns (and so may have changed):
/// read only if it is a regular file no larger than a value (never through a link, never
/// blocking on a FIFO planted there); anything else is not kept.
pub fn read_kept(runtime_dir: &Path, name: &SecretName) -> Option<Zeroizing<Vec<u8>>> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(runtime_dir.join(name.as_str()))
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.len() > VALUE_MAX as u64 {
        return None;
    }
    let mut value = Zeroizing::new(Vec::with_capacity(meta.len() as usize));
    file.take(VALUE_MAX as u64 + 1)
        .read_to_end(&mut value)
        .ok()?;
    (value.len() <= VALUE_MAX).then_some(value)
}

/// `hostd secret-files`: the unit's `ExecStartPre=+`. Writes the Agent's secrets into the
/// unit's runtime directory, owned by its account: each from its credential, or, across a
/// restart (the directory is kept, `RuntimeDirectoryPreserve=restart`), from the file already
/// there when it still has the manifest's fingerprint, which spares a `systemd-creds` run per
/// secret at every cutover. Returns (written, of which kept).
pub fn materialise(
    agent_dir: &Path,
    runtime_dir: &Path,
    account: &str,
) -> Result<(usize, usize), SecretsError> {
    let user = nix::unistd::User::from_name(account)
        .map_err(|e| SecretsError::Account {
            account: account.to_owned(),
            detail: e.to_string(),
        })?
        .ok_or_else(|| SecretsError::Account {
            account: account.to_owned(),
            detail: "no such user".to_owned(),
        })?;
    materialise_for(
        agent_dir,
        runtime_dir,
        Ids {
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
        },
    )
}

/// [`materialise`] for an account whose ids are known (hostd's relaunch in place writes what
/// the unit's `ExecStartPre=` would, engine/revision.rs).
pub fn materialise_for(
    agent_dir: &Path,
    runtime_dir: &Path,
    ids: Ids,
) -> Result<(usize, usize), SecretsError> {
    let (values, kept) = load_keeping(agent_dir, &creds_decrypt, &|v| {
        read_kept(runtime_dir, &v.name)
    })?;
    write_files(runtime_dir, ids, &values)?;
    Ok((values.len(), kept))
}

/// The private host key's path: the public key's path without `.pub`.
pub fn private_host_key_path(public: &Path) -> Option<PathBuf> {
    let text = public.to_str()?;
    text.strip_suffix(".pub").map(PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(name: &str, version: u64, value: &[u8]) -> (SecretVersion, Zeroizing<Vec<u8>>) {
        (
            SecretVersion {
                name: SecretName::new(name).unwrap(),
                version,
                fingerprint: SecretFingerprint::of(value),
            },
            Zeroizing::new(value.to_vec()),
        )
    }

    fn enc(_: &SecretName, v: &[u8]) -> Result<Vec<u8>, SecretsError> {
        Ok(v.iter().map(|b| b ^ 0x5a).collect())
    }

    fn dec(_: &SecretName, v: &[u8]) -> Result<Zeroizing<Vec<u8>>, SecretsError> {
        Ok(Zeroizing::new(v.iter().map(|b| b ^ 0x5a).collect()))
    }

    /// A restart keeps the runtime directory: values still there with the manifest's
    /// fingerprint are taken as they are, and only the others are decrypted; a link, a FIFO
    /// or a changed value the Agent left there is not taken.
    #[test]
    fn a_restart_decrypts_only_what_the_runtime_directory_lacks() {
        let dir = tempfile::tempdir().unwrap();
        let run = tempfile::tempdir().unwrap();
        store(
            dir.path(),
            &[
                v("a", 1, b"one"),
                v("b", 1, b"two"),
                v("c", 1, b"three"),
                v("d", 1, b"four"),
            ],
            &enc,
        )
        .unwrap();
        let decrypted = std::rc::Rc::new(std::cell::Cell::new(0));
        let calls = decrypted.clone();
        let counting = move |n: &SecretName, b: &[u8]| {
            calls.set(calls.get() + 1);
            dec(n, b)
        };
        let kept = |v: &SecretVersion| read_kept(run.path(), &v.name);
        // The first start: nothing there, every value decrypted.
        let (values, reused) = load_keeping(dir.path(), &counting, &kept).unwrap();
        assert_eq!((values.len(), reused, decrypted.get()), (4, 0, 4));
        for (v, value) in &values {
            std::fs::write(run.path().join(v.name.as_str()), value.as_slice()).unwrap();
        }
        // A restart with everything in place: nothing decrypted.
        decrypted.set(0);
        let (values, reused) = load_keeping(dir.path(), &counting, &kept).unwrap();
        assert_eq!((values.len(), reused, decrypted.get()), (4, 4, 0));
        // Changed by the Agent, a link, a FIFO: each decrypted again, the right value kept.
        std::fs::write(run.path().join("a"), b"evil").unwrap();
        std::fs::remove_file(run.path().join("b")).unwrap();
        std::os::unix::fs::symlink(run.path().join("c"), run.path().join("b")).unwrap();
        std::fs::remove_file(run.path().join("c")).unwrap();
        nix::unistd::mkfifo(&run.path().join("c"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        decrypted.set(0);
        let (values, reused) = load_keeping(dir.path(), &counting, &kept).unwrap();
        assert_eq!((values.len(), reused, decrypted.get()), (4, 1, 3));
        let got: Vec<&[u8]> = values.iter().map(|(_, v)| v.as_slice()).collect();
        assert_eq!(got, [&b"one"[..], b"two", b"three", b"four"]);
        // A new version of one: decrypted, the others kept.
        store(
            dir.path(),
            &[
                v("a", 1, b"one"),
                v("b", 1, b"two"),
                v("c", 1, b"three"),
                v("d", 2, b"FOUR"),
            ],
            &enc,
        )
        .unwrap();
        for (name, value) in [("a", &b"one"[..]), ("b", b"two"), ("c", b"three")] {
            let path = run.path().join(name);
            std::fs::remove_file(&path).unwrap();
            std::fs::write(&path, value).unwrap();
        }
        decrypted.set(0);
        let (values, reused) = load_keeping(dir.path(), &counting, &kept).unwrap();
        assert_eq!((reused, decrypted.get()), (3, 1));
        assert_eq!(values[3].1.as_slice(), b"FOUR");
    }

    #[test]
    fn the_set_is_replaced_whole_and_read_back_checked() {
        let dir = tempfile::tempdir().unwrap();
        store(dir.path(), &[v("a", 1, b"one"), v("b", 1, b"two")], &enc).unwrap();
        store(dir.path(), &[v("a", 2, b"uno")], &enc).unwrap();
        let names = fsutil::list_dir(&secrets_dir(dir.path())).unwrap();
        assert!(!names.iter().any(|n| n.starts_with("b.")), "{names:?}");
        let loaded = load(dir.path(), &dec).unwrap();
        assert_eq!(loaded.len(), 1);
        assert_eq!(loaded[0].0.version, 2);
        assert_eq!(loaded[0].1.as_slice(), b"uno");
        // Nothing at rest holds a value in clear, the replaced set included.
        let previous = secrets_dir(dir.path()).join(PREVIOUS_DIR);
        assert!(names.contains(&PREVIOUS_DIR.to_owned()), "{names:?}");
        for path in names
            .iter()
            .filter(|n| n.as_str() != PREVIOUS_DIR)
            .map(|n| secrets_dir(dir.path()).join(n))
            .chain(
                fsutil::list_dir(&previous)
                    .unwrap()
                    .into_iter()
                    .map(|n| previous.join(n)),
            )
        {
            let bytes = std::fs::read(&path).unwrap();
            for clear in [&b"uno"[..], b"one", b"two"] {
                assert!(!bytes.windows(3).any(|w| w == clear), "{path:?}");
            }
        }
        // Storing the same set again keeps the replaced one; putting it back restores the
        // whole earlier set, the credential removed since included.
        store(dir.path(), &[v("a", 2, b"uno")], &enc).unwrap();
        let restored = restore_previous(dir.path()).unwrap().unwrap();
        assert_eq!(restored.secrets.len(), 2);
        let loaded = load(dir.path(), &dec).unwrap();
        let values: Vec<&[u8]> = loaded.iter().map(|(_, v)| v.as_slice()).collect();
        assert_eq!(values, [&b"one"[..], b"two"]);
        // A credential that no longer has the recorded fingerprint is refused.
        std::fs::write(cred_path(dir.path(), &SecretName::new("a").unwrap()), b"zz").unwrap();
        assert!(matches!(
            load(dir.path(), &dec),
            Err(SecretsError::Fingerprint { .. })
        ));
    }

    #[test]
    fn nothing_to_restore_without_a_replaced_set() {
        let dir = tempfile::tempdir().unwrap();
        assert!(restore_previous(dir.path()).unwrap().is_none());
        assert_eq!(store(dir.path(), &[v("a", 1, b"one")], &enc).unwrap(), None);
        assert!(restore_previous(dir.path()).unwrap().is_none());
        // A set at rest that cannot be copied (a credential gone) does not stop the new one,
        // and leaves no previous set to put back.
        store(dir.path(), &[v("a", 2, b"two")], &enc).unwrap();
        assert!(restore_previous(dir.path()).unwrap().is_some());
        std::fs::remove_file(cred_path(dir.path(), &SecretName::new("a").unwrap())).unwrap();
        let why = store(dir.path(), &[v("a", 3, b"three")], &enc).unwrap();
        assert!(
            why.as_deref().is_some_and(|w| w.contains("a.cred")),
            "{why:?}"
        );
        assert!(restore_previous(dir.path()).unwrap().is_none());
        assert_eq!(load(dir.path(), &dec).unwrap()[0].1.as_slice(), b"three");
    }

    #[test]
    fn files_are_0400_and_strays_are_removed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("old"), b"x").unwrap();
        let me = Ids {
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
        };
        write_files(dir.path(), me, &[v("a", 1, b"one")]).unwrap();
        assert_eq!(fsutil::list_dir(dir.path()).unwrap(), vec!["a".to_owned()]);
        let meta = std::fs::metadata(dir.path().join("a")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o400);
        assert_eq!(std::fs::read(dir.path().join("a")).unwrap(), b"one");
    }

    #[test]
    fn no_manifest_is_no_secrets_and_the_unit_lines_name_the_fixed_path() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load(dir.path(), &dec).unwrap().is_empty());
        let lines = unit_lines(
            "clawfleet-agent-0123.service",
            Path::new("/var/lib/x"),
            "cfa-1",
        );
        assert!(lines.contains(&"RuntimeDirectory=clawfleet-agent-0123".to_owned()));
        assert!(lines.contains(
            &"BindReadOnlyPaths=/run/clawfleet-agent-0123:/run/clawfleet/secrets".to_owned()
        ));
        assert_eq!(
            private_host_key_path(Path::new("/etc/ssh/ssh_host_ed25519_key.pub")),
            Some(PathBuf::from("/etc/ssh/ssh_host_ed25519_key"))
        );
    }
}
