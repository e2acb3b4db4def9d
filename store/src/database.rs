//! Which database holds the coordinator's state: `database` in occ.toml. Absent, the
//! embedded SQLite file in the state directory; `postgres://…` (or `postgresql://…`), a
//! PostgreSQL database that several coordinators share.
//!
//! The URL takes the libpq names for what it may say: `sslmode` (`disable`, `prefer`,
//! `require`, `verify-ca`, `verify-full`), `sslrootcert`, `sslcert`, `sslkey`,
//! `connect_timeout`, `application_name`, and `host` for a Unix socket directory. The password
//! never sits in the URL (it would end up in logs and process listings): it comes from
//! `[postgres] password_file` or the `PGPASSWORD` environment variable.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the state lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Database {
    Sqlite(PathBuf),
    Postgres(Box<PostgresSettings>),
}

/// Whether `host` is this machine: a Unix socket directory, `localhost` or a loopback
/// address. Only there may the connection be plain without `sslmode` saying so.
pub fn is_local_host(host: &str) -> bool {
    host.starts_with('/')
        || host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The protection of a connection to `host` when the URL names no `sslmode`: `prefer` on this
/// machine (as libpq), verified TLS (`verify-full`) anywhere else, so a password and the
/// state never cross a network unverified unless the operator says so.
pub fn default_tls(host: &str) -> TlsMode {
    if is_local_host(host) {
        TlsMode::Prefer
    } else {
        TlsMode::VerifyFull
    }
}

/// How the connection to PostgreSQL is protected, as libpq's `sslmode` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// No TLS.
    Disable,
    /// TLS if the server offers it, unverified (libpq's default).
    Prefer,
    /// TLS, unverified unless `sslrootcert` is given (then as `verify-ca`).
    Require,
    /// TLS; the server's certificate chains to `sslrootcert` (any name).
    VerifyCa,
    /// TLS; the certificate chains to `sslrootcert` and names the host.
    VerifyFull,
}

impl TlsMode {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "disable" => TlsMode::Disable,
            "prefer" => TlsMode::Prefer,
            "require" => TlsMode::Require,
            "verify-ca" => TlsMode::VerifyCa,
            "verify-full" => TlsMode::VerifyFull,
            _ => return None,
        })
    }
}

/// A password, never shown by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(pub String);

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A PostgreSQL database and how to reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresSettings {
    /// A host name or address, or a Unix socket directory (starts with `/`).
    pub host: String,
    pub port: u16,
    pub user: String,
    pub dbname: String,
    pub password: Option<Password>,
    pub tls: TlsMode,
    pub root_cert: Option<PathBuf>,
    /// Client certificate and key, both or neither.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    pub connect_timeout: Duration,
    pub application_name: String,
    /// Connections this coordinator keeps open.
    pub pool_size: usize,
    /// The URL without anything secret, for logs and errors.
    pub shown: String,
}

/// Settings of `[postgres]` that are not in the URL.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PostgresOptions {
    pub password_file: Option<PathBuf>,
    pub pool_size: Option<usize>,
}

const DEFAULT_POOL: usize = 16;

fn decode(s: &str, what: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = s
                    .get(i + 1..i + 3)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| format!("{what} has a bad %-escape"))?;
                out.push(hex);
                i += 3;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| format!("{what} is not UTF-8"))
}

impl Database {
    /// The default: SQLite in the state directory.
    pub fn sqlite_in(state_dir: &Path) -> Self {
        Database::Sqlite(state_dir.join("occ.db"))
    }

