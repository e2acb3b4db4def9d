//! One throwaway PostgreSQL server: started, restarted, killed and torn down by its postmaster's
//! pid, on its own port on 127.0.0.1 with its own data and socket directories.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::config::HarnessConfig;
use crate::datadir::{self, CERT_GROUP, SUPERUSER, TRUSTED_GROUP, Template, Tls, TlsPaths};
use crate::error::{Error, Result};
use crate::run::{self, ProcessRecord, Run, RunRecord};
use crate::tls::Pki;
use crate::{signals, sys};

/// Longest unix socket path the kernel takes (`sun_path` is 108 bytes with its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// What a server is started with besides the harness's own settings.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// TLS off (default), on, or required for TCP connections.
    pub tls: Tls,
    /// More `postgresql.conf` settings (`max_connections`, `log_statement`, …); the harness's own
    /// (port, addresses, sockets, ssl files) are refused.
    pub settings: Vec<(String, String)>,
}

impl Options {
    /// With TLS on or required.
    pub fn tls(mut self, tls: Tls) -> Self {
        self.tls = tls;
        self
    }

    /// With one more server setting.
    pub fn setting(mut self, name: &str, value: &str) -> Self {
        self.settings.push((name.to_string(), value.to_string()));
        self
    }
}

/// How long the start took.
#[derive(Debug, Clone, Copy, Default)]
pub struct StartTimings {
    /// Making the data directory (template copy, and initdb the first time on a machine).
    pub data_dir: Duration,
    /// Whether that included building the template with initdb.
    pub template_built: bool,
    /// Spawning the postmaster until it accepted connections.
    pub server: Duration,
}

impl StartTimings {
    /// The whole start.
    pub fn total(&self) -> Duration {
        self.data_dir + self.server
    }
}

impl std::fmt::Display for StartTimings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.2}s (data directory {:.2}s{}, server {:.2}s)",
            self.total().as_secs_f64(),
            self.data_dir.as_secs_f64(),
            if self.template_built {
                " with initdb"
            } else {
                " from the template"
            },
            self.server.as_secs_f64()
        )
    }
}

/// A client certificate for a role of the [`CERT_GROUP`] (TLS servers only).
#[derive(Debug, Clone)]
pub struct ClientCert {
    /// PEM certificate (common name = role), written to `cert_path`.
    pub cert_path: PathBuf,
    /// PEM private key, mode 0600, written to `key_path`.
    pub key_path: PathBuf,
}

#[derive(Debug)]
struct Postmaster {
    child: Child,
    record: ProcessRecord,
}

#[derive(Debug)]
struct TlsState {
    pki: Pki,
    paths: TlsPaths,
}

/// A running PostgreSQL server for a test. Dropping it stops the postmaster by pid and removes
/// its run directory (the server log is kept in `<state>/logs/` when the test panicked).
#[derive(Debug)]
pub struct TestPostgres {
    config: HarnessConfig,
    options: Options,
    id: String,
    run: Run,
    run_dir: PathBuf,
    data_dir: PathBuf,
    socket_dir: PathBuf,
    log_path: PathBuf,
    port: u16,
    version: String,
    tls: Option<TlsState>,
    postmaster: Mutex<Option<Postmaster>>,
    timings: StartTimings,
    keep_log: bool,
    done: bool,
}

