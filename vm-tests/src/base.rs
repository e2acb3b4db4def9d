//! The base rootfs every test host boots from (read-only overlay lower layer), built once with
//! debootstrap and cached under a key derived from the recipe, so a recipe change rebuilds and
//! an unchanged recipe costs nothing.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::config::HarnessConfig;
use crate::error::{Error, Result};
use crate::sys;

/// Bump when the post-processing below changes in a way the package list does not show.
const RECIPE_REVISION: u32 = 1;

/// Packages added to debootstrap's minbase: what a real hostd host needs (systemd as PID 1, the
/// system bus, sshd) and what the tests use inside hosts (ip, curl, ps).
pub const INCLUDES: &[&str] = &[
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "iproute2",
    // hostd's per-Agent egress policy (issue 28).
    "nftables",
    "curl",
    "procps",
    "passwd",
    // `hostd enrol --login-user` (hosts that forbid root login) runs hostd through sudo.
    "sudo",
];

/// Units that only cost boot time or fail in a container without a disk or network.
const MASKED_UNITS: &[&str] = &[
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "dpkg-db-backup.timer",
    "e2scrub_all.timer",
    "fstrim.timer",
    "e2scrub_reap.service",
    "systemd-pstore.service",
    "getty@tty1.service",
];

/// The harness's client key is authorised in this file rather than root's authorized_keys, so a
/// test (or `hostd enrol`) may rewrite root's file without locking the harness out.
pub(crate) const HARNESS_AUTHORIZED_KEYS: &str = "etc/ssh/clawfleet-vm-tests/authorized_keys";

/// Only the per-host ed25519 key is offered; the base has no host keys at all.
const SSHD_DROP_IN: &str = "\
# written by clawfleet-vm-tests
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
AuthorizedKeysFile .ssh/authorized_keys /etc/ssh/clawfleet-vm-tests/authorized_keys
";

/// A ready base rootfs and the client key authorised on every host.
#[derive(Debug, Clone)]
pub struct BaseRootfs {
    /// The rootfs directory (overlay lower layer; never modified after the build).
    pub rootfs: PathBuf,
    /// Recipe key (hex) the cache entry is stored under.
    pub key: String,
    /// Private key the harness logs in with (root on every host).
    pub client_key: PathBuf,
    /// How long the build took, when this call built it.
    pub built_in: Option<Duration>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Marker {
    key: String,
    suite: String,
    mirror: String,
    includes: Vec<String>,
    build_seconds: f64,
}

/// The text that identifies a recipe; its hash names the cache entry.
fn recipe_text(suite: &str) -> String {
    format!(
        "revision={RECIPE_REVISION}\nsuite={suite}\nvariant=minbase\ninclude={}\nmask={}\nsshd={SSHD_DROP_IN}",
        INCLUDES.join(","),
        MASKED_UNITS.join(",")
    )
}

/// Cache key of the base rootfs for a suite (first 16 hex of the recipe's sha256).
pub fn recipe_key(suite: &str) -> String {
    sys::sha256_hex(recipe_text(suite).as_bytes())[..16].to_owned()
}

/// Finds the Debian mirror URI for `suite` in deb822 `.sources` text.
pub fn mirror_from_deb822(text: &str, suite: &str) -> Option<String> {
    let mut first_deb = None;
    for stanza in text.split("\n\n") {
        let mut types = "";
        let mut uris = "";
        let mut suites = "";
        let mut enabled = true;
        for line in stanza.lines() {
            if line.starts_with('#') {
                continue;
            }
            if let Some((k, v)) = line.split_once(':') {
                match k.trim().to_ascii_lowercase().as_str() {
                    "types" => types = v.trim(),
                    "uris" => uris = v.trim(),
                    "suites" => suites = v.trim(),
                    "enabled" => enabled = v.trim() != "no",
                    _ => {}
                }
            }
        }
        let uri = uris.split_whitespace().next();
        if !enabled || !types.split_whitespace().any(|t| t == "deb") {
            continue;
        }
        let Some(uri) = uri else { continue };
        if suites.split_whitespace().any(|s| s == suite) {
            return Some(uri.to_owned());
        }
        first_deb.get_or_insert_with(|| (uri.to_owned(), suites.to_owned()));
    }
    // No stanza names the suite: take the first that is not a security/updates suite.
    first_deb
        .filter(|(_, s)| !s.contains("security") && !s.contains("updates"))
        .map(|(u, _)| u)
}

/// Finds the Debian mirror URI for `suite` in one-line `sources.list` text.
pub fn mirror_from_list(text: &str, suite: &str) -> Option<String> {
    let mut first = None;
    for line in text.lines() {
        let mut words = line.split_whitespace().peekable();
        if words.next() != Some("deb") {
            continue;
        }
        if words.peek().is_some_and(|w| w.starts_with('[')) {
            for w in words.by_ref() {
                if w.ends_with(']') {
                    break;
                }
            }
        }
        let (Some(uri), Some(s)) = (words.next(), words.next()) else {
            continue;
        };
        if s == suite {
            return Some(uri.to_owned());
        }
        if !s.contains("security") && !s.contains("updates") {
            first.get_or_insert_with(|| uri.to_owned());
        }
    }
    first
}

/// The mirror this machine's apt uses for `suite`: never a hard-coded host.
pub fn detect_mirror(suite: &str) -> Option<String> {
    let mut files: Vec<PathBuf> = fs::read_dir("/etc/apt/sources.list.d")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "sources"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    for f in &files {
        if let Some(m) = fs::read_to_string(f)
            .ok()
            .and_then(|t| mirror_from_deb822(&t, suite))
        {
            return Some(m);
        }
    }
    let mut lists = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(rd) = fs::read_dir("/etc/apt/sources.list.d") {
        let mut more: Vec<PathBuf> = rd
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "list"))
            .collect();
        more.sort();
        lists.extend(more);
    }
    lists.iter().find_map(|f| {
        fs::read_to_string(f)
            .ok()
            .and_then(|t| mirror_from_list(&t, suite))
    })
}

