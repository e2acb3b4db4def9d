//! Ctrl-C / SIGTERM / SIGHUP: tear down this process's servers before exiting, because a killed
//! test run would otherwise leave postmasters running until the next start reclaims them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, Once};
use std::time::Duration;

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::run;

static LIVE: Mutex<BTreeMap<String, PathBuf>> = Mutex::new(BTreeMap::new());
static INSTALL: Once = Once::new();

fn live() -> MutexGuard<'static, BTreeMap<String, PathBuf>> {
    LIVE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Records that this process owns run `id` (its record file says what to stop and remove).
pub(crate) fn register(id: &str, record_path: PathBuf) {
    INSTALL.call_once(install);
    live().insert(id.to_string(), record_path);
}

pub(crate) fn unregister(id: &str) {
    live().remove(id);
}

fn install() {
    let warn = |e: &dyn std::fmt::Display| {
        eprintln!("clawfleet-pg-tests: no signal handler ({e}); run `pgtests clean` after Ctrl-C")
    };
    match Signals::new([SIGINT, SIGTERM, SIGHUP]) {
        Ok(mut signals) => {
            let spawned = std::thread::Builder::new()
                .name("clawfleet-pg-tests-signals".into())
                .spawn(move || {
                    if let Some(sig) = signals.forever().next() {
                        eprintln!("clawfleet-pg-tests: signal {sig}: stopping PostgreSQL servers");
                        teardown_all();
                        std::process::exit(128 + sig);
                    }
                });
            if let Err(e) = spawned {
                warn(&e);
            }
        }
        Err(e) => warn(&e),
    }
}

/// Tears down every registered run from its on-disk record, in parallel.
fn teardown_all() {
    let entries: Vec<(String, PathBuf)> =
        live().iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    std::thread::scope(|s| {
        for (id, path) in &entries {
            s.spawn(move || match run::read_record(path) {
                Ok(Some(rec)) => match run::teardown(&rec, Duration::from_secs(3)) {
                    Ok(()) => {
                        let _ = std::fs::remove_file(path);
                        let _ = std::fs::remove_file(path.with_extension("lock"));
                        eprintln!("clawfleet-pg-tests: PostgreSQL run {id} stopped");
                    }
                    Err(e) => eprintln!("clawfleet-pg-tests: {e}"),
                },
                Ok(None) => {}
                Err(e) => eprintln!("clawfleet-pg-tests: {e}"),
            });
        }
    });
}
