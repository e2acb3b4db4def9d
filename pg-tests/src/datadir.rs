//! A run's data directory: a copy of a per-version template that initdb made once (initdb takes
//! 1-5 s on a busy 2-core machine, a copy about 0.5 s), then this run's `pg_hba.conf` and server
//! settings.
//!
//! `<state>/templates/pg<version>-t<TEMPLATE_FORMAT>/` is built under a flock on
//! `<state>/templates/.lock`, in a `.tmp-<pid>` directory renamed into place with its `.complete`
//! stamp inside, so a build killed halfway is never used (and is removed by the next build).

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::config::HarnessConfig;
use crate::error::{Error, Result};
use crate::sys;

/// The superuser (trusted on the socket and on 127.0.0.1).
pub const SUPERUSER: &str = "postgres";
/// Group role whose members log in over 127.0.0.1 without a password (`create_role(_, None)`).
pub const TRUSTED_GROUP: &str = "clawfleet_trusted";
/// Group role whose members log in over TLS with a client certificate (`cert` method).
pub const CERT_GROUP: &str = "clawfleet_cert";

/// Bumped whenever what the template holds changes (initdb options, the group roles).
const TEMPLATE_FORMAT: u32 = 2;

/// Settings the harness sets itself; a test cannot override them.
const RESERVED_SETTINGS: &[&str] = &[
    "listen_addresses",
    "port",
    "unix_socket_directories",
    "hba_file",
    "data_directory",
    "ssl",
    "ssl_cert_file",
    "ssl_key_file",
    "ssl_ca_file",
];

/// Whether and how the server speaks TLS.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Tls {
    /// `ssl = off`: `sslmode=disable` (and `prefer`) connect in plain text.
    #[default]
    Off,
    /// `ssl = on` with a certificate from the run's CA; plain connections are accepted too.
    On,
    /// Like `On`, but `pg_hba.conf` accepts TCP connections only over TLS (`hostssl`).
    Required,
}

/// A ready template data directory.
#[derive(Debug, Clone)]
pub(crate) struct Template {
    /// The server's version, e.g. `15.18`.
    pub version: String,
    pub data_dir: PathBuf,
    /// Whether this call ran initdb (the first start on the machine, or after an upgrade).
    pub built: bool,
}

/// A command run as the `postgres` user with a clean environment.
pub(crate) fn as_postgres(config: &HarnessConfig, program: &str) -> Command {
    let mut c = Command::new(config.binary(program));
    c.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("LC_ALL", "C")
        .uid(config.uid)
        .gid(config.gid)
        .current_dir("/");
    c
}

