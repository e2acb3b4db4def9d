//! A real, throwaway PostgreSQL server for the tests, from Debian's packages (the newest
//! `/usr/lib/postgresql/<major>/bin`): its own data directory, its own port on 127.0.0.1, its own
//! unix socket directory, run as the `postgres` system user, stopped and killed by pid.
//!
//! ```no_run
//! use clawfleet_pg_tests::{TestPostgres, skip_unless_postgres};
//!
//! skip_unless_postgres!(); // "SKIP: ..." and return when not root / no PostgreSQL (fails under CI=true)
//! let pg = TestPostgres::start().unwrap();
//! pg.create_role("occ", Some("s3cret")).unwrap();
//! pg.create_database_owned_by("occ", "occ").unwrap();
//! let url = pg.url("occ", "occ"); // postgres://occ@127.0.0.1:<port>/occ?sslmode=disable
//! assert_eq!(pg.psql("select 1").unwrap(), "1");
//! # let _ = url;
//! // dropped: the postmaster stopped by pid, the run directory removed
//! ```
//!
//! See pg-tests/README.md for the recorded ids, teardown and the measured costs.

mod config;
mod datadir;
mod error;
mod run;
mod server;
mod signals;
mod sys;
mod tls;

pub use config::{
    BINARIES, DEBIAN_ROOT, DEFAULT_STATE_DIR, HarnessConfig, OS_USER, newest_bin_dir,
};
pub use datadir::{CERT_GROUP, SUPERUSER, TRUSTED_GROUP, Tls};
pub use error::{Error, Result};
pub use run::{ProcessRecord, RunRecord, list_runs, reclaim_stale};
pub use server::{ClientCert, Options, StartTimings, TestPostgres};

/// Why PostgreSQL cannot run here, or `None` when it can. Under `CI=true` a missing
/// prerequisite is a failure, not a skip: this panics with the reason, so CI can never pass by
/// silently skipping the PostgreSQL tests.
pub fn skip_reason() -> Option<String> {
    let reason = missing_prerequisite();
    if let Some(r) = &reason {
        let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
        if ci {
            panic!("CI is set but PostgreSQL cannot run: {r}");
        }
    }
    reason
}

fn missing_prerequisite() -> Option<String> {
    if !sys::is_root() {
        return Some(
            "the PostgreSQL tier runs as root (it runs the server as the `postgres` user and \
             keeps its state in /var/lib); run the tests as root"
                .into(),
        );
    }
    HarnessConfig::from_env().err().map(|e| e.to_string())
}

/// Returns from the calling test with a "SKIP: ..." line when PostgreSQL cannot run (see
/// [`skip_reason`]; under `CI=true` it fails instead).
#[macro_export]
macro_rules! skip_unless_postgres {
    () => {
        if let Some(reason) = $crate::skip_reason() {
            eprintln!("SKIP: {reason}");
            return;
        }
    };
}