/// Percent-encodes everything but RFC 3986's unreserved characters (for URL user and db).
fn url_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl TestPostgres {
    /// A server with the default [`Options`] (no TLS) and the environment's settings.
    pub fn start() -> Result<Self> {
        Self::start_with(&Options::default())
    }

    /// A server with these options and the environment's settings.
    pub fn start_with(options: &Options) -> Result<Self> {
        Self::start_in(&HarnessConfig::from_env()?, options)
    }

    /// A server with explicit harness settings. Reclaims what dead test processes left first.
    pub fn start_in(config: &HarnessConfig, options: &Options) -> Result<Self> {
        datadir::check_settings(&options.settings)?;
        if let Err(e) = run::reclaim_stale(config) {
            eprintln!("clawfleet-pg-tests: {e}");
        }
        let id = format!("{}-{}", std::process::id(), sys::random_hex(3)?);
        let run = Run::claim(config, &id)?;
        let run_dir = config.runs_dir().join(&id);
        let port = sys::free_port()?;
        let socket_dir = run_dir.join("socket");
        let socket_len = socket_dir
            .join(format!(".s.PGSQL.{port}"))
            .as_os_str()
            .len();
        let mut pg = TestPostgres {
            config: config.clone(),
            options: options.clone(),
            data_dir: config.data_dir_for(&id, &run_dir),
            log_path: run_dir.join(run::LOG_FILE),
            socket_dir,
            run_dir,
            port,
            version: String::new(),
            tls: None,
            postmaster: Mutex::new(None),
            timings: StartTimings::default(),
            keep_log: config.keep_logs,
            done: false,
            run,
            id,
        };
        if socket_len > MAX_SOCKET_PATH {
            return Err(Error::InvalidSetting {
                name: "CLAWFLEET_PG_STATE_DIR",
                value: config.state_dir.display().to_string(),
                reason: "too long: the server's unix socket path would exceed 107 bytes",
            });
        }
        // Recorded before anything exists, so a crash from here on is reclaimable.
        pg.write_record()?;
        signals::register(&pg.id, pg.run.record_path.clone());
        match pg.boot() {
            Ok(()) => Ok(pg),
            Err(e) => {
                // Drop tears down; the log stays for the failure.
                pg.keep_log = true;
                Err(e)
            }
        }
    }

    fn boot(&mut self) -> Result<()> {
        let t0 = Instant::now();
        let owner = Some((self.config.uid, self.config.gid));
        sys::make_dir(&self.run_dir, 0o755, None)?;
        let template: Template = datadir::ensure_template(&self.config)?;
        self.version = template.version.clone();
        datadir::copy_template(&template, &self.data_dir)?;
        sys::make_dir(&self.socket_dir, 0o755, owner)?;
        if self.options.tls != Tls::Off {
            let pki = Pki::generate(&self.id)?;
            let server = pki.server_cert()?;
            let tls_dir = self.run_dir.join("tls");
            sys::make_dir(&tls_dir, 0o755, None)?;
            let paths = TlsPaths {
                ca: tls_dir.join("ca.crt"),
                cert: tls_dir.join("server.crt"),
                key: tls_dir.join("server.key"),
            };
            sys::write_file(&paths.ca, pki.ca_pem.as_bytes(), 0o644, None)?;
            sys::write_file(&paths.cert, server.cert_pem.as_bytes(), 0o644, owner)?;
            // postgres refuses a key the server's user could share: 0600, its own.
            sys::write_file(&paths.key, server.key_pem.as_bytes(), 0o600, owner)?;
            self.tls = Some(TlsState { pki, paths });
        }
        let hba = self.data_dir.join("pg_hba.conf");
        sys::write_file(
            &hba,
            datadir::hba(self.options.tls).as_bytes(),
            0o600,
            owner,
        )?;
        let conf_path = self.data_dir.join("postgresql.conf");
        let mut conf =
            fs::read_to_string(&conf_path).map_err(|e| Error::io("read", &conf_path, e))?;
        conf.push_str(&datadir::server_conf(
            self.port,
            &self.socket_dir,
            self.tls.as_ref().map(|t| &t.paths),
            &self.options.settings,
        ));
        sys::write_file(&conf_path, conf.as_bytes(), 0o600, owner)?;
        self.timings.data_dir = t0.elapsed();
        self.timings.template_built = template.built;
        self.timings.server = self.spawn_and_wait()?;
        eprintln!(
            "clawfleet-pg-tests: PostgreSQL {} (run {}) ready on 127.0.0.1:{} in {}",
            self.version, self.id, self.port, self.timings
        );
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, Option<Postmaster>> {
        self.postmaster.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record(&self, postmaster: Option<ProcessRecord>) -> RunRecord {
        RunRecord {
            schema: run::RECORD_SCHEMA,
            id: self.id.clone(),
            owner_pid: std::process::id(),
            port: self.port,
            run_dir: self.run_dir.clone(),
            data_dir: self.data_dir.clone(),
            postmaster,
        }
    }

    fn write_record(&self) -> Result<()> {
        let pm = self.lock().as_ref().map(|p| p.record);
        run::write_record(&self.run.record_path, &self.record(pm))
    }

    /// Spawns the postmaster (as the `postgres` user, in the test's process group so a
    /// terminal's Ctrl-C reaches it too) and waits until it accepts connections.
    fn spawn_and_wait(&self) -> Result<Duration> {
        let t0 = Instant::now();
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .map_err(|e| Error::io("open log", &self.log_path, e))?;
        let err = log
            .try_clone()
            .map_err(|e| Error::io("open log", &self.log_path, e))?;
        let mut cmd = datadir::as_postgres(&self.config, "postgres");
        cmd.arg("-D")
            .arg(&self.data_dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err);
        let child = cmd.spawn().map_err(|source| Error::Spawn {
            program: "postgres",
            path: self.config.binary("postgres"),
            source,
        })?;
        let pid = child.id();
        let record = ProcessRecord {
            pid,
            start_ticks: sys::proc_stat(pid).map(|s| s.start_ticks),
        };
        *self.lock() = Some(Postmaster { child, record });
        self.write_record()?;
        self.wait_ready(t0 + self.config.start_timeout)?;
        Ok(t0.elapsed())
    }

    /// Polls `pg_isready` until the server accepts connections, failing early when the
    /// postmaster exits.
    fn wait_ready(&self, deadline: Instant) -> Result<()> {
        loop {
            if let Some(pm) = self.lock().as_mut()
                && let Ok(Some(status)) = pm.child.try_wait()
            {
                return Err(Error::Exited {
                    pid: pm.record.pid,
                    status: status.to_string(),
                    log: self.log_path.clone(),
                    tail: sys::file_tail(&self.log_path, 20),
                });
            }
            let out = Command::new(self.config.binary("pg_isready"))
                .env_clear()
                .args([
                    "-h",
                    "127.0.0.1",
                    "-U",
                    SUPERUSER,
                    "-d",
                    "postgres",
                    "-t",
                    "2",
                ])
                .args(["-p", &self.port.to_string()])
                .stdin(Stdio::null())
                .output();
            let last = match out {
                Ok(o) if o.status.success() => return Ok(()),
                Ok(o) => format!("{} {}", o.status, String::from_utf8_lossy(&o.stdout).trim()),
                Err(e) => format!("could not run pg_isready: {e}"),
            };
            if Instant::now() >= deadline {
                return Err(Error::NotReady {
                    port: self.port,
                    timeout: self.config.start_timeout,
                    last,
                    log: self.log_path.clone(),
                    tail: sys::file_tail(&self.log_path, 20),
                });
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// The run id (`<test pid>-<random>`), also the name of its record and run directory.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The server's TCP port on 127.0.0.1 (the same across restarts).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The postmaster's pid while the server runs.
    pub fn pid(&self) -> Option<u32> {
        self.lock().as_ref().map(|p| p.record.pid)
    }

    /// The postmaster and its children (backends, checkpointer, …) right now.
    pub fn server_pids(&self) -> Vec<u32> {
        match self.pid() {
            Some(pid) => std::iter::once(pid)
                .chain(sys::children_of(pid).into_iter().map(|c| c.0))
                .collect(),
            None => Vec::new(),
        }
    }

    /// The server's version, e.g. `15.18`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// How long the start took.
    pub fn timings(&self) -> StartTimings {
        self.timings
    }

    /// The run directory: socket directory, TLS files, client certificates, server log.
    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    /// The data directory (owned by the `postgres` user; on tmpfs unless `CLAWFLEET_PG_TMPFS=0`).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The directory of the server's unix socket (`host=` for libpq).
    pub fn socket_dir(&self) -> &Path {
        &self.socket_dir
    }

    /// The server log (stderr of every postmaster of this run, appended).
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The last `n` lines of the server log.
    pub fn log_tail(&self, n: usize) -> String {
        sys::file_tail(&self.log_path, n)
    }

    /// `postgres://user@127.0.0.1:port/db?sslmode=disable`.
    pub fn url(&self, db: &str, user: &str) -> String {
        format!(
            "postgres://{}@127.0.0.1:{}/{}?sslmode=disable",
            url_escape(user),
            self.port,
            url_escape(db)
        )
    }

    /// `postgres://user@127.0.0.1:port/db?sslmode=verify-full&sslrootcert=<CA file>` on a TLS
    /// server; `None` without TLS.
    pub fn tls_url(&self, db: &str, user: &str) -> Option<String> {
        let ca = self.ca_path()?;
        Some(format!(
            "postgres://{}@127.0.0.1:{}/{}?sslmode=verify-full&sslrootcert={}",
            url_escape(user),
            self.port,
            url_escape(db),
            url_escape(&ca.to_string_lossy())
        ))
    }

    /// The CA file that signed the server's certificate (TLS servers only).
    pub fn ca_path(&self) -> Option<&Path> {
        self.tls.as_ref().map(|t| t.paths.ca.as_path())
    }

    /// The CA certificate, PEM (TLS servers only).
    pub fn ca_pem(&self) -> Option<&str> {
        self.tls.as_ref().map(|t| t.pki.ca_pem.as_str())
    }

    /// Runs SQL as the superuser in database `postgres` with the server's own psql (over the
    /// unix socket; statements run one by one, the first error stops it). Returns psql's
    /// unaligned, tuples-only output: one line per row, columns separated by `|`.
    pub fn psql(&self, sql: &str) -> Result<String> {
        self.psql_in("postgres", sql)
    }

    /// [`psql`](Self::psql) in another database.
    pub fn psql_in(&self, db: &str, sql: &str) -> Result<String> {
        datadir::check_name("database name", db)?;
        if self.pid().is_none() {
            return Err(Error::NotRunning {
                id: self.id.clone(),
            });
        }
        let mut cmd = Command::new(self.config.binary("psql"));
        cmd.env_clear()
            .env("PGCONNECT_TIMEOUT", "10")
            .env("LC_ALL", "C")
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(&self.socket_dir)
            .args([
                "-p",
                &self.port.to_string(),
                "-U",
                SUPERUSER,
                "-d",
                db,
                "-f",
                "-",
            ]);
        let out = datadir::run("psql", cmd, Some(sql))?;
        Ok(out.strip_suffix('\n').unwrap_or(&out).to_string())
    }

    /// `CREATE DATABASE name` (owned by the superuser).
    pub fn create_database(&self, name: &str) -> Result<()> {
        datadir::check_name("database name", name)?;
        self.psql(&format!("CREATE DATABASE {};", datadir::ident(name)))
            .map(|_| ())
    }

    /// `CREATE DATABASE name OWNER owner`: on PostgreSQL 15 and later only a database's owner
    /// (or a superuser) may create tables in its `public` schema, so a role that runs
    /// migrations wants its own database.
    pub fn create_database_owned_by(&self, name: &str, owner: &str) -> Result<()> {
        datadir::check_name("database name", name)?;
        datadir::check_name("role name", owner)?;
        self.psql(&format!(
            "CREATE DATABASE {} OWNER {};",
            datadir::ident(name),
            datadir::ident(owner)
        ))
        .map(|_| ())
    }

    /// A login role. With a password it must authenticate with it (scram-sha-256) over
    /// 127.0.0.1; without one it is a member of [`TRUSTED_GROUP`] and connects without a
    /// password. The password reaches psql on stdin, never on a command line.
    pub fn create_role(&self, name: &str, password: Option<&str>) -> Result<()> {
        datadir::check_name("role name", name)?;
        let sql = match password {
            Some(pw) => format!(
                "CREATE ROLE {} LOGIN PASSWORD {};",
                datadir::ident(name),
                datadir::literal(pw)
            ),
            None => format!(
                "CREATE ROLE {} LOGIN IN ROLE {TRUSTED_GROUP};",
                datadir::ident(name)
            ),
        };
        self.psql(&sql).map(|_| ())
    }

    /// A login role of [`CERT_GROUP`] that authenticates over TLS with a client certificate
    /// (common name = `name`) signed by the run's CA; the files are in the run directory. TLS
    /// servers only.
    pub fn create_cert_role(&self, name: &str) -> Result<ClientCert> {
        datadir::check_name("role name", name)?;
        let Some(tls) = &self.tls else {
            return Err(Error::InvalidInput {
                what: "create_cert_role on server",
                value: self.id.clone(),
                reason: "the server was started without TLS (Options::tls)",
            });
        };
        let cert = tls.pki.client_cert(name)?;
        let dir = self.run_dir.join("clients");
        sys::make_dir(&dir, 0o700, None)?;
        // The file names must not depend on the role name's characters.
        let n = fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0) / 2;
        let out = ClientCert {
            cert_path: dir.join(format!("client-{n}.crt")),
            key_path: dir.join(format!("client-{n}.key")),
        };
        sys::write_file(&out.cert_path, cert.cert_pem.as_bytes(), 0o644, None)?;
        sys::write_file(&out.key_path, cert.key_pem.as_bytes(), 0o600, None)?;
        self.psql(&format!(
            "CREATE ROLE {} LOGIN IN ROLE {CERT_GROUP};",
            datadir::ident(name)
        ))?;
        Ok(out)
    }

    /// Fast shutdown: SIGINT to the postmaster's pid (open transactions are rolled back, a
    /// checkpoint is written), waiting until it has exited; immediate shutdown and then SIGKILL
    /// after the stop timeout. A stopped server stays stopped until
    /// [`start_again`](Self::start_again). Nothing to do when it is not running.
    pub fn stop(&self) -> Result<()> {
        self.end(|p| run::stop_postmaster(p, self.config.stop_timeout))
    }

    /// Crash: SIGKILL to the postmaster's pid (stopped first so it cannot fork meanwhile); its
    /// children exit by themselves on noticing, the stragglers are killed by pid. Committed data
    /// survives; [`start_again`](Self::start_again) runs crash recovery.
    pub fn kill(&self) -> Result<()> {
        self.end(|p| run::kill_postmaster(p, Duration::from_secs(3)))
    }

    fn end(&self, how: impl FnOnce(ProcessRecord) -> Vec<String>) -> Result<()> {
        let Some(mut pm) = self.lock().take() else {
            return Ok(());
        };
        let problems = how(pm.record);
        let _ = pm.child.wait();
        self.write_record()?;
        Error::teardown(&self.id, problems)
    }

    /// Starts the server again on the same data directory and port after
    /// [`stop`](Self::stop) or [`kill`](Self::kill), and waits until it accepts connections;
    /// returns how long that took.
    pub fn start_again(&self) -> Result<Duration> {
        if let Some(pid) = self.pid() {
            return Err(Error::AlreadyRunning {
                id: self.id.clone(),
                pid,
            });
        }
        let took = self.spawn_and_wait()?;
        eprintln!(
            "clawfleet-pg-tests: PostgreSQL (run {}) accepting connections again after {:.2}s",
            self.id,
            took.as_secs_f64()
        );
        Ok(took)
    }

    /// [`stop`](Self::stop), then [`start_again`](Self::start_again).
    pub fn restart(&self) -> Result<Duration> {
        self.stop()?;
        self.start_again()
    }

    /// Keep the server log in `<state>/logs/<id>.log` after the teardown.
    pub fn keep_log(&mut self) {
        self.keep_log = true;
    }

    /// Stops the server and removes the run directory, reporting what could not be removed.
    pub fn shutdown(mut self) -> Result<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        if self.done {
            return Ok(());
        }
        self.done = true;
        let mut problems = Vec::new();
        if let Err(e) = self.stop() {
            problems.push(e.to_string());
        }
        let panicking = std::thread::panicking();
        if self.keep_log || panicking {
            if let Some(kept) = run::keep_log(&self.config, &self.record(None)) {
                eprintln!(
                    "clawfleet-pg-tests: PostgreSQL run {} stopped; server log kept in {}",
                    self.id,
                    kept.display()
                );
            }
            if panicking {
                eprintln!(
                    "clawfleet-pg-tests: last lines of the server log:\n{}",
                    self.log_tail(15)
                );
            }
        }
        problems.extend(run::remove_dirs(&self.record(None)));
        signals::unregister(&self.id);
        if problems.is_empty() {
            self.run.forget();
        }
        // Otherwise the record stays, so the next start (or `pgtests clean`) retries.
        Error::teardown(&self.id, problems)
    }
}

impl Drop for TestPostgres {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("clawfleet-pg-tests: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_parts_are_percent_encoded() {
        assert_eq!(url_escape("app_db-1.x~"), "app_db-1.x~");
        assert_eq!(url_escape("a b/c@d"), "a%20b%2Fc%40d");
    }
}