/// Runs a command to completion; its stderr in the error when it fails.
pub(crate) fn run(program: &'static str, mut cmd: Command, stdin: Option<&str>) -> Result<String> {
    let path = PathBuf::from(cmd.get_program());
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let spawn_err = |source| Error::Spawn {
        program,
        path: path.clone(),
        source,
    };
    let mut child = cmd.spawn().map_err(spawn_err)?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        use std::io::Write;
        // A child that exits early closes the pipe; its status tells why.
        let _ = pipe.write_all(input.as_bytes());
    }
    let out = child.wait_with_output().map_err(spawn_err)?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(Error::Command {
            program,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// `postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)` → `15.18`.
fn parse_version(text: &str) -> Option<String> {
    let v = text.split_whitespace().nth(2)?;
    v.chars()
        .all(|c| c.is_ascii_digit() || c == '.')
        .then(|| v.to_string())
}

/// The template for this server version, built when missing.
pub(crate) fn ensure_template(config: &HarnessConfig) -> Result<Template> {
    let mut version_cmd = Command::new(config.binary("postgres"));
    version_cmd.arg("--version").env_clear();
    let out = run("postgres --version", version_cmd, None)?;
    let version = parse_version(&out).ok_or_else(|| Error::NoPostgres {
        reason: format!("`postgres --version` printed {:?}", out.trim()),
    })?;
    let root = config.templates_dir();
    sys::make_dir(&config.state_dir, 0o755, None)?;
    sys::make_dir(&root, 0o755, None)?;
    let dir = root.join(format!("pg{version}-t{TEMPLATE_FORMAT}"));
    let template = |built| Template {
        version: version.clone(),
        data_dir: dir.join("data"),
        built,
    };
    if dir.join(".complete").is_file() {
        return Ok(template(false));
    }
    let lock_path = root.join(".lock");
    let lock = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .map_err(|e| Error::io("open lock file", &lock_path, e))?;
    lock.lock().map_err(|e| Error::io("lock", &lock_path, e))?;
    if dir.join(".complete").is_file() {
        return Ok(template(false));
    }
    // Leftovers of builds that died halfway (we hold the lock, so none is in progress).
    if let Ok(entries) = fs::read_dir(&root) {
        for e in entries.filter_map(|e| e.ok()) {
            if e.file_name().to_string_lossy().contains(".tmp-") {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
    if dir.exists() {
        fs::remove_dir_all(&dir).map_err(|e| Error::io("remove incomplete template", &dir, e))?;
    }
    let t0 = Instant::now();
    let tmp = root.join(format!(
        "pg{version}-t{TEMPLATE_FORMAT}.tmp-{}",
        std::process::id()
    ));
    sys::make_dir(&tmp, 0o755, Some((config.uid, config.gid)))?;
    let data = tmp.join("data");
    let mut initdb = as_postgres(config, "initdb");
    initdb
        .arg("-D")
        .arg(&data)
        .args([
            "-U",
            SUPERUSER,
            "--auth=trust",
            "--no-sync",
            "--no-instructions",
        ])
        .args(["--encoding=UTF8", "--locale=C"])
        // 1 MiB WAL segments instead of 16: a copy (and its tmpfs) 15 MiB smaller.
        .arg("--wal-segsize=1");
    run("initdb", initdb, None)?;
    // Single-user mode: the group roles exist in every copy, without a server start.
    let mut single = as_postgres(config, "postgres");
    single
        .args(["--single", "-D"])
        .arg(&data)
        .args(["-c", "exit_on_error=true", "postgres"]);
    run(
        "postgres --single",
        single,
        Some(&format!(
            "CREATE ROLE {TRUSTED_GROUP} NOLOGIN;\nCREATE ROLE {CERT_GROUP} NOLOGIN;\n"
        )),
    )?;
    sys::write_file(&tmp.join(".complete"), version.as_bytes(), 0o644, None)?;
    fs::rename(&tmp, &dir).map_err(|e| Error::io("rename into place", &dir, e))?;
    eprintln!(
        "clawfleet-pg-tests: built the PostgreSQL {version} template {} in {:.2}s",
        dir.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(template(true))
}

/// Copies the template's data directory to `dest` (owner, modes and all).
pub(crate) fn copy_template(template: &Template, dest: &Path) -> Result<()> {
    let mut cp = Command::new("cp");
    cp.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .args(["-a", "--reflink=auto"])
        .arg(&template.data_dir)
        .arg(dest);
    run("cp", cp, None).map(|_| ())
}

/// Double-quoted SQL identifier.
pub(crate) fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Single-quoted SQL string literal (standard_conforming_strings is on).
pub(crate) fn literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

/// A role or database name PostgreSQL keeps as given: 1-63 bytes, no NUL.
pub(crate) fn check_name(what: &'static str, name: &str) -> Result<()> {
    let reason = if name.is_empty() {
        "it is empty"
    } else if name.len() > 63 {
        "it is longer than 63 bytes (PostgreSQL would truncate it)"
    } else if name.contains('\0') {
        "it contains a NUL byte"
    } else {
        return Ok(());
    };
    Err(Error::InvalidInput {
        what,
        value: name.to_string(),
        reason,
    })
}

/// Checks test-supplied server settings: lowercase names, no newlines, none of the harness's own.
pub(crate) fn check_settings(settings: &[(String, String)]) -> Result<()> {
    for (k, v) in settings {
        let bad = |reason| {
            Err(Error::InvalidInput {
                what: "server setting",
                value: format!("{k} = {v}"),
                reason,
            })
        };
        if k.is_empty()
            || !k
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '.')
        {
            return bad("the name must be lowercase letters, digits, '_' and '.'");
        }
        if RESERVED_SETTINGS.contains(&k.as_str()) {
            return bad("the harness sets it itself");
        }
        if v.contains(['\n', '\r', '\0']) {
            return bad("the value contains a line break or NUL");
        }
    }
    Ok(())
}

/// Quoted value for postgresql.conf.
fn conf_value(v: &str) -> String {
    format!("'{}'", v.replace('\\', "\\\\").replace('\'', "''"))
}

/// Files of a TLS server inside the run directory.
#[derive(Debug, Clone)]
pub(crate) struct TlsPaths {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The lines appended to the template's postgresql.conf (later lines win).
pub(crate) fn server_conf(
    port: u16,
    socket_dir: &Path,
    tls: Option<&TlsPaths>,
    settings: &[(String, String)],
) -> String {
    let mut lines = vec![
        "# clawfleet-pg-tests".to_string(),
        "listen_addresses = '127.0.0.1'".to_string(),
        format!("port = {port}"),
        format!(
            "unix_socket_directories = {}",
            conf_value(&socket_dir.to_string_lossy())
        ),
        // A throwaway server: losing data on an OS crash is fine, a SIGKILL loses nothing
        // committed (the page cache survives it).
        "fsync = off".to_string(),
        "shared_buffers = '32MB'".to_string(),
        // Bounds the WAL kept on tmpfs under load (checkpoints are cheap without fsync).
        "min_wal_size = '8MB'".to_string(),
        "max_wal_size = '256MB'".to_string(),
        "password_encryption = 'scram-sha-256'".to_string(),
        // Dynamic shared memory as files in the data directory, so that a crashed server's
        // segments go with it rather than staying in /dev/shm.
        "dynamic_shared_memory_type = 'mmap'".to_string(),
        "logging_collector = off".to_string(),
        "log_line_prefix = '%m [%p] %q%u@%d '".to_string(),
    ];
    match tls {
        Some(t) => {
            lines.push("ssl = on".to_string());
            lines.push(format!(
                "ssl_ca_file = {}",
                conf_value(&t.ca.to_string_lossy())
            ));
            lines.push(format!(
                "ssl_cert_file = {}",
                conf_value(&t.cert.to_string_lossy())
            ));
            lines.push(format!(
                "ssl_key_file = {}",
                conf_value(&t.key.to_string_lossy())
            ));
        }
        None => lines.push("ssl = off".to_string()),
    }
    for (k, v) in settings {
        lines.push(format!("{k} = {}", conf_value(v)));
    }
    lines.join("\n") + "\n"
}

/// pg_hba.conf: the superuser trusted everywhere, members of [`TRUSTED_GROUP`] trusted on
/// 127.0.0.1, members of [`CERT_GROUP`] by client certificate, every other role by
/// scram-sha-256. With [`Tls::Required`] TCP lines match only TLS connections.
pub(crate) fn hba(tls: Tls) -> String {
    let host = if tls == Tls::Required {
        "hostssl"
    } else {
        "host"
    };
    let mut lines = vec![
        "# clawfleet-pg-tests: first match wins".to_string(),
        "local all all trust".to_string(),
        format!("{host} all {SUPERUSER} 127.0.0.1/32 trust"),
    ];
    if tls != Tls::Off {
        lines.push(format!("hostssl all +{CERT_GROUP} 127.0.0.1/32 cert"));
    }
    lines.push(format!("{host} all +{TRUSTED_GROUP} 127.0.0.1/32 trust"));
    lines.push(format!("{host} all all 127.0.0.1/32 scram-sha-256"));
    lines.join("\n") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_from_debian_and_upstream_builds() {
        assert_eq!(
            parse_version("postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)\n").as_deref(),
            Some("15.18")
        );
        assert_eq!(
            parse_version("postgres (PostgreSQL) 17.2").as_deref(),
            Some("17.2")
        );
        assert_eq!(parse_version("postgres (PostgreSQL) 18beta1"), None);
        assert_eq!(parse_version(""), None);
    }

    #[test]
    fn quoting_doubles_the_quote_characters() {
        assert_eq!(ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(literal("it's"), "'it''s'");
        assert_eq!(conf_value("a'b\\c"), "'a''b\\\\c'");
    }

    #[test]
    fn names_and_settings_are_checked() {
        assert!(check_name("role", "").is_err());
        assert!(check_name("role", &"x".repeat(64)).is_err());
        assert!(check_name("role", "a\0b").is_err());
        assert!(check_name("role", "Mixed Case \"quoted\"").is_ok());
        let set = |k: &str, v: &str| vec![(k.to_string(), v.to_string())];
        assert!(check_settings(&set("max_connections", "300")).is_ok());
        assert!(check_settings(&set("port", "5432")).is_err());
        assert!(check_settings(&set("Max", "1")).is_err());
        assert!(check_settings(&set("work_mem", "1\nport = 1")).is_err());
    }

    #[test]
    fn hba_trusts_only_the_superuser_and_the_groups() {
        let off = hba(Tls::Off);
        assert!(off.contains("host all postgres 127.0.0.1/32 trust"));
        assert!(off.contains("host all all 127.0.0.1/32 scram-sha-256"));
        assert!(!off.contains("hostssl"));
        let required = hba(Tls::Required);
        assert!(!required.contains("\nhost "));
        assert!(required.contains("hostssl all +clawfleet_cert 127.0.0.1/32 cert"));
        // The cert group's line comes before the trusted group's and the password line.
        let on = hba(Tls::On);
        let pos = |s: &str| on.find(s).unwrap();
        assert!(pos("+clawfleet_cert") < pos("+clawfleet_trusted"));
        assert!(pos("+clawfleet_trusted") < pos("scram-sha-256"));
    }
}