    /// Parses `database`; the error says what is wrong without repeating anything secret.
    /// `env_password` is `PGPASSWORD` (passed in, so tests need not touch the environment).
    pub fn parse_url(
        url: &str,
        options: &PostgresOptions,
        env_password: Option<String>,
    ) -> Result<Self, String> {
        let rest = url
            .strip_prefix("postgres://")
            .or_else(|| url.strip_prefix("postgresql://"))
            .ok_or_else(|| {
                "must be a postgres:// URL (leave it out for the embedded SQLite database)"
                    .to_owned()
            })?;
        let (main, query) = match rest.split_once('?') {
            Some((m, q)) => (m, Some(q)),
            None => (rest, None),
        };
        let (authority, dbname) = match main.split_once('/') {
            Some((a, d)) => (a, decode(d, "the database name")?),
            None => (main, String::new()),
        };
        let (user, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) => {
                if u.contains(':') {
                    return Err(
                        "holds a password: put it in [postgres] password_file or PGPASSWORD, \
                         never in the URL"
                            .to_owned(),
                    );
                }
                (decode(u, "the user name")?, h)
            }
            None => (String::new(), authority),
        };
        let (mut host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (h, after) = v6
                .split_once(']')
                .ok_or_else(|| "has an unclosed [ in its host".to_owned())?;
            (h.to_owned(), after.strip_prefix(':'))
        } else {
            match hostport.split_once(':') {
                Some((h, p)) => (h.to_owned(), Some(p)),
                None => (hostport.to_owned(), None),
            }
        };
        let port = match port {
            None | Some("") => 5432,
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| format!("has port {p:?}, not a number from 1 to 65535"))?,
        };
        let mut tls = None;
        let mut root_cert = None;
        let mut cert = None;
        let mut key = None;
        let mut connect_timeout = Duration::from_secs(10);
        let mut application_name = "occ".to_owned();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| format!("parameter {pair:?} has no value"))?;
            let v = decode(v, k)?;
            match k {
                "sslmode" => {
                    tls = Some(TlsMode::parse(&v).ok_or_else(|| {
                        format!(
                            "sslmode {v:?} is not one of disable, prefer, require, verify-ca, verify-full"
                        )
                    })?)
                }
                "sslrootcert" => root_cert = Some(PathBuf::from(v)),
                "sslcert" => cert = Some(PathBuf::from(v)),
                "sslkey" => key = Some(PathBuf::from(v)),
                "connect_timeout" => {
                    let s: u64 = v
                        .parse()
                        .ok()
                        .filter(|s| (1..=300).contains(s))
                        .ok_or_else(|| {
                            format!("connect_timeout {v:?} is not 1 to 300 seconds")
                        })?;
                    connect_timeout = Duration::from_secs(s);
                }
                "application_name" => application_name = v,
                "host" => host = v,
                "password" => {
                    return Err(
                        "holds a password: put it in [postgres] password_file or PGPASSWORD, \
                         never in the URL"
                            .to_owned(),
                    );
                }
                other => {
                    return Err(format!(
                        "has parameter {other:?}; known: sslmode, sslrootcert, sslcert, sslkey, \
                         connect_timeout, application_name, host"
                    ));
                }
            }
        }
        if host.is_empty() {
            return Err("names no host".to_owned());
        }
        if user.is_empty() {
            return Err("names no user (postgres://USER@HOST/DB)".to_owned());
        }
        if dbname.is_empty() {
            return Err("names no database (postgres://USER@HOST/DB)".to_owned());
        }
        let tls = match tls {
            Some(t) => t,
            None if default_tls(&host) == TlsMode::VerifyFull && root_cert.is_none() => {
                return Err(format!(
                    "names host {host:?}, which is not this machine, and no sslmode: the \
                     connection must then be verified TLS, so add sslmode=verify-full and \
                     sslrootcert=<the CA that signed the server's certificate> (or say \
                     sslmode=require, prefer or disable to accept a connection that is not \
                     verified)"
                ));
            }
            None => default_tls(&host),
        };
        if matches!(tls, TlsMode::VerifyCa | TlsMode::VerifyFull) && root_cert.is_none() {
            return Err(format!(
                "sslmode {} needs sslrootcert (the CA that signed the server's certificate)",
                if tls == TlsMode::VerifyCa {
                    "verify-ca"
                } else {
                    "verify-full"
                }
            ));
        }
        let client_cert = match (cert, key) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => return Err("sslcert and sslkey go together".to_owned()),
        };
        if tls == TlsMode::Disable && (root_cert.is_some() || client_cert.is_some()) {
            return Err("sslmode=disable with TLS files: say which you mean".to_owned());
        }
        let password = match &options.password_file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    format!(
                        "cannot read [postgres] password_file {}: {e}",
                        path.display()
                    )
                })?;
                let line = text.lines().next().unwrap_or("").to_owned();
                if line.is_empty() {
                    return Err(format!(
                        "[postgres] password_file {} is empty",
                        path.display()
                    ));
                }
                Some(Password(line))
            }
            None => env_password.filter(|p| !p.is_empty()).map(Password),
        };
        let pool_size = match options.pool_size {
            Some(n) if !(1..=256).contains(&n) => {
                return Err(format!("[postgres] pool_size {n} is not 1 to 256"));
            }
            n => n.unwrap_or(DEFAULT_POOL),
        };
        let shown = match query {
            Some(q) => format!("postgres://{authority}/{dbname}?{q}"),
            None => format!("postgres://{authority}/{dbname}"),
        };
        Ok(Database::Postgres(Box::new(PostgresSettings {
            host,
            port,
            user,
            dbname,
            password,
            tls,
            root_cert,
            client_cert,
            connect_timeout,
            application_name,
            pool_size,
            shown,
        })))
    }

    /// What logs and errors show.
    pub fn shown(&self) -> String {
        match self {
            Database::Sqlite(p) => p.display().to_string(),
            Database::Postgres(s) => s.shown.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pg(url: &str) -> Result<PostgresSettings, String> {
        match Database::parse_url(url, &PostgresOptions::default(), None)? {
            Database::Postgres(s) => Ok(*s),
            Database::Sqlite(_) => Err("sqlite".into()),
        }
    }

    /// N16: a URL without sslmode was `prefer` (unverified, or plain if the server offers no
    /// TLS) wherever the server was. Now only this machine gets that default; any other host
    /// gets verified TLS, and without the CA the URL is refused naming sslmode.
    #[test]
    fn without_sslmode_only_this_machine_may_be_plain() {
        for local in [
            "127.0.0.1",
            "127.0.0.2",
            "::1",
            "localhost",
            "LocalHost",
            "/run/postgresql",
        ] {
            assert!(is_local_host(local), "{local}");
            assert_eq!(default_tls(local), TlsMode::Prefer, "{local}");
        }
        for remote in [
            "db.example.org",
            "10.0.0.5",
            "192.0.2.1",
            "::2",
            "localhost.example.org",
        ] {
            assert!(!is_local_host(remote), "{remote}");
            assert_eq!(default_tls(remote), TlsMode::VerifyFull, "{remote}");
        }
        assert_eq!(
            pg("postgres://occ@127.0.0.1:5433/db").unwrap().tls,
            TlsMode::Prefer
        );
        assert_eq!(pg("postgres://occ@[::1]/db").unwrap().tls, TlsMode::Prefer);
        assert_eq!(
            pg("postgres://occ@h/db?host=/run/postgresql").unwrap().tls,
            TlsMode::Prefer
        );
        let e = pg("postgres://occ@db.example.org/db").unwrap_err();
        assert!(e.contains("sslmode") && e.contains("sslrootcert"), "{e}");
        let s = pg("postgres://occ@db.example.org/db?sslrootcert=/etc/ca.pem").unwrap();
        assert_eq!(s.tls, TlsMode::VerifyFull);
        // Said explicitly, a weaker mode is the operator's choice.
        for mode in ["require", "prefer", "disable"] {
            let s = pg(&format!("postgres://occ@db.example.org/db?sslmode={mode}")).unwrap();
            assert_eq!(Some(s.tls), TlsMode::parse(mode));
        }
    }

    #[test]
    fn urls_as_libpq_users_write_them() {
        let s = pg("postgres://occ@db.example:6543/clawfleet?sslmode=verify-full&sslrootcert=/etc/ca.pem&application_name=occ-2").unwrap();
        assert_eq!(
            (s.host.as_str(), s.port, s.user.as_str(), s.dbname.as_str()),
            ("db.example", 6543, "occ", "clawfleet")
        );
        assert_eq!(s.tls, TlsMode::VerifyFull);
        assert_eq!(s.root_cert.as_deref(), Some(Path::new("/etc/ca.pem")));
        assert_eq!(s.application_name, "occ-2");
        let s = pg("postgresql://occ@[::1]/db?sslmode=disable").unwrap();
        assert_eq!(
            (s.host.as_str(), s.port, s.tls),
            ("::1", 5432, TlsMode::Disable)
        );
        let s = pg("postgres://occ@localhost/db?host=/run/postgresql").unwrap();
        assert_eq!(s.host, "/run/postgresql");
        assert_eq!(s.tls, TlsMode::Prefer);
    }

    #[test]
    fn bad_urls_are_refused_naming_what_is_wrong_and_never_echo_a_password() {
        for (url, wanted) in [
            ("mysql://x@h/db", "postgres:// URL"),
            ("postgres://occ:hunter2@h/db", "password_file"),
            ("postgres://occ@h/db?password=hunter2", "password_file"),
            ("postgres://occ@localhost:0/db", "port"),
            ("postgres://occ@localhost:99999/db", "port"),
            ("postgres://occ@h/db?sslmode=maybe", "sslmode"),
            ("postgres://occ@h/db?sslmode=verify-full", "sslrootcert"),
            ("postgres://occ@localhost/db?sslcert=/c", "sslkey"),
            ("postgres://occ@h/db?bogus=1", "bogus"),
            ("postgres://localhost/db", "user"),
            ("postgres://occ@localhost", "database"),
            (
                "postgres://occ@localhost/db?connect_timeout=0",
                "connect_timeout",
            ),
        ] {
            let e = pg(url).unwrap_err();
            assert!(e.contains(wanted), "{url}: {e}");
            assert!(!e.contains("hunter2"), "{url}: {e}");
        }
    }

    #[test]
    fn the_password_comes_from_a_file_or_the_environment_and_is_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "s3cret\n").unwrap();
        let options = PostgresOptions {
            password_file: Some(file),
            pool_size: Some(4),
        };
        let Database::Postgres(s) =
            Database::parse_url("postgres://occ@localhost/db", &options, Some("env".into()))
                .unwrap()
        else {
            panic!("not postgres")
        };
        assert_eq!(s.password, Some(Password("s3cret".into())));
        assert_eq!(s.pool_size, 4);
        assert!(!format!("{s:?}").contains("s3cret"));
        let Database::Postgres(s) = Database::parse_url(
            "postgres://occ@localhost/db",
            &PostgresOptions::default(),
            Some("env".into()),
        )
        .unwrap() else {
            panic!("not postgres")
        };
        assert_eq!(s.password, Some(Password("env".into())));
    }
}