/// An exclusive lock on a file, held until dropped (std flock; released if the process dies).
pub(crate) fn lock_file(path: &Path) -> Result<fs::File> {
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| Error::io("open lock file", path, e))?;
    f.lock().map_err(|e| Error::io("lock", path, e))?;
    Ok(f)
}

/// Makes sure the base rootfs for the configured suite exists, building it (under a lock, so
/// parallel test processes build it once) when the recipe's cache entry is missing.
pub fn ensure_base_rootfs(config: &HarnessConfig) -> Result<BaseRootfs> {
    sys::create_dir_all(&config.cache_dir)?;
    let _lock = lock_file(&config.cache_dir.join("build.lock"))?;
    let client_key = ensure_client_key(config)?;
    let key = recipe_key(&config.suite);
    let entry = config.cache_dir.join(format!("base-{key}"));
    let rootfs = entry.join("rootfs");
    if entry.join("complete.json").exists() && rootfs.join("etc").is_dir() {
        return Ok(BaseRootfs {
            rootfs,
            key,
            client_key,
            built_in: None,
        });
    }
    let t0 = Instant::now();
    let mirror = match &config.mirror {
        Some(m) => m.clone(),
        None => detect_mirror(&config.suite).ok_or_else(|| Error::NoMirror {
            suite: config.suite.clone(),
        })?,
    };
    eprintln!(
        "clawfleet-vm-tests: building base rootfs {key} ({} from {mirror}), about 1-2 minutes",
        config.suite
    );
    let partial = config.cache_dir.join(format!("base-{key}.partial"));
    if partial.exists() {
        // A killed build may have left debootstrap's /proc etc. mounted inside.
        sys::unmount_all_under(&partial)?;
        sys::remove_tree(&partial)?;
    }
    if entry.exists() {
        sys::unmount_all_under(&entry)?;
        sys::remove_tree(&entry)?;
    }
    let debs = config.cache_dir.join("debs");
    sys::create_dir_all(&debs)?;
    let target = partial.join("rootfs");
    sys::create_dir_all(&target)?;
    let log_path = config.cache_dir.join(format!("base-{key}.log"));
    let log = fs::File::create(&log_path).map_err(|e| Error::io("create", &log_path, e))?;
    let log2 = log
        .try_clone()
        .map_err(|e| Error::io("reopen", &log_path, e))?;
    let mut cmd = Command::new("debootstrap");
    cmd.arg("--variant=minbase")
        .arg(format!("--include={}", INCLUDES.join(",")))
        .arg(format!("--cache-dir={}", debs.display()))
        .arg(&config.suite)
        .arg(&target)
        .arg(&mirror)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log2));
    let status = cmd.status().map_err(|source| Error::Spawn {
        command: sys::describe(&cmd),
        source,
    })?;
    if !status.success() {
        let _ = sys::unmount_all_under(&partial);
        return Err(Error::CommandFailed {
            command: sys::describe(&cmd),
            status: status.to_string(),
            stderr: format!(
                "see {}:\n{}",
                log_path.display(),
                sys::file_tail(&log_path, 15)
            ),
        });
    }
    sys::unmount_all_under(&partial)?;
    prepare(&target)?;
    fs::rename(&partial, &entry).map_err(|e| Error::io("rename into place", &entry, e))?;
    let built = t0.elapsed();
    let marker = Marker {
        key: key.clone(),
        suite: config.suite.clone(),
        mirror,
        includes: INCLUDES.iter().map(|s| (*s).to_owned()).collect(),
        build_seconds: built.as_secs_f64(),
    };
    let json = serde_json::to_vec_pretty(&marker).unwrap_or_default();
    sys::write_atomic(&entry.join("complete.json"), &json, 0o644)?;
    eprintln!(
        "clawfleet-vm-tests: base rootfs {key} built in {:.1}s",
        built.as_secs_f64()
    );
    Ok(BaseRootfs {
        rootfs,
        key,
        client_key,
        built_in: Some(built),
    })
}

