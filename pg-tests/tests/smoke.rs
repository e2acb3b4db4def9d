//! Smoke tests of the PostgreSQL harness against the real server: roles and authentication over
//! 127.0.0.1, data surviving a fast restart and a SIGKILL, TLS with verify-full and client
//! certificates, and teardown by pid (on drop, on SIGTERM, and by reclaim after a SIGKILLed
//! owner) leaving no process and no directory behind.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clawfleet_pg_tests::{
    HarnessConfig, Options, TestPostgres, Tls, list_runs, reclaim_stale, skip_unless_postgres,
};

/// psql from the server's own bin dir against a URL, as a libpq client would connect.
fn psql_url(url: &str, password: Option<&str>, sql: &str) -> Result<String, String> {
    let config = HarnessConfig::from_env().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(config.binary("psql"));
    cmd.env_clear().env("PGCONNECT_TIMEOUT", "5").args([
        "-X",
        "-q",
        "-A",
        "-t",
        "-w",
        "-v",
        "ON_ERROR_STOP=1",
        "-c",
        sql,
        url,
    ]);
    if let Some(pw) = password {
        cmd.env("PGPASSWORD", pw);
    }
    let out = cmd.output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

fn proc_exists(pid: u32) -> bool {
    // A zombie of an exited postmaster is reaped by the harness; one reparented elsewhere would
    // show as 'Z', which is gone for our purposes.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

fn wait_gone(pids: &[u32], limit: Duration) -> Vec<u32> {
    let t0 = Instant::now();
    loop {
        let alive: Vec<u32> = pids.iter().copied().filter(|p| proc_exists(*p)).collect();
        if alive.is_empty() || t0.elapsed() > limit {
            return alive;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn refused(port: u16) -> bool {
    TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(1)).is_err()
}

#[test]
fn roles_restart_kill_and_drop() {
    skip_unless_postgres!();
    let t0 = Instant::now();
    let pg = TestPostgres::start().unwrap();
    eprintln!("start: {} ({})", pg.timings(), pg.version());
    let port = pg.port();
    assert_eq!(pg.psql("select 1").unwrap(), "1");
    assert_eq!(
        pg.psql("show listen_addresses; show ssl").unwrap(),
        "127.0.0.1\noff"
    );

    // Roles: a password role over scram-sha-256, a trusted one without password.
    pg.create_role("app", Some("pa'ss word")).unwrap();
    pg.create_role("helper", None).unwrap();
    pg.create_database_owned_by("appdb", "app").unwrap();
    pg.create_database("other").unwrap();
    let app = pg.url("appdb", "app");
    assert_eq!(
        app,
        format!("postgres://app@127.0.0.1:{port}/appdb?sslmode=disable")
    );
    assert_eq!(
        psql_url(&app, Some("pa'ss word"), "select current_user").unwrap(),
        "app"
    );
    let wrong = psql_url(&app, Some("nope"), "select 1").unwrap_err();
    assert!(wrong.contains("password authentication failed"), "{wrong}");
    let none = psql_url(&app, None, "select 1").unwrap_err();
    assert!(none.contains("password"), "{none}");
    assert_eq!(
        psql_url(&pg.url("other", "helper"), None, "select current_user").unwrap(),
        "helper"
    );
    assert_eq!(
        pg.psql("select rolpassword like 'SCRAM-SHA-256$%' from pg_authid where rolname = 'app'")
            .unwrap(),
        "t"
    );
    assert!(pg.create_role("app", None).is_err(), "duplicate role");

    // The owner can create tables (PostgreSQL 15: only owners may in `public`).
    psql_url(
        &app,
        Some("pa'ss word"),
        "create table t (n int primary key); insert into t values (1)",
    )
    .unwrap();

    // Restart keeps data, port and the URL.
    let first_pid = pg.pid().unwrap();
    pg.stop().unwrap();
    assert_eq!(pg.pid(), None);
    assert!(!proc_exists(first_pid));
    assert!(refused(port), "port {port} still accepts after stop");
    assert!(pg.psql("select 1").is_err());
    let took = pg.start_again().unwrap();
    eprintln!("restart after stop: {:.2}s", took.as_secs_f64());
    assert_eq!(pg.port(), port);
    assert_ne!(pg.pid(), Some(first_pid));
    assert_eq!(pg.psql_in("appdb", "select n from t").unwrap(), "1");

    // A committed row survives SIGKILL; every server process goes with the postmaster.
    psql_url(&app, Some("pa'ss word"), "insert into t values (2)").unwrap();
    let before_kill = pg.server_pids();
    assert!(
        before_kill.len() >= 4,
        "postmaster and its children: {before_kill:?}"
    );
    pg.kill().unwrap();
    assert_eq!(
        wait_gone(&before_kill, Duration::from_secs(1)),
        Vec::<u32>::new()
    );
    assert!(refused(port));
    let took = pg.start_again().unwrap();
    eprintln!(
        "start after SIGKILL (crash recovery): {:.2}s",
        took.as_secs_f64()
    );
    assert!(
        pg.log_tail(40).contains("not properly shut down"),
        "no crash recovery in the log:\n{}",
        pg.log_tail(40)
    );
    assert_eq!(
        pg.psql_in("appdb", "select string_agg(n::text, ',' order by n) from t")
            .unwrap(),
        "1,2"
    );
    assert!(pg.start_again().is_err(), "start_again while running");

    // Drop: no process, no directory, no record.
    let pids = pg.server_pids();
    let run_dir = pg.run_dir().to_path_buf();
    let data_dir = pg.data_dir().to_path_buf();
    let id = pg.id().to_string();
    assert!(data_dir.is_dir());
    drop(pg);
    assert_eq!(wait_gone(&pids, Duration::ZERO), Vec::<u32>::new());
    assert!(!data_dir.exists() && !run_dir.exists());
    let config = HarnessConfig::from_env().unwrap();
    assert!(!config.runs_dir().join(format!("{id}.json")).exists());
    assert!(!config.runs_dir().join(format!("{id}.lock")).exists());
    assert!(refused(port));
    eprintln!("whole test: {:.2}s", t0.elapsed().as_secs_f64());
}

#[test]
fn tls_verify_full_and_client_certificates() {
    skip_unless_postgres!();
    let pg = TestPostgres::start_with(&Options::default().tls(Tls::Required)).unwrap();
    eprintln!("TLS start: {}", pg.timings());
    pg.create_role("tlsapp", Some("pw")).unwrap();
    let url = pg.tls_url("postgres", "tlsapp").unwrap();
    assert!(url.contains("sslmode=verify-full&sslrootcert=%2F"), "{url}");
    assert_eq!(
        psql_url(
            &url,
            Some("pw"),
            "select ssl from pg_stat_ssl where pid = pg_backend_pid()"
        )
        .unwrap(),
        "t"
    );
    // Plain text is refused by pg_hba.conf (hostssl only).
    let plain = psql_url(&pg.url("postgres", "tlsapp"), Some("pw"), "select 1").unwrap_err();
    assert!(plain.contains("no encryption"), "{plain}");
    // Another CA does not verify the server.
    let other = TestPostgres::start_with(&Options::default().tls(Tls::On)).unwrap();
    let wrong_ca = url.replace(
        &percent(pg.ca_path().unwrap()),
        &percent(other.ca_path().unwrap()),
    );
    let err = psql_url(&wrong_ca, Some("pw"), "select 1").unwrap_err();
    assert!(err.contains("certificate verify failed"), "{err}");
    // Tls::On still takes plain connections, and sslmode=verify-full connections.
    other.create_role("plain", None).unwrap();
    assert_eq!(
        psql_url(&other.url("postgres", "plain"), None, "select 1").unwrap(),
        "1"
    );
    assert_eq!(
        psql_url(
            &other.tls_url("postgres", "plain").unwrap(),
            None,
            "select 1"
        )
        .unwrap(),
        "1"
    );
    drop(other);

    // A certificate role logs in with its certificate and without a password.
    let cert = pg.create_cert_role("certapp").unwrap();
    let with_cert = format!(
        "{}&sslcert={}&sslkey={}",
        pg.tls_url("postgres", "certapp").unwrap(),
        percent(&cert.cert_path),
        percent(&cert.key_path)
    );
    assert_eq!(
        psql_url(&with_cert, None, "select current_user").unwrap(),
        "certapp"
    );
    let without = psql_url(
        &pg.tls_url("postgres", "certapp").unwrap(),
        None,
        "select 1",
    )
    .unwrap_err();
    assert!(without.contains("certificate"), "{without}");
    // A certificate for one role does not log in as another.
    pg.create_cert_role("certother").unwrap();
    let as_other = with_cert.replace("certapp@", "certother@");
    let err = psql_url(&as_other, None, "select 1").unwrap_err();
    assert!(err.contains("certificate authentication failed"), "{err}");
}

fn percent(p: &Path) -> String {
    p.to_string_lossy().replace('/', "%2F")
}

/// Starts `pgtests up` (with another state directory when given), returns the child and (run
/// id, postmaster pid).
fn pgtests_up(state_dir: Option<&Path>) -> (std::process::Child, String, u32) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pgtests"));
    if let Some(dir) = state_dir {
        cmd.env("CLAWFLEET_PG_STATE_DIR", dir);
    }
    let mut child = cmd
        .arg("up")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let mut id = None;
    let mut pid = None;
    for line in BufReader::new(out).lines() {
        let line = line.unwrap();
        if let Some(v) = line.strip_prefix("run ") {
            id = Some(v.to_string());
        }
        if let Some(v) = line.strip_prefix("postmaster pid ") {
            pid = Some(v.parse::<u32>().unwrap());
        }
        if line.starts_with("Ctrl-C") {
            break;
        }
    }
    match (id, pid) {
        (Some(id), Some(pid)) => (child, id, pid),
        _ => {
            let _ = child.kill();
            panic!("pgtests up did not start a server");
        }
    }
}

fn run_dir(id: &str) -> PathBuf {
    HarnessConfig::from_env().unwrap().runs_dir().join(id)
}

/// A `pgtests up` with a state directory of its own (every start reclaims every stale run of its
/// state directory, so in the shared one another test could reclaim it first), sharing the
/// shared one's template. Dropping it kills the owner and reclaims and removes everything, also
/// when the test fails halfway.
struct PrivateRun {
    config: HarnessConfig,
    owner: std::process::Child,
    id: String,
    postmaster: u32,
}

impl PrivateRun {
    fn start(tag: &str) -> Self {
        let mut config = HarnessConfig::from_env().unwrap();
        let shared_templates = config.templates_dir();
        std::fs::create_dir_all(&shared_templates).unwrap();
        config.state_dir = PathBuf::from(format!(
            "{}-{tag}-{}",
            config.state_dir.display(),
            std::process::id()
        ));
        std::fs::create_dir_all(&config.state_dir).unwrap();
        std::os::unix::fs::symlink(&shared_templates, config.templates_dir()).unwrap();
        let (owner, id, postmaster) = pgtests_up(Some(&config.state_dir));
        PrivateRun {
            config,
            owner,
            id,
            postmaster,
        }
    }
}

impl Drop for PrivateRun {
    fn drop(&mut self) {
        let _ = self.owner.kill();
        let _ = self.owner.wait();
        let _ = reclaim_stale(&self.config);
        let _ = std::fs::remove_dir_all(&self.config.state_dir);
    }
}

#[test]
fn sigkilled_owner_is_reclaimed_by_the_next_run() {
    skip_unless_postgres!();
    let mut run = PrivateRun::start("reclaim");
    let (config, id, postmaster) = (run.config.clone(), run.id.clone(), run.postmaster);
    assert!(proc_exists(postmaster));
    let children: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    let rest = s.rsplit_once(')')?.1.to_string();
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(postmaster)
        })
        .collect();
    assert!(!children.is_empty());
    run.owner.kill().unwrap(); // SIGKILL: no handler, no Drop
    run.owner.wait().unwrap();
    // The server outlives its owner…
    std::thread::sleep(Duration::from_millis(300));
    assert!(proc_exists(postmaster), "postmaster died with its owner");
    assert!(
        list_runs(&config)
            .unwrap()
            .iter()
            .any(|(r, live)| r.id == id && !live)
    );
    // …until the next run reclaims it by its record.
    let reclaimed = reclaim_stale(&config).unwrap();
    assert!(reclaimed.iter().any(|r| r.id == id), "{reclaimed:?}");
    let mut all = children;
    all.push(postmaster);
    assert_eq!(wait_gone(&all, Duration::from_secs(2)), Vec::<u32>::new());
    assert!(!config.runs_dir().join(&id).exists());
    assert!(config.logs_dir().join(format!("{id}.log")).is_file());
}

#[test]
fn sigterm_to_the_owner_stops_its_server() {
    skip_unless_postgres!();
    let (mut owner, id, postmaster) = pgtests_up(None);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(owner.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = owner.wait().unwrap();
    assert_eq!(status.code(), Some(128 + 15), "{status}");
    assert_eq!(
        wait_gone(&[postmaster], Duration::from_secs(1)),
        Vec::<u32>::new()
    );
    assert!(!run_dir(&id).exists());
    let config = HarnessConfig::from_env().unwrap();
    assert!(!list_runs(&config).unwrap().iter().any(|(r, _)| r.id == id));
}

#[test]
fn bad_settings_are_refused_before_anything_starts() {
    skip_unless_postgres!();
    let err = TestPostgres::start_with(&Options::default().setting("port", "5432")).unwrap_err();
    assert!(
        err.to_string().contains("the harness sets it itself"),
        "{err}"
    );
    let pg =
        TestPostgres::start_with(&Options::default().setting("max_connections", "37")).unwrap();
    assert_eq!(pg.psql("show max_connections").unwrap(), "37");
    let err = pg.create_role("", None).unwrap_err();
    assert!(err.to_string().contains("role name"), "{err}");
    let err = pg.psql("select * from no_such_table").unwrap_err();
    assert!(err.to_string().contains("no_such_table"), "{err}");
    assert!(
        pg.create_cert_role("x").is_err(),
        "no TLS, no client certificates"
    );
}

/// `(key, shmid)` of the server's System V segment, from line 7 of `postmaster.pid`.
fn sysv_segment(data_dir: &Path) -> (String, String) {
    let pid_file = std::fs::read_to_string(data_dir.join("postmaster.pid")).unwrap();
    let line = pid_file.lines().nth(6).unwrap().to_string();
    let mut parts = line.split_whitespace();
    let key: i64 = parts.next().unwrap().parse().unwrap();
    (key.to_string(), parts.next().unwrap().to_string())
}

/// Whether /proc/sysvipc/shm lists that key and shmid.
fn sysv_exists((key, shmid): &(String, String)) -> bool {
    std::fs::read_to_string("/proc/sysvipc/shm")
        .unwrap()
        .lines()
        .skip(1)
        .any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.first() == Some(&key.as_str()) && f.get(1) == Some(&shmid.as_str())
        })
}

#[test]
fn a_killed_server_dropped_without_restart_leaves_no_shared_memory() {
    skip_unless_postgres!();
    let pg = TestPostgres::start().unwrap();
    // Dynamic shared memory lives in the data directory, not in /dev/shm.
    assert_eq!(pg.psql("show dynamic_shared_memory_type").unwrap(), "mmap");
    let segment = sysv_segment(pg.data_dir());
    assert!(
        sysv_exists(&segment),
        "{segment:?} not in /proc/sysvipc/shm"
    );
    pg.kill().unwrap();
    assert!(sysv_exists(&segment), "a crash leaves the segment behind");
    drop(pg);
    assert!(!sysv_exists(&segment), "{segment:?} left behind");
}