/// Post-processing after debootstrap: no shared identity (host keys, machine-id), sshd set up
/// for key-only root login, useless units masked, docs and apt caches removed (~315 → ~160 MB).
fn prepare(root: &Path) -> Result<()> {
    let ssh = root.join("etc/ssh");
    if let Ok(rd) = fs::read_dir(&ssh) {
        for e in rd.filter_map(|e| e.ok()) {
            if e.file_name().to_string_lossy().starts_with("ssh_host_") {
                fs::remove_file(e.path()).map_err(|err| Error::io("remove", e.path(), err))?;
            }
        }
    }
    sys::write_file(
        &ssh.join("sshd_config.d/clawfleet-vm-tests.conf"),
        SSHD_DROP_IN.as_bytes(),
        0o644,
    )?;
    for unit in MASKED_UNITS {
        let link = root.join("etc/systemd/system").join(unit);
        let _ = fs::remove_file(&link);
        symlink("/dev/null", &link).map_err(|e| Error::io("mask unit", &link, e))?;
    }
    sys::write_file(&root.join("etc/machine-id"), b"", 0o444)?;
    let dbus_id = root.join("var/lib/dbus/machine-id");
    let _ = fs::remove_file(&dbus_id);
    if let Some(parent) = dbus_id.parent() {
        sys::create_dir_all(parent)?;
    }
    symlink("/etc/machine-id", &dbus_id).map_err(|e| Error::io("link", &dbus_id, e))?;
    for dir in [
        "var/lib/apt/lists",
        "usr/share/doc",
        "usr/share/man",
        "usr/share/locale",
    ] {
        if let Ok(rd) = fs::read_dir(root.join(dir)) {
            for e in rd.filter_map(|e| e.ok()) {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    let _ = fs::remove_dir_all(e.path());
                } else {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
    }
    for (dir, ext) in [("var/cache/apt/archives", "deb"), ("var/cache/apt", "bin")] {
        if let Ok(rd) = fs::read_dir(root.join(dir)) {
            for e in rd.filter_map(|e| e.ok()) {
                if e.path().extension().is_some_and(|x| x == ext) {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
    }
    Ok(())
}

/// The harness's ssh client key (one per cache dir); created under the build lock.
fn ensure_client_key(config: &HarnessConfig) -> Result<PathBuf> {
    let dir = config.cache_dir.join("client");
    let key = dir.join("id_ed25519");
    if key.exists() && dir.join("id_ed25519.pub").exists() {
        return Ok(key);
    }
    sys::create_dir_all(&dir)?;
    let _ = fs::remove_file(&key);
    let _ = fs::remove_file(dir.join("id_ed25519.pub"));
    sys::run(
        Command::new("ssh-keygen")
            .args([
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                "clawfleet-vm-tests",
                "-f",
            ])
            .arg(&key),
    )?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEB822: &str = "Types: deb\n# http://snapshot.debian.org/archive/debian/20250520T000000Z\n\
        URIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\n\
        Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\n\
        Components: main\n";

    #[test]
    fn deb822_picks_the_suite_stanza() {
        assert_eq!(
            mirror_from_deb822(DEB822, "bookworm").as_deref(),
            Some("http://deb.debian.org/debian")
        );
        let sec_first = "Types: deb\nURIs: http://sec.example/debian-security\nSuites: bookworm-security\n\n\
            Types: deb-src deb\nURIs: http://m.example/debian http://other\nSuites: bookworm\n";
        assert_eq!(
            mirror_from_deb822(sec_first, "bookworm").as_deref(),
            Some("http://m.example/debian")
        );
        let disabled =
            "Types: deb\nURIs: http://off.example/debian\nSuites: bookworm\nEnabled: no\n";
        assert_eq!(mirror_from_deb822(disabled, "bookworm"), None);
        let src_only = "Types: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\n";
        assert_eq!(mirror_from_deb822(src_only, "bookworm"), None);
    }

    #[test]
    fn sources_list_lines() {
        let text = "# comment\ndeb [arch=amd64 signed-by=/x.gpg] http://m.example/debian bookworm main\n\
                    deb http://security.example/debian-security bookworm-security main\n";
        assert_eq!(
            mirror_from_list(text, "bookworm").as_deref(),
            Some("http://m.example/debian")
        );
        let only_other = "deb http://m.example/debian trixie main\n";
        assert_eq!(
            mirror_from_list(only_other, "bookworm").as_deref(),
            Some("http://m.example/debian")
        );
        assert_eq!(
            mirror_from_list("deb-src http://x bookworm main\n", "bookworm"),
            None
        );
    }

    #[test]
    fn recipe_key_changes_with_the_recipe() {
        assert_eq!(recipe_key("bookworm"), recipe_key("bookworm"));
        assert_ne!(recipe_key("bookworm"), recipe_key("trixie"));
        assert_eq!(recipe_key("bookworm").len(), 16);
    }
}
